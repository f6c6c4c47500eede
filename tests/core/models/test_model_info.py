"""The inspector reads config.json and safetensors headers only, and names what is wrong."""

from __future__ import annotations

import json
import struct
import time
from pathlib import Path

import pytest
from ckpt import LLAMA3_8B, llama_tensors, write_checkpoint

from quantdeck.core.errors import ModelError
from quantdeck.core.models.info import inspect_model, parse_quantization

TINY = dict(
    LLAMA3_8B,
    hidden_size=256,
    intermediate_size=768,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=1000,
    max_position_embeddings=2048,
)


def test_8b_shape_sharded_sparse(tmp_path: Path) -> None:
    root = write_checkpoint(tmp_path / "l8b", LLAMA3_8B, shards=4)
    t0 = time.perf_counter()
    info = inspect_model(root)
    assert time.perf_counter() - t0 < 1.0  # headers only: 16 GB are never read
    assert info.architecture == "LlamaForCausalLM" and info.model_type == "llama"
    assert info.num_parameters == 8_030_261_248  # Llama-3-8B's published count
    assert info.weights_bytes == 2 * info.num_parameters
    assert (
        info.num_layers,
        info.hidden_size,
        info.num_attention_heads,
        info.num_kv_heads,
        info.head_dim,
        info.vocab_size,
    ) == (32, 4096, 32, 8, 128, 128256)
    assert info.max_position_embeddings == 8192 and info.torch_dtype == "bfloat16"
    assert info.safetensors_files == 4 and info.quantization is None
    assert info.kv_bytes_per_token() == 2 * 32 * 8 * 128 * 2
    assert info.badge == "BF16"


def test_demo_model_facts(demo_model: Path) -> None:
    info = inspect_model(demo_model)
    assert info.architecture == "LlamaForCausalLM"
    assert (info.num_layers, info.hidden_size, info.num_kv_heads, info.head_dim) == (4, 256, 2, 64)
    assert info.weights_bytes == (demo_model / "model.safetensors").stat().st_size - (
        8 + struct.unpack("<Q", (demo_model / "model.safetensors").read_bytes()[:8])[0]
    )


QUANT_CONFIGS = [
    (
        {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False},
        ("gptq", 4, 128, "W4A16"),
        "GPTQ-4",
    ),
    (
        {
            "quant_method": "awq",
            "bits": 4,
            "group_size": 128,
            "version": "gemm",
            "zero_point": True,
        },
        ("awq", 4, 128, "W4A16"),
        "AWQ-4",
    ),
    ({"quant_method": "fp8", "activation_scheme": "dynamic"}, ("fp8", 8, None, "FP8"), "FP8"),
    (
        {"quant_method": "bitsandbytes", "load_in_4bit": True, "bnb_4bit_quant_type": "nf4"},
        ("bitsandbytes", 4, 64, "nf4"),
        "BnB-4",
    ),
    (
        {"quant_method": "bitsandbytes", "load_in_8bit": True},
        ("bitsandbytes", 8, None, "int8"),
        "BnB-8",
    ),
    (
        {
            "quant_method": "compressed-tensors",
            "format": "int-quantized",
            "config_groups": {
                "group_0": {
                    "targets": ["Linear"],
                    "weights": {"num_bits": 8, "type": "int", "strategy": "channel"},
                    "input_activations": {
                        "num_bits": 8,
                        "type": "int",
                        "dynamic": True,
                        "strategy": "token",
                    },
                }
            },
        },
        ("compressed-tensors", 8, None, "W8A8-INT8"),
        "W8A8",
    ),
    (
        {
            "quant_method": "compressed-tensors",
            "format": "float-quantized",
            "config_groups": {
                "group_0": {
                    "weights": {"num_bits": 8, "type": "float", "strategy": "channel"},
                    "input_activations": {
                        "num_bits": 8,
                        "type": "float",
                        "dynamic": True,
                        "strategy": "token",
                    },
                }
            },
        },
        ("compressed-tensors", 8, None, "W8A8-FP8"),
        "FP8",
    ),
    (
        {
            "quant_method": "compressed-tensors",
            "format": "pack-quantized",
            "config_groups": {
                "group_0": {
                    "weights": {
                        "num_bits": 4,
                        "type": "int",
                        "strategy": "group",
                        "group_size": 128,
                    }
                }
            },
        },
        ("compressed-tensors", 4, 128, "W4A16"),
        "W4A16",
    ),
]


@pytest.mark.parametrize("qc, expected, badge", QUANT_CONFIGS)
def test_quantization_configs(qc, expected, badge) -> None:
    q = parse_quantization(qc)
    assert (q.method, q.bits, q.group_size, q.scheme) == expected
    assert q.badge == badge


def test_gptq_packed_parameters(tmp_path: Path) -> None:
    """Packed int4 (8 per int32) counts as the parameters it holds; scales are not parameters."""
    cfg = dict(TINY, quantization_config=QUANT_CONFIGS[0][0], torch_dtype="float16")
    tensors = []
    for name, _, shape in llama_tensors(cfg):
        if ".layers." in name and name.endswith("proj.weight"):
            out_f, in_f = shape
            base = name[: -len(".weight")]
            tensors += [
                (base + ".qweight", "I32", [in_f // 8, out_f]),
                (base + ".qzeros", "I32", [in_f // 128, out_f // 8]),
                (base + ".scales", "F16", [in_f // 128, out_f]),
            ]
        else:
            tensors.append((name, "F16", shape))
    info = inspect_model(write_checkpoint(tmp_path / "g", cfg, tensors))
    dense = inspect_model(write_checkpoint(tmp_path / "d", TINY))
    assert info.num_parameters == dense.num_parameters
    assert info.weights_bytes < dense.weights_bytes * 0.5
    assert info.badge == "GPTQ-4"


def _bad(tmp_path: Path) -> Path:
    return write_checkpoint(tmp_path / "m", TINY)


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda r: __import__("shutil").rmtree(r), "no such folder"),
        (lambda r: (r / "config.json").unlink(), "no config.json"),
        (lambda r: (r / "config.json").write_text("{not json"), "corrupt JSON"),
        (
            lambda r: (r / "config.json").write_text(
                json.dumps(dict(TINY, architectures=["BertModel"]))
            ),
            "unknown architecture 'BertModel'",
        ),
        (
            lambda r: (r / "config.json").write_text(
                json.dumps({"architectures": ["FooForCausalLM"]})
            ),
            "'num_hidden_layers' missing",
        ),
        (lambda r: (r / "model.safetensors").unlink(), "no \\*.safetensors"),
        (
            lambda r: _truncate(r / "model.safetensors", 5),
            "truncated safetensors file \\(no header",
        ),
        (lambda r: _truncate(r / "model.safetensors", 1000), "exceeds the file"),
        (lambda r: _truncate(r / "model.safetensors", -10), "truncated safetensors file"),
        (lambda r: _scribble(r / "model.safetensors"), "not JSON"),
    ],
)
def test_bad_models(tmp_path: Path, damage, message) -> None:
    root = _bad(tmp_path)
    damage(root)
    with pytest.raises(ModelError, match=message) as e:
        inspect_model(root)
    assert "\n" not in str(e.value)


def _truncate(p: Path, size: int) -> None:
    n = p.stat().st_size
    with open(p, "r+b") as f:
        f.truncate(size if size > 0 else n + size)


def _scribble(p: Path) -> None:
    with open(p, "r+b") as f:
        f.seek(8)
        f.write(b"\xff\xfe garbage")


def test_missing_shard(tmp_path: Path) -> None:
    root = write_checkpoint(tmp_path / "s", TINY, shards=2)
    next(root.glob("model-00002-*")).unlink()
    with pytest.raises(ModelError, match="shard model-00002-of-00002.safetensors is missing"):
        inspect_model(root)


def test_offsets_must_match_shapes(tmp_path: Path) -> None:
    root = tmp_path / "o"
    root.mkdir()
    (root / "config.json").write_text(json.dumps(TINY))
    header = {"a": {"dtype": "BF16", "shape": [4, 4], "data_offsets": [0, 30]}}
    raw = json.dumps(header).encode()
    (root / "model.safetensors").write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * 30)
    with pytest.raises(ModelError, match="offsets of 'a' do not match"):
        inspect_model(root)
