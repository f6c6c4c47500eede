"""LoRA adapter folders: the demo adapter's files, the reader's checks (by hand and fuzzed),
and the library listing adapters with their base model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from ckpt import TINY_LLAMA, write_checkpoint
from fuzz import as_text, fuzz_settings, mutated, one_line_error
from hypothesis import given

from quantdeck.core.errors import ConfigError, ModelError, QuantdeckError
from quantdeck.core.models import make_demo_adapter, read_adapter, scan_folders
from quantdeck.core.models.adapters import ADAPTER_CONFIG
from quantdeck.core.models.info import read_safetensors_header
from quantdeck.core.paths import output_kind

GOOD = {
    "peft_type": "LORA",
    "r": 8,
    "lora_alpha": 16,
    "target_modules": ["q_proj", "v_proj"],
    "base_model_name_or_path": "/models/base",
}


@pytest.fixture
def base(tmp_path: Path) -> Path:
    return write_checkpoint(tmp_path / "base", TINY_LLAMA)


@pytest.fixture
def adapter(tmp_path: Path, base: Path) -> Path:
    return make_demo_adapter(tmp_path / "lora", base)


def test_demo_adapter_is_a_peft_lora_of_its_base(adapter: Path, base: Path) -> None:
    info = read_adapter(adapter)
    assert (info.rank, info.alpha, info.target_modules) == (8, 16, ("q_proj", "v_proj"))
    assert info.base_model == str(base.absolute())
    assert info.badge == "LoRA-8"
    assert output_kind(adapter) == "lora"
    tensors = {
        t.name: t.shape for t in read_safetensors_header(adapter / "adapter_model.safetensors")
    }
    cfg = TINY_LLAMA
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    assert len(tensors) == cfg["num_hidden_layers"] * 4
    q = "base_model.model.model.layers.0.self_attn.q_proj"
    v = "base_model.model.model.layers.0.self_attn.v_proj"
    assert tensors[f"{q}.lora_A.weight"] == (8, cfg["hidden_size"])
    assert tensors[f"{q}.lora_B.weight"] == (cfg["num_attention_heads"] * head_dim, 8)
    assert tensors[f"{v}.lora_B.weight"] == (cfg["num_key_value_heads"] * head_dim, 8)
    assert info.weights_bytes == sum(4 * a * b for a, b in tensors.values())


def test_demo_adapter_replaces_its_own_build_but_never_a_foreign_folder(
    tmp_path: Path, base: Path, adapter: Path
) -> None:
    assert make_demo_adapter(adapter, base, seed=1) == adapter  # an earlier adapter: redone
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep")
    with pytest.raises(ConfigError, match="not made by Quantdeck"):
        make_demo_adapter(foreign, base)
    assert (foreign / "notes.txt").read_text() == "keep"


def test_library_lists_adapters_with_their_base(tmp_path: Path, base: Path, adapter: Path) -> None:
    entries = {e.name: e for e in scan_folders([tmp_path])}
    assert entries["base"].kind == "model" and entries["base"].info is not None
    lora = entries["lora"]
    assert lora.kind == "adapter" and lora.error is None
    assert lora.badge == "LoRA-8" and lora.base_model == str(base.absolute())
    assert lora.to_json()["adapter"]["target_modules"] == ("q_proj", "v_proj")


def _write(root: Path, cfg: Any, weights: bool = True) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    text = cfg if isinstance(cfg, str) else json.dumps(cfg, allow_nan=True)
    (root / ADAPTER_CONFIG).write_text(text)
    if weights:
        (root / "adapter_model.bin").write_bytes(b"\0" * 16)
    return root


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"r": 0}, "'r' must be an integer from 1 to 512"),
        ({"r": "8"}, "'r' must be an integer"),
        ({"r": None}, "'r' missing"),
        ({"lora_alpha": float("nan")}, "not a finite number"),
        ({"target_modules": []}, "'target_modules' must name at least one module"),
        ({"target_modules": [1]}, "'target_modules' must name at least one module"),
        ({"peft_type": "IA3"}, "only LoRA adapters are served"),
    ],
)
def test_bad_adapter_config_is_one_line_naming_the_key(
    tmp_path: Path, changes: dict[str, Any], message: str
) -> None:
    root = _write(tmp_path / "a", {**GOOD, **changes})
    with pytest.raises(ModelError, match=message) as e:
        read_adapter(root)
    assert str(root / ADAPTER_CONFIG) in str(e.value)
    one_line_error(e.value)


def test_adapter_without_weights_is_refused(tmp_path: Path) -> None:
    root = _write(tmp_path / "a", GOOD, weights=False)
    with pytest.raises(ModelError, match="adapter weights missing"):
        read_adapter(root)


@fuzz_settings(80)
@given(text=as_text(mutated(GOOD, [*GOOD, "rank_pattern", "bias"])))
def test_adapter_config_fuzz_is_a_result_or_one_line(tmp_path: Path, text: str) -> None:
    root = _write(tmp_path / "fuzz", text)
    try:
        info = read_adapter(root)
    except QuantdeckError as e:
        one_line_error(e)
        return
    assert 1 <= info.rank <= 512 and info.target_modules
