"""8B-scale checkpoints of the KV layer families (headers only: config.json and safetensors
headers whose data are sparse holes, tests/ckpt.py's writer), with the tensors the Hugging Face
classes name: Gemma 3's 5 sliding : 1 full layout, gpt-oss's alternating sliding window,
Granite 4.0-H's Mamba-2 with every 10th layer attention. The planner's H200 reference
(tests/core/launch/test_planner.py) and benchmarks/planner_families.py, which serves them
with vLLM's dummy loader, use them."""

from __future__ import annotations

from typing import Any

from ckpt import GPT_OSS_ROPE

T = list[tuple[str, str, list[int]]]


def _norms(p: str, h: int, names: tuple[str, ...]) -> T:
    return [(f"{p}.{n}.weight", "BF16", [h]) for n in names]


GEMMA3_8B: dict[str, Any] = {  # Gemma 3's layout (5 sliding : 1 full, window 1024) near 7B
    "architectures": ["Gemma3ForCausalLM"],
    "model_type": "gemma3_text",
    "hidden_size": 3072,
    "intermediate_size": 12288,
    "num_hidden_layers": 40,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 256,
    "vocab_size": 262144,
    "max_position_embeddings": 131072,
    "sliding_window": 1024,
    "sliding_window_pattern": 6,
    "query_pre_attn_scalar": 256,
    "rope_theta": 1000000.0,
    "rope_local_base_freq": 10000.0,
    "rope_scaling": {"rope_type": "linear", "factor": 8.0},
    "hidden_activation": "gelu_pytorch_tanh",
    "rms_norm_eps": 1e-6,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
}


def gemma3_tensors(c: dict[str, Any]) -> T:
    h, hd, i = c["hidden_size"], c["head_dim"], c["intermediate_size"]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    out: T = [("model.embed_tokens.weight", "BF16", [c["vocab_size"], h])]
    for n in range(c["num_hidden_layers"]):
        p = f"model.layers.{n}"
        out += [
            (f"{p}.self_attn.q_proj.weight", "BF16", [q, h]),
            (f"{p}.self_attn.k_proj.weight", "BF16", [kv, h]),
            (f"{p}.self_attn.v_proj.weight", "BF16", [kv, h]),
            (f"{p}.self_attn.o_proj.weight", "BF16", [h, q]),
            (f"{p}.self_attn.q_norm.weight", "BF16", [hd]),
            (f"{p}.self_attn.k_norm.weight", "BF16", [hd]),
            (f"{p}.mlp.gate_proj.weight", "BF16", [i, h]),
            (f"{p}.mlp.up_proj.weight", "BF16", [i, h]),
            (f"{p}.mlp.down_proj.weight", "BF16", [h, i]),
        ]
        out += _norms(
            p,
            h,
            (
                "input_layernorm",
                "post_attention_layernorm",
                "pre_feedforward_layernorm",
                "post_feedforward_layernorm",
            ),
        )
    return out + [("model.norm.weight", "BF16", [h])]


GPT_OSS_8B: dict[str, Any] = {  # gpt-oss-20b's layout with 12 experts instead of 32 (~9B)
    "architectures": ["GptOssForCausalLM"],
    "model_type": "gpt_oss",
    "hidden_size": 2880,
    "intermediate_size": 2880,
    "num_hidden_layers": 24,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "head_dim": 64,
    "vocab_size": 201088,
    "max_position_embeddings": 131072,
    "sliding_window": 128,
    "layer_types": ["sliding_attention", "full_attention"] * 12,
    "num_local_experts": 12,
    "num_experts_per_tok": 4,
    "experts_per_token": 4,
    "rope_scaling": GPT_OSS_ROPE,
    "rope_theta": 150000.0,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}


def gpt_oss_tensors(c: dict[str, Any]) -> T:
    h, hd, i, e = c["hidden_size"], c["head_dim"], c["intermediate_size"], c["num_local_experts"]
    nh, q, kv = (
        c["num_attention_heads"],
        c["num_attention_heads"] * hd,
        c["num_key_value_heads"] * hd,
    )
    out: T = [
        ("model.embed_tokens.weight", "BF16", [c["vocab_size"], h]),
        ("lm_head.weight", "BF16", [c["vocab_size"], h]),
    ]
    for n in range(c["num_hidden_layers"]):
        p = f"model.layers.{n}"
        a, m = f"{p}.self_attn", f"{p}.mlp"
        out += [
            (f"{a}.q_proj.weight", "BF16", [q, h]),
            (f"{a}.q_proj.bias", "BF16", [q]),
            (f"{a}.k_proj.weight", "BF16", [kv, h]),
            (f"{a}.k_proj.bias", "BF16", [kv]),
            (f"{a}.v_proj.weight", "BF16", [kv, h]),
            (f"{a}.v_proj.bias", "BF16", [kv]),
            (f"{a}.o_proj.weight", "BF16", [h, q]),
            (f"{a}.o_proj.bias", "BF16", [h]),
            (f"{a}.sinks", "BF16", [nh]),
            (f"{m}.router.weight", "BF16", [e, h]),
            (f"{m}.router.bias", "BF16", [e]),
            (f"{m}.experts.gate_up_proj", "BF16", [e, h, 2 * i]),
            (f"{m}.experts.gate_up_proj_bias", "BF16", [e, 2 * i]),
            (f"{m}.experts.down_proj", "BF16", [e, i, h]),
            (f"{m}.experts.down_proj_bias", "BF16", [e, h]),
        ]
        out += _norms(p, h, ("input_layernorm", "post_attention_layernorm"))
    return out + [("model.norm.weight", "BF16", [h])]


GRANITE_H_8B: dict[str, Any] = {  # Granite 4.0-H's layout, dense: Mamba-2 with every 10th attention
    "architectures": ["GraniteMoeHybridForCausalLM"],
    "model_type": "granitemoehybrid",
    "hidden_size": 4096,
    "intermediate_size": 12800,
    "shared_intermediate_size": 12800,
    "num_hidden_layers": 40,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 100352,
    "max_position_embeddings": 131072,
    "layer_types": ["attention" if n % 10 == 9 else "mamba" for n in range(40)],
    "mamba_expand": 2,
    "mamba_n_groups": 1,
    "mamba_n_heads": 128,
    "mamba_d_head": 64,
    "mamba_d_state": 128,
    "mamba_d_conv": 4,
    "mamba_chunk_size": 256,
    "mamba_conv_bias": True,
    "mamba_proj_bias": False,
    "num_local_experts": 0,
    "num_experts_per_tok": 0,
    "position_embedding_type": "nope",
    "embedding_multiplier": 12.0,
    "logits_scaling": 8.0,
    "residual_multiplier": 0.22,
    "attention_multiplier": 0.0078125,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": True,
    "torch_dtype": "bfloat16",
}


def granite_h_tensors(c: dict[str, Any]) -> T:
    h, si = c["hidden_size"], c["shared_intermediate_size"]
    nh, hd = c["num_attention_heads"], h // c["num_attention_heads"]
    kv = c["num_key_value_heads"] * hd
    inner = c["mamba_expand"] * h
    gs = 2 * c["mamba_n_groups"] * c["mamba_d_state"]
    mh = c["mamba_n_heads"]
    out: T = [("model.embed_tokens.weight", "BF16", [c["vocab_size"], h])]
    for n, kind in enumerate(c["layer_types"]):
        p = f"model.layers.{n}"
        if kind == "mamba":
            out += [
                (f"{p}.mamba.in_proj.weight", "BF16", [2 * inner + gs + mh, h]),
                (f"{p}.mamba.conv1d.weight", "BF16", [inner + gs, 1, c["mamba_d_conv"]]),
                (f"{p}.mamba.conv1d.bias", "BF16", [inner + gs]),
                (f"{p}.mamba.dt_bias", "BF16", [mh]),
                (f"{p}.mamba.A_log", "BF16", [mh]),
                (f"{p}.mamba.D", "BF16", [mh]),
                (f"{p}.mamba.norm.weight", "BF16", [inner]),
                (f"{p}.mamba.out_proj.weight", "BF16", [h, inner]),
            ]
        else:
            out += [
                (f"{p}.self_attn.q_proj.weight", "BF16", [nh * hd, h]),
                (f"{p}.self_attn.k_proj.weight", "BF16", [kv, h]),
                (f"{p}.self_attn.v_proj.weight", "BF16", [kv, h]),
                (f"{p}.self_attn.o_proj.weight", "BF16", [h, nh * hd]),
            ]
        out += [
            (f"{p}.shared_mlp.input_linear.weight", "BF16", [2 * si, h]),
            (f"{p}.shared_mlp.output_linear.weight", "BF16", [h, si]),
        ]
        out += _norms(p, h, ("input_layernorm", "post_attention_layernorm"))
    return out + [("model.norm.weight", "BF16", [h])]


SCALED = {
    "gemma3-8b": (GEMMA3_8B, gemma3_tensors),
    "gpt-oss-8b": (GPT_OSS_8B, gpt_oss_tensors),
    "granite-h-8b": (GRANITE_H_8B, granite_h_tensors),
}
