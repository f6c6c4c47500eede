"""``quantdeck serve --behind-router`` on real parts: the demo served as a fleet of one behind
the real ``vllm-router`` on the serve's port; the URL answers through the router, ``fleet
status`` knows the fleet, a live trial of another knob runs against it (a paired probe: no
client needed) and decides while the URL keeps answering; SIGTERM leaves no process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from conftest import alive_pids, dies_with_pytest, read_json_lines

from quantdeck.cli.main import main
from quantdeck.core.paths import cache_dir
from quantdeck.core.runtime import free_port
from quantdeck.core.runtime.server import ONE_PROCESS_ENGINE_ENV

pytestmark = [pytest.mark.server, pytest.mark.solo]  # a live trial's verdict


def test_serve_behind_the_router_takes_a_live_trial_on_one_url(
    demo_model: Path, _session_server: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    _session_server.stop()  # two instances of our own (incumbent, candidate) on the two cores
    port = free_port()
    argv = [sys.executable, "-m", "quantdeck.cli", "serve", str(demo_model), "--enforce-eager"]
    argv += ["--kv-cache-memory-bytes", str(64 * 2**20), "--max-num-seqs", "1"]
    argv += ["--port", str(port), "--behind-router", "--json-events"]
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=dies_with_pytest(),
        env={**os.environ, **ONE_PROCESS_ENGINE_ENV},
    )
    events: list[dict[str, Any]] = []
    threading.Thread(target=read_json_lines, args=(proc, events), daemon=True).start()
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 600
        while not any(e.get("instance") == "router" and e.get("state") == "ready" for e in events):
            assert proc.poll() is None and time.monotonic() < deadline, events[-5:]
            time.sleep(0.2)
        model = httpx.get(url + "/v1/models", timeout=30).json()["data"][0]["id"]
        assert main(["fleet", "status", "--json"]) == 0
        rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
        assert rows["serve"]["knobs"]["max-num-seqs"] == 1 and rows["serve"]["state"] == "ready"
        path = cache_dir() / "fleet" / f"serve-{port}.yaml"
        code = main(
            ["fleet", "try", str(path), "serve", "--max-num-seqs", "4", "--probe"]
            + ["--min-requests", "10", "--max-duration", "30", "--json-events"]
        )
        out = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.startswith("{")]
        assert code == 0, out[-5:]
        decided = [e for e in out if e.get("phase") == "decided"]
        assert decided and decided[-1]["verdict"]["source"].startswith("the probe's "), decided
        body = {"model": model, "prompt": "Hello", "max_tokens": 4}
        r = httpx.post(url + "/v1/completions", json=body, timeout=60)
        assert r.status_code == 200  # the same URL, whatever the trial decided
        pids = {proc.pid} | {c.pid for c in psutil.Process(proc.pid).children(recursive=True)}
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0
        deadline = time.monotonic() + 30
        while alive_pids(pids) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not alive_pids(pids)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
