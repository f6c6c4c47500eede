"""Write checkpoints for inspector and planner tests: real config.json and safetensors headers,
with data regions left as sparse holes (a 16 GB 8B-shaped checkpoint takes no disk)."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

LLAMA3_8B: dict[str, Any] = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
}
# A Llama small enough to write in a blink, for tests that only read its config and headers.
TINY_LLAMA: dict[str, Any] = dict(
    LLAMA3_8B,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=100,
    max_position_embeddings=256,
)
BYTES = {"BF16": 2, "F16": 2, "F32": 4, "I32": 4, "U8": 1, "F8_E4M3": 1, "I8": 1}


def llama_tensors(cfg: dict[str, Any], dtype: str = "BF16") -> list[tuple[str, str, list[int]]]:
    h, i, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    hd = cfg.get("head_dim") or h // cfg["num_attention_heads"]
    kv = cfg["num_key_value_heads"] * hd
    out = [("model.embed_tokens.weight", dtype, [v, h])]
    for n in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{n}."
        out += [
            (p + "self_attn.q_proj.weight", dtype, [cfg["num_attention_heads"] * hd, h]),
            (p + "self_attn.k_proj.weight", dtype, [kv, h]),
            (p + "self_attn.v_proj.weight", dtype, [kv, h]),
            (p + "self_attn.o_proj.weight", dtype, [h, cfg["num_attention_heads"] * hd]),
            (p + "mlp.gate_proj.weight", dtype, [i, h]),
            (p + "mlp.up_proj.weight", dtype, [i, h]),
            (p + "mlp.down_proj.weight", dtype, [h, i]),
            (p + "input_layernorm.weight", dtype, [h]),
            (p + "post_attention_layernorm.weight", dtype, [h]),
        ]
    out += [("model.norm.weight", dtype, [h])]
    if not cfg.get("tie_word_embeddings"):
        out += [("lm_head.weight", dtype, [v, h])]
    return out


def write_safetensors(path: Path, tensors: list[tuple[str, str, list[int]]]) -> int:
    """Header for real, data as a hole; returns the data size."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    off = 0
    for name, dtype, shape in tensors:
        n = BYTES[dtype]
        for d in shape:
            n *= d
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + n]}
        off += n
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(raw)))
        f.write(raw)
        f.truncate(8 + len(raw) + off)
    return off


def write_checkpoint(root: Path, cfg: dict[str, Any], tensors=None, shards: int = 1) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(cfg))
    tensors = tensors if tensors is not None else llama_tensors(cfg)
    if shards == 1:
        write_safetensors(root / "model.safetensors", tensors)
        return root
    per = -(-len(tensors) // shards)
    weight_map = {}
    for s in range(shards):
        name = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        part = tensors[s * per : (s + 1) * per]
        write_safetensors(root / name, part)
        weight_map.update({t[0]: name for t in part})
    (root / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    return root


GPT_OSS_ROPE: dict[str, Any] = {  # gpt-oss's YaRN scaling (the tiny and the 8B-scale alike)
    "rope_type": "yarn",
    "factor": 32.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
    "original_max_position_embeddings": 4096,
}

# -- small random checkpoints of each KV layer family (planner vs vLLM's own KV functions) -----
# Only config.json matters to the planner and to vLLM's dummy loader; one embedding tensor makes
# the folder a safetensors checkpoint.
_SMALL: dict[str, Any] = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "vocab_size": 256,
    "max_position_embeddings": 65536,
    "rms_norm_eps": 1e-6,
    "torch_dtype": "bfloat16",
    "tie_word_embeddings": True,
}
TINY_GEMMA3: dict[str, Any] = dict(  # 5 sliding + 1 full, as Gemma 3's pattern of 6
    _SMALL,
    architectures=["Gemma3ForCausalLM"],
    model_type="gemma3_text",
    num_hidden_layers=6,
    sliding_window=64,
    sliding_window_pattern=6,
    query_pre_attn_scalar=32,
    rope_theta=1000000.0,
    rope_local_base_freq=10000.0,
    hidden_activation="gelu_pytorch_tanh",
)
TINY_MISTRAL_SW: dict[str, Any] = dict(  # one window for every layer (Mistral 7B v0.1 style)
    _SMALL,
    architectures=["MistralForCausalLM"],
    model_type="mistral",
    num_hidden_layers=4,
    sliding_window=256,
)
TINY_GPT_OSS: dict[str, Any] = dict(  # alternating sliding / full, MoE
    _SMALL,
    architectures=["GptOssForCausalLM"],
    model_type="gpt_oss",
    num_hidden_layers=4,
    sliding_window=128,
    num_local_experts=4,
    num_experts_per_tok=2,
    experts_per_token=2,
    rope_scaling=GPT_OSS_ROPE,
    rope_theta=150000.0,
)
TINY_GRANITE_H: dict[str, Any] = dict(  # Granite 4.0-H: Mamba-2 layers and one attention layer
    _SMALL,
    architectures=["GraniteMoeHybridForCausalLM"],
    model_type="granitemoehybrid",
    num_hidden_layers=4,
    shared_intermediate_size=256,
    layer_types=["mamba", "mamba", "mamba", "attention"],
    mamba_expand=2,
    mamba_n_groups=1,
    mamba_n_heads=8,
    mamba_d_head=32,
    mamba_d_state=64,
    mamba_d_conv=4,
    mamba_chunk_size=64,
    mamba_conv_bias=True,
    mamba_proj_bias=False,
    num_local_experts=0,
    num_experts_per_tok=0,
    position_embedding_type="nope",
    embedding_multiplier=1.0,
    logits_scaling=1.0,
    residual_multiplier=1.0,
    attention_multiplier=1.0,
)
TINY_NEMOTRON_H: dict[str, Any] = dict(  # Nemotron-H: the layer list as a pattern string
    _SMALL,
    architectures=["NemotronHForCausalLM"],
    model_type="nemotron_h",
    num_hidden_layers=6,
    hybrid_override_pattern="M-M*-M",
    mamba_num_heads=8,
    mamba_head_dim=32,
    n_groups=2,
    ssm_state_size=32,
    conv_kernel=4,
    expand=2,
    chunk_size=64,
    mamba_hidden_act="silu",
    mlp_hidden_act="relu2",
    use_conv_bias=True,
    use_bias=False,
    attention_bias=False,
    mlp_bias=False,
    layer_norm_epsilon=1e-5,
    residual_in_fp32=False,
)
TINY_DEEPSEEK_MLA: dict[str, Any] = dict(  # MLA: one latent per token and layer
    _SMALL,
    architectures=["DeepseekV2ForCausalLM"],
    model_type="deepseek_v2",
    num_hidden_layers=2,
    kv_lora_rank=64,
    q_lora_rank=64,
    qk_rope_head_dim=32,
    qk_nope_head_dim=32,
    v_head_dim=32,
    n_routed_experts=4,
    n_shared_experts=1,
    num_experts_per_tok=2,
    moe_intermediate_size=64,
    first_k_dense_replace=2,  # both layers dense
    moe_layer_freq=1,
)
TINY_LLAMA4_CHUNKED: dict[str, Any] = dict(  # Llama 4 text: chunked local attention, NoPE every 4th
    _SMALL,
    architectures=["Llama4ForCausalLM"],
    model_type="llama4_text",
    num_hidden_layers=4,
    attention_chunk_size=256,
    intermediate_size_mlp=256,
    num_local_experts=2,
    num_experts_per_tok=1,
    interleave_moe_layer_step=1,
    rope_theta=500000.0,
)
TINY_QWEN3_NEXT: dict[str, Any] = dict(  # Qwen3-Next: gated delta net layers, full every 4th
    _SMALL,
    architectures=["Qwen3NextForCausalLM"],
    model_type="qwen3_next",
    num_hidden_layers=4,
    full_attention_interval=4,
    linear_num_key_heads=2,
    linear_num_value_heads=4,
    linear_key_head_dim=32,
    linear_value_head_dim=32,
    linear_conv_kernel_dim=4,
    num_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=64,
    shared_expert_intermediate_size=64,
    decoder_sparse_step=1,
    norm_topk_prob=True,
    partial_rotary_factor=0.25,
)
FAMILIES: dict[str, dict[str, Any]] = {
    "llama": dict(TINY_LLAMA, head_dim=32, max_position_embeddings=65536),
    "gemma3": TINY_GEMMA3,
    "mistral-sw": TINY_MISTRAL_SW,
    "gpt-oss": TINY_GPT_OSS,
    "granite-h": TINY_GRANITE_H,
    "nemotron-h": TINY_NEMOTRON_H,
    "deepseek-mla": TINY_DEEPSEEK_MLA,
    "llama4-chunked": TINY_LLAMA4_CHUNKED,
    "qwen3-next": TINY_QWEN3_NEXT,
}


def write_family(root: Path, family: str) -> Path:
    """A small random checkpoint of one KV layer family (config.json and one tensor)."""
    cfg = FAMILIES[family]
    embed = [("model.embed_tokens.weight", "BF16", [cfg["vocab_size"], cfg["hidden_size"]])]
    return write_checkpoint(root, cfg, tensors=embed)
