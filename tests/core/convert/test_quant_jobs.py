"""Conversion jobs: supervised subprocesses, verify-then-rename, cancel leaves nothing, queue."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
from conftest import ROOT

from quantdeck.core.convert.jobs import Conversion, JobCancelled, JobQueue, QuantSpec, run_job
from quantdeck.core.errors import ConfigError, ModelError
from quantdeck.core.events import Event, ProgressEvent, StateEvent
from quantdeck.core.models import inspect_model
from quantdeck.core.paths import output_kind


def tree_hash(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        if p.is_file():
            h.update(p.name.encode())
            h.update(p.read_bytes())
    return h.hexdigest()


@pytest.fixture(autouse=True)
def _one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # 2 shared cores: see core/quality_entry.py


def _leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if ".tmp-" in p.name)


def test_quantize_cli_fp8(demo_model: Path, tmp_path: Path) -> None:
    before = tree_hash(demo_model)
    out = tmp_path / "demo-fp8"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "quantdeck.cli",
            "quantize",
            str(demo_model),
            "--method",
            "fp8",
            "--out",
            str(out),
            "--json-events",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    events = [json.loads(line) for line in r.stdout.splitlines()]
    done = events[-1]
    assert done["event"] == "done" and done["out"] == str(out)
    assert done["quant_method"] == "compressed-tensors" and done["scheme"] == "W8A8-FP8"
    assert done["bytes"] < done["source_bytes"]
    stages = [e["stage"] for e in events if e["event"] == "progress"]
    assert stages[0] == "start" and "quantize" in stages and stages[-1] == "verify"
    pcts = [e["pct"] for e in events if e["event"] == "progress"]
    assert pcts == sorted(pcts)
    info = inspect_model(out)
    assert info.quantization.badge == "FP8" and (out / "tokenizer.json").is_file()
    assert output_kind(out) == "conversion"  # marked as Quantdeck's output
    assert tree_hash(demo_model) == before
    assert _leftovers(tmp_path) == []


def test_refusals_before_any_process(demo_model: Path, tmp_path: Path) -> None:
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "x").write_text("x")
    with pytest.raises(ConfigError, match="is not empty and was not made by Quantdeck"):
        QuantSpec(str(demo_model), "w8a8", str(busy)).check()
    with pytest.raises(ConfigError, match="not one of"):
        QuantSpec(str(demo_model), "int3", str(tmp_path / "o")).check()
    with pytest.raises(ModelError, match="no such folder"):
        QuantSpec(str(tmp_path / "nope"), "fp8", str(tmp_path / "o")).check()
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "quantdeck.cli",
            "quantize",
            str(tmp_path / "nope"),
            "--method",
            "fp8",
            "--out",
            str(tmp_path / "o"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "no such folder" in r.stderr


def test_corrupt_source_fails_cleanly(demo_model: Path, tmp_path: Path) -> None:
    src = tmp_path / "src"
    shutil.copytree(demo_model, src)
    with open(src / "model.safetensors", "r+b") as f:
        f.truncate(1000)
    with pytest.raises(ModelError, match="truncated|corrupt"):
        run_job(QuantSpec(str(src), "fp8", str(tmp_path / "out")))
    assert not (tmp_path / "out").exists() and _leftovers(tmp_path) == []


def test_cancel_mid_job_leaves_nothing(demo_model: Path, tmp_path: Path) -> None:
    before = tree_hash(demo_model)
    q = JobQueue()
    first = q.submit(QuantSpec(str(demo_model), "w8a8", str(tmp_path / "a")))
    second = q.submit(QuantSpec(str(demo_model), "fp8", str(tmp_path / "b")))
    assert second.state == "queued"
    deadline = time.time() + 300
    while first.stage not in ("load", "quantize") and time.time() < deadline:
        time.sleep(0.05)
    assert first.state == "running" and second.state == "queued"  # one at a time
    q.cancel(first.id)
    q.cancel(second.id)  # cancelled while still queued: never starts
    q.wait(first.id, 60)
    assert first.state == "cancelled" and second.state == "cancelled"
    assert not any(isinstance(e, StateEvent) and e.state == "running" for e in second.events)
    time.sleep(0.5)
    assert sorted(os.listdir(tmp_path)) == []  # no output, no temp folder
    assert tree_hash(demo_model) == before
    q.close()


@pytest.mark.server
@pytest.mark.parametrize(
    "method, kernel",
    [
        ("fp8", "CompressedTensorsW8A8Fp8"),
        ("w8a8", "CompressedTensorsW8A8Int8"),
        ("bnb-nf4", None),
        ("bnb-int8", None),
        # int4 through vLLM's CPUWNA16 kernel: where the CPU has AVX-512 (cpu_gemm_wna16)
        ("gptq", "AutoGPTQLinearMethod"),
        ("awq", "AutoAWQMarlinLinearMethod"),
    ],
)
def test_converted_models_serve_on_vllm_cpu(
    demo_server_parked,
    demo_model: Path,
    converted,
    tmp_path: Path,
    method: str,
    kernel: str | None,
) -> None:
    """Each format vllm-cpu has kernels for loads in the real server and answers; the log names
    the quantization method class vLLM chose. The session server steps aside meanwhile. The
    Convert tab's note says the same (quantdeck.core.convert.serving_note). GPTQ and AWQ serve
    the module's GPTQModel conversions (the tests below read the same outputs), made once."""
    import httpx

    from quantdeck.core.convert import serving_note
    from quantdeck.core.launch import LaunchConfig, cpu_device
    from quantdeck.core.runtime import ServerProcess, free_port
    from quantdeck.core.runtime.server import ONE_PROCESS_ENGINE_ENV

    device = cpu_device()
    if method in ("gptq", "awq") and "avx512f" not in device.cpu_flags:
        pytest.skip("vllm-cpu has no int4 kernel without AVX-512")
    assert serving_note(method, inspect_model(demo_model), device).problem is None
    if method in GPTQMODEL_LIMITS:
        out = converted(method).out
    else:
        out = tmp_path / f"demo-{method}"
        run_job(QuantSpec(str(demo_model), method, str(out), samples=8, seq_len=128))
    cfg = LaunchConfig()
    cfg.model.model = str(out)
    cfg.compilation.enforce_eager = True
    cfg.cache.kv_cache_memory_bytes = 64 * 2**20
    cfg.server.port = free_port()
    srv = ServerProcess(
        cfg,
        capabilities=demo_server_parked.capabilities(),
        run_dir=tmp_path / "run",
        extra_env=ONE_PROCESS_ENGINE_ENV,  # one interpreter to start, not three
    )
    try:
        srv.start()
        assert srv.wait_ready(420), "\n".join(list(srv.log_tail)[-30:])
        r = httpx.post(
            srv.url + "/v1/completions",
            timeout=120,
            json={
                "model": srv.served_name,
                "prompt": "The class definition is",
                "max_tokens": 8,
                "temperature": 0,
            },
        )
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 8
        assert r.json()["choices"][0]["text"].strip()
        log = srv.log_path.read_text()
        if kernel:
            assert srv.facts.get("quantization_method_class") == kernel or kernel in log
        else:
            assert "bitsandbytes" in log.lower()
    finally:
        srv.stop()


# -- GPTQ and AWQ through GPTQModel -----------------------------------------------------------

# Measured on the demo model (8 x 128 calibration tokens, 2048 held-out tokens, float32
# compute): gptq KL 2.2e-4, top-1 0.989, ppl 59.73 vs 59.74; awq KL 3.5e-4, top-1 0.986,
# ppl 59.87 vs 59.74. The limits leave ~10x margin on KL.
GPTQMODEL_LIMITS = {  # method -> (max kl_mean, min top1_agreement, max ppl_quant / ppl_orig)
    "gptq": (3e-3, 0.95, 1.03),
    "awq": (3e-3, 0.95, 1.03),
}
# linear weights after / bf16 before: int4 qweight + fp16 scales + int4 zeros per group of 128,
# + the int32 g_idx (gptq) of 256-wide layers
GPTQMODEL_RATIOS = {"gptq": (0.26, 0.27), "awq": (0.255, 0.265)}


class Converted:
    """One finished run_job of the demo model, with every event it emitted."""

    def __init__(self, out: Path, result: Conversion, events: list[dict]) -> None:
        self.out, self.result, self.events = out, result, events


@pytest.fixture(scope="module")
def gptqmodel_source(demo_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the demo model: the source of the GPTQModel conversions."""
    src = tmp_path_factory.mktemp("gq-src") / "demo"
    shutil.copytree(demo_model, src)
    return src


@pytest.fixture(scope="module")
def gptqmodel_source_hash(gptqmodel_source: Path) -> str:
    return tree_hash(gptqmodel_source)


@pytest.fixture(scope="module")
def converted(
    gptqmodel_source: Path, gptqmodel_source_hash: str, tmp_path_factory: pytest.TempPathFactory
):
    """``converted(method)``: run_job of the demo model to ``method``, once per module."""
    done: dict[str, Converted] = {}

    def run(method: str) -> Converted:
        if method not in done:  # called from a test: OMP_NUM_THREADS=1 (_one_thread)
            events: list[dict] = []
            out = tmp_path_factory.mktemp(f"gq-{method}") / f"demo-{method}"
            result = run_job(
                QuantSpec(str(gptqmodel_source), method, str(out), samples=8, seq_len=128),
                lambda ev: events.append(ev.to_json()),
            )
            done[method] = Converted(out, result, events)
        return done[method]

    return run


@pytest.mark.slow
@pytest.mark.parametrize("method", ["gptq", "awq"])
def test_gptqmodel_job_reports_layer_by_layer(converted, method: str) -> None:
    conv = converted(method)
    assert conv.result.quant_method == method and conv.result.scheme == "W4A16"
    progress = [e for e in conv.events if e["event"] == "progress"]
    pcts = [e["pct"] for e in progress]
    assert pcts == sorted(pcts) and pcts[-1] == 100.0
    stages = [e["stage"] for e in progress]
    assert stages[0] == "start" and stages[-1] == "verify"
    assert [s for s in ("load", "calibrate", "quantize", "pack", "save") if s in stages] == [
        "load",
        "calibrate",
        "quantize",
        "pack",
        "save",
    ]
    layers = [e["layer"] for e in progress if e["stage"] == "quantize"]
    assert layers == sorted(layers) and set(layers) == {0, 1, 2, 3, 4}
    assert all(e["layers"] == 4 for e in progress if e["stage"] == "quantize")
    # within a layer, GPTQModel's four groups of linears (qkv, o, gate/up, down) move the bar
    assert len({e["pct"] for e in progress if e["stage"] == "quantize"}) >= 4 * 4
    assert conv.result.peak_rss_bytes is not None and conv.result.peak_rss_bytes > 2**20


@pytest.mark.slow
@pytest.mark.parametrize("method", ["gptq", "awq"])
def test_gptqmodel_output_is_what_vllm_reads(
    converted, gptqmodel_source: Path, method: str
) -> None:
    from quantdeck.core.models.info import read_safetensors_header

    conv = converted(method)
    info, orig = inspect_model(conv.out), inspect_model(gptqmodel_source)
    q = info.quantization
    assert (q.method, q.bits, q.group_size, q.scheme) == (method, 4, 128, "W4A16")
    assert info.num_parameters == orig.num_parameters  # packed int4 counted as values
    other = orig.weights_bytes - orig.linear_weight_bytes
    lo, hi = GPTQMODEL_RATIOS[method]
    assert lo <= (info.weights_bytes - other) / orig.linear_weight_bytes <= hi
    qc = json.loads((conv.out / "config.json").read_text())["quantization_config"]
    assert (qc["quant_method"], qc["bits"], qc["group_size"]) == (method, 4, 128)
    if method == "gptq":
        assert qc["desc_act"] is False and qc["sym"] is True
        assert qc["checkpoint_format"] == "gptq"
    else:
        assert qc["zero_point"] is True and qc["version"] == "gemm"
    tensors = {t.name: t for t in read_safetensors_header(conv.out / "model.safetensors")}
    p = "model.layers.0.mlp.down_proj"  # 768 -> 256
    assert f"{p}.weight" not in tensors
    if method == "gptq":  # packed along the input: (in / 8, out)
        assert (tensors[f"{p}.qweight"].dtype, tensors[f"{p}.qweight"].shape) == ("I32", (96, 256))
        assert tensors[f"{p}.g_idx"].shape == (768,)
    else:  # AWQ GEMM: packed along the output: (in, out / 8)
        assert (tensors[f"{p}.qweight"].dtype, tensors[f"{p}.qweight"].shape) == ("I32", (768, 32))
    # GPTQ scales are fp16 (the gptq format); GPTQModel's AWQ keeps the model's dtype
    scales_dtype = "F16" if method == "gptq" else "BF16"
    assert (tensors[f"{p}.scales"].dtype, tensors[f"{p}.scales"].shape) == (scales_dtype, (6, 256))
    assert tensors[f"{p}.qzeros"].shape == (6, 32)
    assert tensors["lm_head.weight"].dtype == "BF16"
    # the source's tokenizer and generation files, byte for byte; GPTQModel's scratch is gone
    for name in (
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "generation_config.json",
    ):
        assert (conv.out / name).read_bytes() == (gptqmodel_source / name).read_bytes(), name
    assert not (conv.out / ".gptqmodel").exists() and not (ROOT / "logs").exists()
    assert not (conv.out / "chat_template.jinja").exists()
    assert _leftovers(conv.out.parent) == []


_LOAD_AND_GENERATE = """
import json, sys, torch, warnings
warnings.filterwarnings("ignore")
from transformers import AutoModelForCausalLM, AutoTokenizer
path = sys.argv[1]
model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, device_map="cpu").eval()
tok = AutoTokenizer.from_pretrained(path)
ids = tok("The class definition is", return_tensors="pt").input_ids
out = model.generate(ids, max_new_tokens=8, do_sample=False)
q = model.model.layers[0].self_attn.q_proj
print(json.dumps({"module": type(q).__module__, "buffers": sorted(dict(q.named_buffers())),
                  "new_tokens": int(out.shape[1] - ids.shape[1])}))
"""


@pytest.mark.slow
@pytest.mark.parametrize("method", ["gptq", "awq"])
def test_gptqmodel_output_loads_in_transformers(converted, method: str) -> None:
    """transformers loads the int4 layers as GPTQModel's quantized linears (not dequantized
    copies) and generates; this is how the checkpoint is checked on a CPU-only machine."""
    conv = converted(method)
    r = subprocess.run(
        [sys.executable, "-c", _LOAD_AND_GENERATE, str(conv.out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    d = json.loads(r.stdout.strip().splitlines()[-1])
    assert d["module"].startswith("gptqmodel.") and "qweight" in d["buffers"], d
    assert d["new_tokens"] == 8


@pytest.mark.slow
@pytest.mark.parametrize("method", ["gptq", "awq"])
def test_gptqmodel_quality_close_to_source(converted, gptqmodel_source: Path, method: str) -> None:
    conv = converted(method)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "quantdeck.cli",
            "compare",
            str(gptqmodel_source),
            str(conv.out),
            "--json",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    q = json.loads(r.stdout)
    assert q["tokens"] == 2048
    kl_max, top1_min, ppl_ratio_max = GPTQMODEL_LIMITS[method]
    assert 0.0 <= q["kl_mean"] < kl_max, q
    assert q["top1_agreement"] > top1_min, q
    assert 1.0 < q["ppl_orig"] < 200.0, q
    assert q["ppl_quant"] / q["ppl_orig"] < ppl_ratio_max, q


@pytest.mark.slow
def test_gptqmodel_source_unchanged(
    converted, gptqmodel_source: Path, gptqmodel_source_hash: str
) -> None:
    for method in ("gptq", "awq"):
        converted(method)
    assert tree_hash(gptqmodel_source) == gptqmodel_source_hash


def _gptqmodel_temp_dirs() -> set[str]:
    return {p for p in os.listdir(tempfile.gettempdir()) if p.startswith("gptqmodel_")}


@pytest.mark.slow
def test_cancel_gptq_mid_quantization_leaves_nothing(demo_model: Path, tmp_path: Path) -> None:
    """Cancelled at the first layer event of the quantize stage: the process group is
    killed, the job's folder (GPTQModel's offloaded layers included) is removed, nothing is
    left in the system temp dir, and the source is untouched."""
    before, temp_before = tree_hash(demo_model), _gptqmodel_temp_dirs()
    cancel = threading.Event()
    seen: list[dict] = []

    def on_event(ev: Event) -> None:
        seen.append(ev.to_json())
        if isinstance(ev, ProgressEvent) and ev.stage == "quantize":
            cancel.set()

    models = tmp_path / "models"  # tmp_path also holds the test's HF cache (conftest)
    with pytest.raises(JobCancelled):
        run_job(
            QuantSpec(str(demo_model), "gptq", str(models / "demo-gptq"), samples=8, seq_len=128),
            on_event,
            cancel=cancel,
        )
    assert any(e.get("stage") == "quantize" for e in seen)
    assert not any(e.get("stage") in ("save", "verify") or e.get("event") == "done" for e in seen)
    time.sleep(0.5)
    assert not models.exists()  # no output, no temp folder, not even the folder it made
    assert not [
        p for p in tmp_path.rglob("*") if p.suffix == ".safetensors" or p.name == "config.json"
    ]
    assert _gptqmodel_temp_dirs() <= temp_before
    assert tree_hash(demo_model) == before
