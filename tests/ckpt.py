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
