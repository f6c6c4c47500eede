"""Every start has a time limit (issue 43), on the real engine: `fleet up --startup-timeout S`
of one demo instance that cannot be ready in S seconds (vLLM needs 20-70 s here). The start is
``crashed`` at its limit with the reason, the restart policy applies (``no``: the fleet ends,
exit 3, one line; ``on-failure``: a restart announced, limited the same way), and nothing of
the instance is left."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import alive_pids, dies_with_pytest, read_json_lines, stop_group
from fleet_load import fleet_file_of_one

from quantdeck.core.runtime.server import ONE_PROCESS_ENGINE_ENV, free_port

pytestmark = [pytest.mark.server]

LIMIT_S = 4
REASON = f"did not become ready in {LIMIT_S} s (start-up limit)"


def _up(path: Path) -> tuple[subprocess.Popen[str], list[dict[str, Any]]]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "quantdeck.cli",
            "fleet",
            "up",
            str(path),
            "--json-events",
            "--startup-timeout",
            str(LIMIT_S),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=dies_with_pytest(),
        env={**os.environ, **ONE_PROCESS_ENGINE_ENV},
    )
    events: list[dict[str, Any]] = []
    threading.Thread(target=read_json_lines, args=(proc, events), daemon=True).start()
    return proc, events


def _states(events: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
    return [e for e in events if e.get("instance") == name and e.get("event") == "state"]


def _pids(events: list[dict[str, Any]], name: str) -> set[int]:
    return {int(e["value"]) for e in events if e.get("instance") == name and e.get("name") == "pid"}


def test_a_start_past_its_limit_is_crashed_and_the_fleet_without_restarts_ends(
    demo_model: Path, tmp_path: Path
) -> None:
    path, router_port = fleet_file_of_one(demo_model, tmp_path, restart="no")
    proc, events = _up(path)
    try:
        t0 = time.monotonic()
        code = proc.wait(timeout=120)
        took = time.monotonic() - t0
        assert proc.stderr is not None
        err = proc.stderr.read()
    finally:
        stop_group(proc)
    crashed = [e for e in _states(events, "a") if e["state"] == "crashed"]
    assert [e["reason"] for e in crashed] == [REASON], _states(events, "a")
    assert code == 3, (code, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("quantdeck: fleet: "), err
    assert "start-up limit" in lines[0], err
    assert took < 90, took  # the limit, its stop, the fleet's end: not vLLM's 20-70 s start
    assert _pids(events, "a") and alive_pids(_pids(events, "a")) == []


def test_a_restart_past_its_limit_is_crashed_as_the_first_start(
    demo_model: Path, tmp_path: Path
) -> None:
    path, _ = fleet_file_of_one(demo_model, tmp_path, restart="on-failure")
    proc, events = _up(path)
    try:
        deadline = time.monotonic() + 150
        while len([e for e in _states(events, "a") if e["state"] == "crashed"]) < 2:
            assert proc.poll() is None and time.monotonic() < deadline, events[-5:]
            time.sleep(0.2)
        restarts = [e for e in events if e.get("instance") == "a" and e.get("event") == "restart"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 0
    finally:
        stop_group(proc)
    crashed = [e for e in _states(events, "a") if e["state"] == "crashed"]
    assert [e["reason"] for e in crashed[:2]] == [REASON, REASON]
    assert restarts and restarts[0]["attempt"] == 1, restarts
    assert restarts[0]["t"] <= crashed[1]["t"]  # announced before the restart's own end
    pids = _pids(events, "a")
    assert len(pids) >= 2 and alive_pids(pids) == []


def test_serve_behind_the_router_takes_its_start_up_limit_to_the_fleet(
    demo_model: Path, tmp_path: Path
) -> None:
    """`serve --behind-router --startup-timeout S` runs its fleet of one with that limit (it
    once failed with an AttributeError: the fleet's options lacked it)."""
    argv = [sys.executable, "-m", "quantdeck.cli", "serve", str(demo_model), "--enforce-eager"]
    argv += ["--kv-cache-memory-bytes", str(64 * 2**20), "--port", str(free_port())]
    argv += ["--behind-router", "--startup-timeout", str(LIMIT_S)]
    env = {**os.environ, **ONE_PROCESS_ENGINE_ENV, "QUANTDECK_CACHE_DIR": str(tmp_path / "c")}
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=dies_with_pytest(),
        env=env,
    )
    try:
        code = proc.wait(timeout=120)
        assert proc.stderr is not None
        err = proc.stderr.read()
    finally:
        stop_group(proc)
    assert code == 3 and "Traceback" not in err, err
    assert f"quantdeck: fleet: serve: {REASON}" in err.splitlines(), err
