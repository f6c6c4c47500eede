"""Conversion jobs: supervised subprocesses, verify-then-rename, cancel leaves nothing, queue."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core.errors import ConfigError, ModelError
from core.model_info import inspect_model
from core.quant_jobs import JobQueue, QuantSpec, run_job

ROOT = Path(__file__).resolve().parents[1]


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
    r = subprocess.run([sys.executable, "-m", "core.cli", "quantize", str(demo_model),
                        "--method", "fp8", "--out", str(out), "--json-events"], cwd=ROOT,
                       capture_output=True, text=True, timeout=600)
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
    assert tree_hash(demo_model) == before
    assert _leftovers(tmp_path) == []


def test_refusals_before_any_process(demo_model: Path, tmp_path: Path) -> None:
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "x").write_text("x")
    with pytest.raises(ConfigError, match="exists and is not empty"):
        QuantSpec(str(demo_model), "w8a8", str(busy)).check()
    with pytest.raises(ConfigError, match="not one of"):
        QuantSpec(str(demo_model), "int3", str(tmp_path / "o")).check()
    with pytest.raises(ModelError, match="no such folder"):
        QuantSpec(str(tmp_path / "nope"), "fp8", str(tmp_path / "o")).check()
    r = subprocess.run([sys.executable, "-m", "core.cli", "quantize", str(tmp_path / "nope"),
                        "--method", "fp8", "--out", str(tmp_path / "o")], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
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
    assert not any(e.get("state") == "running" for e in second.events)
    time.sleep(0.5)
    assert sorted(os.listdir(tmp_path)) == []  # no output, no temp folder
    assert tree_hash(demo_model) == before
    q.close()


@pytest.mark.server
@pytest.mark.parametrize("method, kernel", [
    ("fp8", "CompressedTensorsW8A8Fp8"),
    ("w8a8", "CompressedTensorsW8A8Int8"),
    ("bnb-nf4", None),
    ("bnb-int8", None),
])
def test_converted_models_serve_on_vllm_cpu(demo_server, demo_model: Path, tmp_path: Path,
                                            method: str, kernel: str | None) -> None:
    """Each format vllm-cpu has kernels for loads in the real server and answers; the log names
    the quantization method class vLLM chose. The session server steps aside meanwhile."""
    import httpx

    from core.config import LaunchConfig
    from core.server import ServerProcess, free_port

    out = tmp_path / f"demo-{method}"
    run_job(QuantSpec(str(demo_model), method, str(out)))
    demo_server.stop()
    cfg = LaunchConfig()
    cfg.model.model = str(out)
    cfg.compilation.enforce_eager = True
    cfg.cache.kv_cache_memory_bytes = 64 * 2**20
    cfg.server.port = free_port()
    srv = ServerProcess(cfg, capabilities=demo_server.capabilities(),
                        run_dir=tmp_path / "run")
    try:
        srv.start()
        assert srv.wait_ready(420), "\n".join(list(srv.log_tail)[-30:])
        r = httpx.post(srv.url + "/v1/completions", timeout=120, json={
            "model": srv.served_name, "prompt": "The class definition is", "max_tokens": 8,
            "temperature": 0})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 8
        assert r.json()["choices"][0]["text"].strip()
        log = srv.log_path.read_text()
        if kernel:
            assert srv.facts.get("quantization_method_class") == kernel or kernel in log
        else:
            assert "bitsandbytes" in log.lower()
    finally:
        srv.stop()
        demo_server.start()
        assert demo_server.wait_ready(420)
