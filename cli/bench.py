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
    print_json,
    progress_printer,
    served_model,
)
from quantdeck.core.bench import add_load_options, load_from_options, slo_from_options
from quantdeck.core.errors import ConfigError, QuantdeckError
from quantdeck.core.launch import detect_device, profiles


def _print_ab_table(result: dict[str, Any]) -> None:
    print(
        f"{'arm':<20}{'ready s':>9}{'out tok/s':>11}{'req/s':>8}{'TTFT p50':>10}"
        f"{'TTFT p99':>10}{'TPOT p50':>10}{'roofline':>10}  kernel"
    )
    for a in result["arms"]:
        r = a.get("result") or {}
        roof = a.get("roofline") or {}
        f = lambda v, fmt=".1f": "-" if v is None else format(v, fmt)
        frac = roof.get("fraction_of_roofline")
        print(
            f"{a['label']:<20}{f(a.get('ready_s')):>9}{f(r.get('output_throughput')):>11}"
            f"{f(r.get('request_throughput'), '.2f'):>8}{f(r.get('median_ttft_ms')):>10}"
            f"{f(r.get('p99_ttft_ms')):>10}{f(r.get('median_tpot_ms'), '.2f'):>10}"
            f"{(f(frac * 100, '.0f') + '%') if frac else '-':>10}  "
            f"{(a.get('facts') or {}).get('quantization_kernel', '')}"
            + (f"  ERROR {a['error']}" if a.get("error") else "")
        )


def _print_rounds(result: dict[str, Any]) -> None:
    """Over the rounds: each arm's median and spread (min-max)."""
    summary = result.get("summary")
    if not summary:
        return
    print(f"over {result['rounds']} rounds (ABBA order): median [min-max]")
    for label, figures in summary.items():
        parts = [f"{label:<20}{figures['rounds']} rounds"]
        for key, name, fmt in (
            ("output_throughput", "out tok/s", ".1f"),
            ("median_ttft_ms", "TTFT p50 ms", ".1f"),
            ("p99_ttft_ms", "TTFT p99 ms", ".1f"),
            ("median_tpot_ms", "TPOT p50 ms", ".2f"),
        ):
            v = figures.get(key)
            if v:
                parts.append(f"{name} {v['median']:{fmt}} [{v['min']:{fmt}}-{v['max']:{fmt}}]")
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
    result["env"] = environment(result.get("server_version"))
    if ns.label:
        result["label"] = ns.label
    if not ns.no_save:
        path = save_run(result, ns.label)
        print(f"saved {path}", file=sys.stderr)
    if ns.json:
        write_result(Path(ns.json), result)
    if not ns.quiet:
        print("\n".join(summary_lines(result)))
    return stops.exit_code(0 if result["completed"] and not result.get("ended_early") else 1)


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
    result["env"] = environment(
        next((a["result"].get("server_version") for a in result["arms"] if a.get("result")), None)
    )
    result["label"] = ns.label or "ab-" + "-vs-".join(a.label for a in arms)
    path = save_run(result, result["label"])
    if ns.json:
        write_result(Path(ns.json), result)
    print(f"saved {path}", file=sys.stderr)
    _print_ab_table(result)
    _print_rounds(result)
    ok = all(a.get("result") and not a.get("error") for a in result["arms"])
    return stops.exit_code(0 if ok else 1)


def cmd_tune(ns: argparse.Namespace) -> int:
    from quantdeck.core.bench import (
        Tuner,
        apply_point,
        check_result_target,
        environment,
        parse_space,
        save_run,
        write_result,
    )
    from quantdeck.core.runtime import EngineEnv

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
    result["env"] = environment()
    result["label"] = ns.label or f"tune-{ns.strategy}"
    path = save_run(result, result["label"])
    if ns.json:
        write_result(Path(ns.json), result)
    print(f"saved {path}", file=sys.stderr)
    best = result.get("best")
    if not best:
        print("no point completed", file=sys.stderr)
        return stops.exit_code(1)
    vals = " ".join(f"{k}={v}" for k, v in best["values"].items())
    print(
        f"best: {vals}: goodput {best['goodput']:.2f} req/s, p99 TTFT "
        f"{best['p99_ttft_ms']:.0f} ms, p99 TPOT {best['p99_tpot_ms']:.1f} ms "
        f"({'meets' if best['meets'] else 'misses'} the targets); {len(result['points'])} "
        f"points in {result['seconds']:.0f} s"
    )
    if ns.save_profile:
        profiles.save_profile(ns.save_profile, apply_point(base, best["values"]))
        print(f"saved profile {ns.save_profile}", file=sys.stderr)
    return stops.exit_code(0)


def cmd_runs(ns: argparse.Namespace) -> int:
    from quantdeck.core.bench import compare, list_runs, load_run

    if ns.a and ns.b:
        rows = compare(load_run(ns.a), load_run(ns.b))
        if ns.json:
            print_json(rows)
        else:
            for r in rows:
                fmt = lambda v: (
                    "-" if v is None else (f"{v:.2f}" if isinstance(v, float) else str(v))
                )
                mark = {True: "better", False: "worse", None: ""}[r["b_better"]]
                ratio = "-" if r["ratio"] is None else f"x{r['ratio']:.3f}"
                print(f"{r['metric']:<24}{fmt(r['a']):>12}{fmt(r['b']):>12}  {ratio:>8} {mark}")
        return 0
    if ns.a:
        raise ConfigError("give two runs to compare (or none to list them)")
    rows = []
    for p in list_runs():
        try:
            r = load_run(p)
        except QuantdeckError:
            continue
        rows.append(
            {
                "file": p.name,
                "kind": r.get("kind", "bench"),
                "label": r.get("label"),
                "completed": r.get("completed"),
                "output_throughput": r.get("output_throughput"),
                "median_ttft_ms": r.get("median_ttft_ms"),
            }
        )
    if ns.json:
        print_json(rows)
    else:
        for r in rows:
            if r["kind"] != "bench":
                print(f"{r['file']:<50} {r['kind']}")
                continue
            tput, ttft = r["output_throughput"], r["median_ttft_ms"]  # None: not recorded
            print(
                f"{r['file']:<50} {r['completed']:>5} req "
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
    sp.add_argument("--ttft-ms", type=float, required=True, help="p99 TTFT target")
    sp.add_argument("--tpot-ms", type=float, required=True, help="p99 TPOT target")
    sp.add_argument(
        "--space",
        nargs="+",
        metavar="KNOB=V1,V2",
        help="candidate values, e.g. max_num_seqs=4,8,16 performance_mode=balanced,throughput "
        "speculative=none,ngram:3 (default: sized to the load and device)",
    )
    sp.add_argument("--strategy", default="coordinate", choices=["coordinate", "grid"])
    sp.add_argument("--max-points", type=int)
    sp.add_argument("--warmup", type=int, default=1)
    sp.add_argument("--save-profile", metavar="NAME", help="save the best point as a profile")
    sp.add_argument("--label")
    sp.add_argument("--json", metavar="FILE")
    sp.add_argument("--json-events", action="store_true")

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
