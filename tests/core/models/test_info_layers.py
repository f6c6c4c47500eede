"""The inspector's per-layer cache kinds against the layer_types transformers' own config classes
fill in (vLLM's attention layers read those), and the hybrid models' state shapes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from ckpt import FAMILIES, TINY_GEMMA3, write_checkpoint, write_family

from quantdeck.core.errors import ModelError
from quantdeck.core.models import inspect_model
from quantdeck.core.models.info import FULL, MAMBA, NO_CACHE, SLIDING

# transformers' names -> the inspector's (Granite 4.0-H says "attention", Nemotron-H "mlp"...).
HF_KINDS = """
import json, sys
from transformers import AutoConfig
out = {}
for name, path in json.loads(sys.argv[1]).items():
    c = AutoConfig.from_pretrained(path)
    c = c.get_text_config()
    out[name] = {"layer_types": getattr(c, "layer_types", None),
                 "sliding_window": getattr(c, "sliding_window", None)}
print(json.dumps(out))
"""
_HF_TO_KIND = {
    "full_attention": FULL,
    "attention": FULL,
    "sliding_attention": SLIDING,
    "mamba": MAMBA,
    "linear_attention": "linear_attention",
    "mlp": NO_CACHE,
    "moe": NO_CACHE,
    "chunked_attention": "chunked_attention",
}


def _state(kind: str) -> str:
    return MAMBA if kind == "linear_attention" else kind


@pytest.fixture(scope="module")
def families(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("families")
    return {f: write_family(root / f, f) for f in FAMILIES}


@pytest.mark.slow  # transformers' import in a subprocess: seconds
def test_layer_kinds_match_transformers(families: dict[str, Path]) -> None:
    run = subprocess.run(
        [sys.executable, "-c", HF_KINDS, json.dumps({k: str(v) for k, v in families.items()})],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    hf = json.loads(run.stdout.splitlines()[-1])
    checked = 0
    for name, path in families.items():
        info = inspect_model(path)
        types = hf[name]["layer_types"]
        if name == "llama4-chunked":  # no layer_types: RoPE layers attend in chunks
            assert info.kinds() == ("chunked_attention",) * 3 + (FULL,)
            continue
        if types is None:  # Llama, Mistral: one kind for every layer
            want = (SLIDING if hf[name]["sliding_window"] else FULL,) * info.num_layers
        else:
            want = tuple(_HF_TO_KIND[t] for t in types)
        # transformers 5 names Granite's Mamba layers "linear_attention": both keep a state
        assert [_state(k) for k in info.kinds()] == [_state(k) for k in want], name
        checked += 1
    assert checked == len(families) - 1


def test_gemma3_pattern_and_window(tmp_path: Path) -> None:
    info = inspect_model(write_family(tmp_path / "g", "gemma3"))
    assert info.kinds() == (SLIDING,) * 5 + (FULL,)
    assert info.sliding_window == 64 and info.to_json()["layer_types"][5] == FULL
    # 2 KV heads x 32 x 2 (K and V) x 2 bytes x 6 attention layers
    assert info.kv_bytes_per_token() == 2 * 2 * 32 * 2 * 6


def test_no_window_means_full(tmp_path: Path) -> None:
    cfg = dict(TINY_GEMMA3, sliding_window=None)
    path = write_checkpoint(tmp_path / "g", cfg, tensors=[("e.weight", "BF16", [4, 4])])
    assert inspect_model(path).layer_types == ()  # every layer full attention


def test_hybrid_state_shapes(families: dict[str, Path]) -> None:
    granite = inspect_model(families["granite-h"])
    assert granite.kinds() == (MAMBA,) * 3 + (FULL,)
    s = granite.state
    assert s is not None and s.kind == "mamba2"
    # conv: (4 - 1) x (2 x 128 + 2 x 1 x 64) channels; SSM: 8 heads x 32 x 64
    assert s.page_bytes(2, 2) == 3 * 384 * 2 + 8 * 32 * 64 * 2
    assert granite.kv_bytes_per_token() == 2 * 2 * 32 * 2 * 1  # the one attention layer
    nemotron = inspect_model(families["nemotron-h"])
    assert nemotron.kinds() == (MAMBA, NO_CACHE, MAMBA, FULL, NO_CACHE, MAMBA)
    assert nemotron.state is not None and nemotron.state.ssm_dtype == "float32"
    # tensor parallel 4 with 2 groups: vLLM replicates groups up to 4
    assert nemotron.state.conv_channels(4) == (256 + 2 * 4 * 32) // 4
    qwen = inspect_model(families["qwen3-next"])
    assert qwen.state is not None and qwen.state.kind == "gdn"
    assert qwen.state.page_bytes(2, 2) == 3 * (2 * 2 * 32 + 4 * 32) * 2 + 4 * 32 * 32 * 2


def test_bad_layer_types(tmp_path: Path) -> None:
    cfg = dict(TINY_GEMMA3, layer_types=["sliding_attention"] * 5 + ["teleport"])
    path = write_checkpoint(tmp_path / "g", cfg, tensors=[("e.weight", "BF16", [4, 4])])
    with pytest.raises(ModelError, match="unknown layer type 'teleport'"):
        inspect_model(path)
    cfg = dict(TINY_GEMMA3, layer_types=["sliding_attention"] * 4)
    path = write_checkpoint(tmp_path / "h", cfg, tensors=[("e.weight", "BF16", [4, 4])])
    with pytest.raises(ModelError, match="4 entries for 6 layers"):
        inspect_model(path)
