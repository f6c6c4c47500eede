"""Bad metadata is one ModelError line, never a traceback: config.json (text_config included),
quantization configs, safetensors headers and shard indexes, checked by hand and fuzzed."""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path
from typing import Any

import pytest
from ckpt import TINY_LLAMA, llama_tensors, write_checkpoint, write_safetensors
from fuzz import JSON_VALUES, as_text, fuzz_settings, mutated, one_line_error
from hypothesis import given
from hypothesis import strategies as st

from quantdeck.core.errors import ModelError, QuantdeckError
from quantdeck.core.launch import LaunchConfig, advise, cpu_device, cuda_device, plan
from quantdeck.core.models import scan_folders
from quantdeck.core.models.info import (
    TensorEntry,
    _weight_files,
    count_parameters,
    inspect_model,
    parse_quantization,
    read_safetensors_header,
)

TINY = TINY_LLAMA
CONFIG_KEYS = [
    *TINY,
    "architectures",
    "head_dim",
    "text_config",
    "quantization_config",
    "kv_lora_rank",
    "qk_rope_head_dim",
    "sliding_window",
    "multi_query",
    "n_layer",
    "dtype",
]


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return write_checkpoint(tmp_path / "m", TINY)


def _config(root: Path, **changes: Any) -> None:
    (root / "config.json").write_text(json.dumps(dict(TINY, **changes), allow_nan=True))


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"architectures": [1]}, "'architectures' must be a list of names"),
        ({"architectures": "LlamaForCausalLM"}, "'architectures' must be a list"),
        ({"head_dim": "x"}, "'head_dim' must be an integer"),
        ({"text_config": {**TINY, "head_dim": []}}, "'text_config': 'head_dim' must be"),
        ({"text_config": "x"}, "'text_config' must be a JSON object"),
        ({"max_position_embeddings": -5}, "'max_position_embeddings' must be an integer"),
        ({"num_key_value_heads": 0}, "'num_key_value_heads' must be an integer"),
        ({"max_position_embeddings": float("nan")}, "NaN is not a finite number"),
        ({"hidden_size": float("inf")}, "Infinity is not a finite number"),
        ({"hidden_size": True}, "'hidden_size' must be an integer"),
        (
            {"quantization_config": {"quant_method": "gptq", "bits": "4"}},
            "'quantization_config': 'bits' must be an integer from 2 to 8, got '4'",
        ),
        (
            {"quantization_config": {"quant_method": "fp8", "weight_block_size": 128}},
            "'weight_block_size' must be two positive integers, got 128",
        ),
        (
            {"quantization_config": {"quant_method": "compressed-tensors", "config_groups": []}},
            "'config_groups' must be a JSON object",
        ),
        ({"quantization_config": {"quant_method": "awq", "bits": 0}}, "'bits' must be"),
    ],
)
def test_bad_config_fields_are_one_line(model: Path, changes: dict, message: str) -> None:
    _config(model, **changes)
    with pytest.raises(ModelError, match=re.escape(message)) as e:
        inspect_model(model)
    one_line_error(e.value)


def test_deep_json_is_an_error_not_a_recursion(model: Path) -> None:
    (model / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ModelError, match="nested too deeply"):
        inspect_model(model)
    (model / "config.json").write_text(json.dumps({"a": json.loads("[" * 100 + "]" * 100)}))
    with pytest.raises(ModelError, match="nested more than 64 levels"):
        inspect_model(model)


def _header_file(path: Path, header: Any, data: int = 64) -> Path:
    raw = json.dumps(header, allow_nan=True).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * data)
    return path


@pytest.mark.parametrize(
    "entry, message",
    [
        ({"dtype": ["F16"], "shape": [2], "data_offsets": [0, 4]}, "unknown tensor dtype"),
        ({"dtype": "F16", "shape": [2], "data_offsets": ["0", "4"]}, "data_offsets"),
        ({"dtype": "F16", "shape": ["2"], "data_offsets": [0, 4]}, "shape"),
        ({"dtype": "F16", "shape": [2], "data_offsets": [4, 0]}, "do not match"),
        ({"dtype": "F4", "shape": [2**40] * 16, "data_offsets": [0, 4]}, "do not match"),
        ({"dtype": "F16", "shape": [2], "data_offsets": [0, 4.0]}, "data_offsets"),
        ("F16", "not an object"),
    ],
)
def test_bad_safetensors_entries(tmp_path: Path, entry: Any, message: str) -> None:
    path = _header_file(tmp_path / "x.safetensors", {"w": entry})
    with pytest.raises(ModelError, match=message) as e:
        read_safetensors_header(path)
    one_line_error(e.value)


def test_huge_header_length_is_refused_before_reading(tmp_path: Path) -> None:
    path = tmp_path / "x.safetensors"
    path.write_bytes(struct.pack("<Q", 2**63) + b"{}")
    with pytest.raises(ModelError, match="corrupt safetensors header \\(length"):
        read_safetensors_header(path)


@pytest.mark.parametrize(
    "shard", ["../outside.safetensors", "OUTSIDE", "sub/../../outside.safetensors", "x.bin"]
)
def test_index_shards_stay_in_the_model_folder(tmp_path: Path, shard: str) -> None:
    """A shard name with a folder part could make Quantdeck read any file on the machine."""
    root = write_checkpoint(tmp_path / "m", TINY, shards=2)
    outside = tmp_path / "outside.safetensors"
    write_safetensors(outside, llama_tensors(TINY))
    shard = shard.replace("OUTSIDE", str(outside))
    (root / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {"w": shard}}))
    with pytest.raises(ModelError, match="must be a .safetensors file in the model folder"):
        inspect_model(root)


def test_one_bad_folder_does_not_hide_the_others(tmp_path: Path) -> None:
    good = write_checkpoint(tmp_path / "lib" / "good", TINY)
    bad = write_checkpoint(tmp_path / "lib" / "bad", TINY)
    _config(bad, architectures=[1])
    entries = {e.name: e for e in scan_folders([tmp_path / "lib"])}
    assert entries["good"].info is not None and entries["good"].path == str(good)
    assert entries["bad"].info is None and "'architectures'" in (entries["bad"].error or "")


# -- property tests: whatever the file holds, a result or one ModelError line ---------------


def _settles(fn: Any, *args: Any) -> Any:
    """``fn(*args)``, or None when it raised a one-line user error."""
    try:
        return fn(*args)
    except QuantdeckError as e:
        one_line_error(e)
        return None


DEVICES = (cpu_device(), cuda_device(80))


@fuzz_settings(40)
@given(text=as_text(mutated(TINY, CONFIG_KEYS)))
def test_fuzz_config_json(model: Path, text: str) -> None:
    """And what the inspector accepts plans without negative or nonsense figures."""
    (model / "config.json").write_text(text)
    info = _settles(inspect_model, model)
    if info is None:
        return
    assert info.shape_error() is None
    for device in DEVICES:
        kv = _settles(plan, LaunchConfig(), info, device)
        if kv is None:
            continue
        assert kv.max_concurrency >= 0 and kv.kv_cache_tokens >= 0 and kv.max_model_len >= 1
        if kv.fits:
            assert kv.kv_cache_tokens >= kv.max_model_len
        advise(LaunchConfig(), info, device, kv)


QUANT_BASES = [
    {"quant_method": "gptq", "bits": 4, "group_size": 128},
    {"quant_method": "awq", "w_bit": 4, "q_group_size": 128},
    {"quant_method": "fp8", "weight_block_size": [128, 128]},
    {"load_in_4bit": True, "bnb_4bit_quant_type": "nf4", "bnb_4bit_blocksize": 64},
    {
        "quant_method": "compressed-tensors",
        "config_groups": {
            "g": {
                "weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 8},
                "input_activations": {"num_bits": 8, "type": "float"},
            }
        },
    },
    {"quant_method": "mxfp4", "bits": 4},
]
PACKED = [  # header entries whose count depends on the bits
    TensorEntry("model.layers.0.mlp.qweight", "I32", (8, 16), 512),
    TensorEntry("model.layers.0.mlp.weight_packed", "U8", (8, 16), 128),
    TensorEntry("model.embed_tokens.weight", "BF16", (10, 16), 320),
]
QUANT_KEYS = sorted({k for q in QUANT_BASES for k in q} | {"quant_algo", "load_in_8bit"})


@fuzz_settings(80)
@given(qc=st.one_of([mutated(q, QUANT_KEYS) for q in QUANT_BASES]) | JSON_VALUES)
def test_fuzz_quantization_config(qc: Any) -> None:
    q = _settles(parse_quantization, qc)
    if q is None:
        return
    assert isinstance(q.badge, str)
    assert count_parameters(PACKED, q) >= 0


ENTRY = {"dtype": "F16", "shape": [2, 3], "data_offsets": [0, 12]}


@fuzz_settings(80)
@given(
    entries=st.dictionaries(
        st.text(max_size=8),
        mutated(ENTRY, ["dtype", "shape", "data_offsets", "extra"]) | JSON_VALUES,
        max_size=4,
    )
    | JSON_VALUES
)
def test_fuzz_safetensors_header(tmp_path: Path, entries: Any) -> None:
    path = _header_file(tmp_path / "x.safetensors", entries)
    out = _settles(read_safetensors_header, path)
    if out is not None:
        size = path.stat().st_size
        assert all(t.nbytes >= 0 and t.nbytes <= size for t in out)


@fuzz_settings(70)
@given(
    index=mutated({"weight_map": {"a": "model-00001-of-00002.safetensors"}}, ["weight_map"]).map(
        lambda d: json.dumps(d, allow_nan=True)
    )
    | st.dictionaries(st.text(max_size=4), st.text(max_size=30) | JSON_VALUES, max_size=3).map(
        lambda wm: json.dumps({"weight_map": wm}, allow_nan=True)
    )
    | as_text(JSON_VALUES)
)
def test_fuzz_index(tmp_path: Path, index: str) -> None:
    root = tmp_path / "sharded"
    if not root.exists():
        write_checkpoint(root, TINY, shards=2)
    (root / "model.safetensors.index.json").write_text(index)
    files = _settles(_weight_files, root)
    if files is not None:
        assert all(f.parent == root for f in files)
