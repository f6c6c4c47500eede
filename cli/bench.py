"""Benchmarks: one load (bench), A/B runs, auto-tuning, the run history and reports."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from quantdeck.cli._common import (
    AddCommand,
    Progress,
    StopSignals,
    add_client_options,
    add_engine,
    add_model_and_knobs,
    client_from,
    config_from,
    engine_from,
    positive_seconds,
    print_json,
    progress_printer,
    served_model,
)
from quantdeck.core.bench import add_load_options, load_from_options, slo_from_options
from quantdeck.core.bench.results import (
    ABResult,
    BenchResult,
    LiveTuneResult,
    RunResult,
)
from quantdeck.core.errors import ConfigError, QuantdeckError
from quantdeck.core.launch import detect_device, profiles
from quantdeck.core.launch.diff import change_text, knobs_text


def _print_ab_table(result: ABResult) -> None:
    print(
        f"{'arm':<20}{'ready s':>9}{'out tok/s':>11}{'req/s':>8}{'TTFT p50':>10}"
        f"{'TTFT p99':>10}{'TPOT p50':>10}{'roofline':>10}  kernel"
    )
    for a in result.arms:
        r = a.result or BenchResult()
        f = lambda v, fmt=".1f": "-" if v is None else format(v, fmt)
        frac = a.roofline.fraction_of_roofline if a.roofline else None
        print(
            f"{a.label:<20}{f(a.ready_s):>9}{f(r.output_throughput):>11}"
            f"{f(r.request_throughput, '.2f'):>8}{f(r.median_ttft_ms):>10}"
            f"{f(r.p99_ttft_ms):>10}{f(r.median_tpot_ms, '.2f'):>10}"
            f"{(f(frac * 100, '.0f') + '%') if frac else '-':>10}  "
            f"{(a.facts or {}).get('quantization_kernel', '')}"
            + (f"  ERROR {a.error}" if a.error else "")
        )


def _print_rounds(result: ABResult) -> None:
    """Over the rounds: each arm's median and spread (min-max)."""
    if not result.summary:
        return
    print(f"over {result.rounds} rounds (ABBA order): median [min-max]")
    for label, figures in result.summary.items():
        parts = [f"{label:<20}{figures.rounds} rounds"]
        for key, name, fmt in (
            ("output_throughput", "out tok/s", ".1f"),
            ("median_ttft_ms", "TTFT p50 ms", ".1f"),
            ("p99_ttft_ms", "TTFT p99 ms", ".1f"),
            ("median_tpot_ms", "TPOT p50 ms", ".2f"),
        ):
            v = getattr(figures, key)
            if v:
                parts.append(f"{name} {v.median:{fmt}} [{v.min:{fmt}}-{v.max:{fmt}}]")
        print("  ".join(parts))


def cmd_bench(ns: argparse.Namespace) -> int:
    from quantdeck.core.bench import (
        Bench,
        check_result_target,
        environment,
        save_run,
        summary_lines,
        write_result,
    )

    if ns.json:
        check_result_target(Path(ns.json))
    client_from(ns)
    spec = load_from_options(ns)
    slo = slo_from_options(ns)
    model = served_model(ns.url, ns.api_key, ns.model)
    bench = Bench(
        ns.url,
        model,
        spec,
        api_key=ns.api_key,
        slo=slo,
        on_record=progress_printer(ns.quiet),
        resume=ns.resume_streams,
    )
    stops = StopSignals(bench.cancel)
    result = bench.run()
    result.env = environment(result.server_version)
    if ns.label:
        result.label = ns.label
    if not ns.no_save:
        path = save_run(result, ns.label)
        print(f"saved {path}", file=sys.stderr)
    if ns.json:
        write_result(Path(ns.json), result)
    if not ns.quiet:
        print("\n".join(summary_lines(result)))
    return stops.exit_code(0 if result.completed and not result.ended_early else 1)


def cmd_ab(ns: argparse.Namespace) -> int:
    from quantdeck.core.bench import (
        ABRun,
        check_result_target,
        environment,
        parse_arm,
        save_run,
        write_result,
    )
    from quantdeck.core.runtime import EngineEnv

    if ns.json:
        check_result_target(Path(ns.json))
    base = config_from(ns)
    arms = [parse_arm(a, base) for a in ns.arm or []]
    run = ABRun(
        arms,
        load_from_options(ns),
        slo=slo_from_options(ns),
        warmups=ns.warmup,
        engine=EngineEnv(engine_from(ns)),
        on_event=Progress(ns.json_events),
        rounds=ns.rounds,
    )
    stops = StopSignals(run.cancel)
    result = run.run()
    result.env = environment(
        next((a.result.server_version for a in result.arms if a.result is not None), None)
    )
    result.label = ns.label or "ab-" + "-vs-".join(a.label for a in arms)
    path = save_run(result, result.label)
    if ns.json:
        write_result(Path(ns.json), result)
    print(f"saved {path}", file=sys.stderr)
    _print_ab_table(result)
    _print_rounds(result)
    ok = all(a.result is not None and not a.error for a in result.arms)
    return stops.exit_code(0 if ok else 1)


def cmd_tune(ns: argparse.Namespace) -> int:
    from quantdeck.core.bench import (
        Tuner,
        apply_point,
        check_result_target,
        environment,
        parse_space,
        save_run,
        text_of,
        write_result,
    )
    from quantdeck.core.runtime import EngineEnv

    if ns.live:
        return _tune_live(ns)
    _refuse_given(ns, ns.live_only, "only with `tune --live FILE INSTANCE`")
    if ns.ttft_ms is None or ns.tpot_ms is None:
        raise ConfigError("tune needs latency targets: --ttft-ms and --tpot-ms")
    if ns.json:
        check_result_target(Path(ns.json))
    base = config_from(ns)
    spec = load_from_options(ns)
    space = parse_space(ns.space, detect_device(), spec.concurrency)
    tuner = Tuner(
        base,
        spec,
        ttft_ms=ns.ttft_ms,
        tpot_ms=ns.tpot_ms,
        space=space,
        strategy=ns.strategy,
        max_points=ns.max_points,
        warmups=ns.warmup,
        engine=EngineEnv(engine_from(ns)),
        on_event=Progress(ns.json_events),
    )
    stops = StopSignals(tuner.cancel)
    result = tuner.run()
    result.env = environment()
    result.label = ns.label or f"tune-{ns.strategy}"
    path = save_run(result, result.label)
    if ns.json:
        write_result(Path(ns.json), result)
    print(f"saved {path}", file=sys.stderr)
    best = result.best
    if not best:
        print("no point completed", file=sys.stderr)
        return stops.exit_code(1)
    vals = " ".join(f"{k}={text_of(v)}" for k, v in best.values.items())
    print(
        f"best: {vals}: goodput {best.goodput or 0:.2f} req/s, p99 TTFT "
        f"{best.p99_ttft_ms or 0:.0f} ms, p99 TPOT {best.p99_tpot_ms or 0:.1f} ms "
        f"({'meets' if best.meets else 'misses'} the targets); {len(result.points)} "
        f"points in {result.seconds or 0:.0f} s"
    )
    if ns.save_profile:
        profiles.save_profile(ns.save_profile, apply_point(base, best.values))
        print(f"saved profile {ns.save_profile}", file=sys.stderr)
    return stops.exit_code(0)


def _refuse_given(ns: argparse.Namespace, options: dict[str, tuple[str, Any]], why: str) -> None:
    """Refused in one line (exit 2): an option of ``options`` (``{dest: (flag, default)}``)
    given a value other than its default."""
    given = [f for dest, (f, default) in options.items() if getattr(ns, dest, default) != default]
    if given:
        raise ConfigError(f"tune: {', '.join(given)}: {why}")


def _tune_live(ns: argparse.Namespace) -> int:
    """``tune --live FILE INSTANCE``: the tuner's coordinate search as a chain of live trials
    of the instance on the running fleet (each as ``fleet try`` runs it), winners promoted."""
    from quantdeck.cli.fleet import running_instance, trial_options, trial_printer
    from quantdeck.core.bench import LiveTuner, TrialOutcome, parse_space
    from quantdeck.core.bench.live_tune import carried_out
    from quantdeck.core.events import Event
    from quantdeck.core.fleet.control import ABORTED_CODE, request_trial
    from quantdeck.core.launch import LaunchConfig, knobs

    _refuse_given(
        ns,
        ns.offline_only,
        "not with --live: the chain tries the instance's running launch (one knob of --space "
        "changed) on the fleet's own traffic",
    )
    ns.file, ns.instance = ns.live
    opts = trial_options(ns)
    space = parse_space(ns.space, detect_device(), None)
    until = parse_until(ns.until) if ns.until is not None else None
    show = trial_printer(ns.json_events, logs=False)

    def on_event(ev: Event) -> None:
        show(ev.to_json())

    tuner = LiveTuner(space, budget=ns.budget, budget_s=ns.budget_s, until=until, on_event=on_event)
    state, _row = running_instance(ns)  # refused up front: no fleet, no such instance
    control = [str(state["control"])]
    deciding: list[Any] = []  # the running trial's decide(), for a stop signal's rollback

    def launch() -> LaunchConfig:
        state, row = running_instance(ns)
        control[0] = str(state["control"])
        return knobs.from_dict(row["knobs"], where="the fleet")

    def trial(cfg: LaunchConfig) -> TrialOutcome:
        try:
            reply = request_trial(control[0], ns.instance, cfg, opts, show, on_open=deciding.append)
        except OSError as e:
            return TrialOutcome("failed", f"the fleet's control socket: {e.strerror or e}")
        finally:
            deciding.clear()
        if reply.code == 2:
            return TrialOutcome("refused", reply.error or "refused")
        done = reply.code in (0, ABORTED_CODE)  # (3: forced by an arm's failure)
        if not done or reply.result not in ("promoted", "rolled back"):
            return TrialOutcome("failed", reply.error or f"the trial ended {reply.result}")
        return carried_out(str(reply.result), reply.decided)

    def stop() -> None:
        tuner.cancel()
        for decide in list(deciding):
            decide("rollback")

    stops = StopSignals(stop)
    result = tuner.run(launch, trial)
    if not ns.json_events:
        _print_live_summary(ns.instance, result)
    return stops.exit_code(1 if result.failed else 0)


def parse_until(text: str) -> dict[str, float]:
    """``--until``'s limits, written as ``--slo``'s (``'ttft_p99<=200ms'``): refused in one line
    that names ``--until``."""
    from quantdeck.core.bench.live_tune import check_until
    from quantdeck.core.fleet.trial import parse_slo

    try:
        return check_until(parse_slo(text))
    except ConfigError as e:
        raise ConfigError(str(e).replace("--slo", "--until", 1)) from None


def _print_live_summary(instance: str, result: LiveTuneResult) -> None:
    """Each trial's knob change, what became of it and why; whether the goal was met; the
    launch as it runs now."""
    trials = result.trials
    ran = [t for t in trials if t.ran]
    won = sum(1 for t in trials if t.result == "promoted")
    print(
        f"\ntune --live {instance}: {len(ran)} trial{'' if len(ran) == 1 else 's'} in "
        f"{result.seconds or 0:.0f} s, {won} promoted, {len(trials) - len(ran)} not run; "
        f"ended: {result.ended}"
    )
    for t in trials:
        change = change_text(t.knobs)
        decision = f"{t.decision}: " if t.decision else ""
        print(f"  {t.step:>2}  {change:<32} {t.result:<12} {decision}{t.reason}")
    if result.until:
        from quantdeck.core.bench.live_tune import until_text

        goal = until_text(result.until)
        if result.goal_met:
            print(f"goal {goal}: met by trial {result.met_by}")
        else:
            print(f"goal {goal}: not met (no promoted launch met every limit)")
    changed = change_text(result.changed)
    launch = knobs_text(result.launch, sep=" ")
    print(f"final launch of {instance}: {launch}")
    print(f"changed by the chain: {changed or 'nothing'}")


def _listed_json(name: str, run: RunResult) -> dict[str, Any]:
    """A saved run as ``runs --json`` lists it: its file, kind and label, and a bench run's
    figures (None for another kind)."""
    bench = run if isinstance(run, BenchResult) else BenchResult()
    return {
        "file": name,
        "kind": run.kind,
        "label": run.name,
        "completed": bench.completed,
        "output_throughput": bench.output_throughput,
        "median_ttft_ms": bench.median_ttft_ms,
    }


def cmd_runs(ns: argparse.Namespace) -> int:
    from quantdeck.core.bench import compare, list_runs, load_run

    if ns.a and ns.b:
        rows = compare(load_run(ns.a), load_run(ns.b))
        if ns.json:
            print_json([r.to_json() for r in rows])
        else:
            for r in rows:
                fmt = lambda v: (
                    "-" if v is None else (f"{v:.2f}" if isinstance(v, float) else str(v))
                )
                mark = {True: "better", False: "worse", None: ""}[r.b_better]
                ratio = "-" if r.ratio is None else f"x{r.ratio:.3f}"
                print(f"{r.metric:<24}{fmt(r.a):>12}{fmt(r.b):>12}  {ratio:>8} {mark}")
        return 0
    if ns.a:
        raise ConfigError("give two runs to compare (or none to list them)")
    listed: list[tuple[str, RunResult]] = []
    for p in list_runs():
        try:
            listed.append((p.name, load_run(p)))
        except QuantdeckError:
            continue
    if ns.json:
        print_json([_listed_json(name, run) for name, run in listed])
        return 0
    for name, run in listed:
        if not isinstance(run, BenchResult):
            print(f"{name:<50} {run.kind}")
            continue
        tput, ttft = run.output_throughput, run.median_ttft_ms  # None: not recorded
        print(
            f"{name:<50} {run.completed:>5} req "
            f"{'-' if tput is None else format(tput, '.1f'):>9} tok/s "
            f"TTFT p50 {'-' if ttft is None else format(ttft, '.1f')} ms"
        )
    return 0


def cmd_report(ns: argparse.Namespace) -> int:
    from quantdeck.core.bench import load_run
    from quantdeck.gui.report import write_report  # charts are drawn with pyqtgraph

    runs = [load_run(f) for f in ns.runs]
    extra: dict[str, Any] = {}
    if ns.recording:  # the tuning timeline's comparison, where the recordings hold markers
        from quantdeck.cli.timeline import load_comparison

        timeline, cmp = load_comparison(ns.recording)
        if timeline.markers:
            extra = {"comparison": cmp, "markers": timeline.markers}
    out = write_report(runs, Path(ns.out), **extra)
    print(out)
    return 0


def register(add: AddCommand) -> None:
    sp = add("bench", cmd_bench, "measure a running server under load (as `vllm bench serve`)")
    sp.add_argument("url", help="the server's base URL, e.g. http://127.0.0.1:8000")
    sp.add_argument("--model", help="served model name (default: the only one served)")
    add_client_options(sp)
    add_load_options(sp)
    sp.add_argument("--label", help="name of this run in the history")
    sp.add_argument("--json", metavar="FILE", help="also write the result here")
    sp.add_argument("--no-save", action="store_true", help="do not add it to the run history")
    sp.add_argument("--quiet", action="store_true")
    sp.add_argument(
        "--resume-streams",
        type=int,
        default=0,
        metavar="N",
        help="continue a request whose stream is cut (lost connection, a router's 5xx) up to N "
        "times: sent again with what arrived appended to its prompt, as a fleet's client "
        "would; counted as resumed (default 0: such a request fails, as in vllm bench serve)",
    )

    sp = add("ab", cmd_ab, "one load against several launch configs in turn (A/B)")
    add_model_and_knobs(sp)
    add_engine(sp, "serves every arm")
    sp.add_argument(
        "--arm",
        action="append",
        metavar="LABEL=OPTIONS",
        required=True,
        help="an arm: the base config with these options on top (a model path, "
        "--profile NAME, knobs), e.g. --arm eager=--enforce-eager --arm graphs=--no-enforce-eager",
    )
    add_load_options(sp, with_knobs=True)
    sp.add_argument("--warmup", type=int, default=2, help="warm-up requests per arm")
    sp.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run the arms this many times, every other round in reverse (ABBA: A B B A "
        "for 2); prints each arm's median and spread over its rounds",
    )
    sp.add_argument("--label")
    sp.add_argument("--json", metavar="FILE")
    sp.add_argument("--json-events", action="store_true")

    sp = add("tune", cmd_tune, "search launch knobs for the most goodput under latency targets")
    add_model_and_knobs(sp)
    add_engine(sp, "serves every point")
    add_load_options(sp, with_knobs=True, slo=False)
    sp.add_argument("--ttft-ms", type=float, help="p99 TTFT target (required, but with --live)")
    sp.add_argument("--tpot-ms", type=float, help="p99 TPOT target (required, but with --live)")
    sp.add_argument(
        "--space",
        nargs="+",
        action="extend",
        metavar="KNOB=V1,V2",
        help="candidate values, e.g. max_num_seqs=4,8,16 enforce_eager=true,false "
        "performance_mode=balanced,throughput speculative=none,ngram:3; any knob that changes "
        "how the engine serves (cache, scheduler, performance, compilation, parallel; dtype, "
        "max_model_len), or vllm:NAME=V1,V2 for another option of the engine, read as "
        "--vllm-arg NAME=VALUE reads it. Repeat --space to add knobs; a knob named twice is "
        "refused (default: sized to the load and device)",
    )
    sp.add_argument("--strategy", default="coordinate", choices=["coordinate", "grid"])
    sp.add_argument("--max-points", type=int)
    sp.add_argument("--warmup", type=int, default=1)
    sp.add_argument("--save-profile", metavar="NAME", help="save the best point as a profile")
    sp.add_argument("--label")
    sp.add_argument("--json", metavar="FILE")
    sp.add_argument("--json-events", action="store_true")
    _add_tune_live(sp)

    sp = add("runs", cmd_runs, "list saved benchmark runs, or compare two")
    sp.add_argument("a", nargs="?", help="run file (or its name in the history)")
    sp.add_argument("b", nargs="?")
    sp.add_argument("--json", action="store_true")

    sp = add("report", cmd_report, "an HTML report with PNG charts of saved runs")
    sp.add_argument("runs", nargs="+", help="run files (bench, ab or tune results)")
    sp.add_argument("--out", default="quantdeck-report", help="output folder")
    sp.add_argument(
        "--recording",
        action="append",
        metavar="FILE",
        help="add the tuning timeline of these recordings (as quantdeck timeline shows it)",
    )


def _add_tune_live(sp: argparse.ArgumentParser) -> None:
    """``tune --live FILE INSTANCE`` and its options; the other options of ``tune`` (the model,
    its knobs, the load, the offline search's) are refused beside it, and these without it."""
    from quantdeck.cli.fleet import add_trial_options

    offline = {a.dest: a for a in sp._actions if a.dest != "help"}
    g = sp.add_argument_group(
        "tune --live FILE INSTANCE",
        "The search as a chain of live trials on the running fleet, each as `fleet try` runs "
        "it: the instance's running launch with one knob of --space changed, beside it on the "
        "operator's traffic; a winner is promoted and the next candidates change it. A refused "
        "candidate (it does not fit) is skipped. Ends when the space is exhausted, at the "
        "budget or at the goal (--until); exit 0 once the chain ran, 2 when refused before it "
        "started.",
    )
    g.add_argument(
        "--live",
        nargs=2,
        metavar=("FILE", "INSTANCE"),
        help="tune instance INSTANCE of the fleet running from FILE, without downtime",
    )
    add_trial_options(g)
    g.add_argument(
        "--budget", type=int, metavar="N", help="the most trials run (refused ones not counted)"
    )
    g.add_argument(
        "--budget-s", type=positive_seconds, metavar="S", help="no trial starts after S seconds"
    )
    g.add_argument(
        "--until",
        metavar="LIMITS",
        help="the goal, written as --slo: e.g. 'ttft_p99<=200ms,itl_p99<=50ms' (p50 or p99 of "
        "ttft, itl, e2e): the chain stops once a promoted launch meets every limit, read on "
        "its figures in the trial that promoted it",
    )
    live_only = {a.dest: a for a in sp._actions if a.dest not in (*offline, "help", "live")}
    both = ("space", "json_events")
    sp.set_defaults(
        offline_only={
            d: (a.option_strings[0] if a.option_strings else "a model folder", a.default)
            for d, a in offline.items()
            if d not in both
        },
        live_only={d: (a.option_strings[0], a.default) for d, a in live_only.items()},
    )
