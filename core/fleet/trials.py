"""The fleet's live trials: one at a time, admitted against the planner's figures, promoted
(the incumbent retired: asleep for an instant undo where it runs with sleep mode, else
stopped, its launch kept) or rolled back; ``fleet undo``. A part of
:class:`~quantdeck.core.fleet.supervisor.Fleet`."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from quantdeck.core.errors import ConfigError, QuantdeckError, ServerError
from quantdeck.core.events import (
    Event,
    InstanceEvent,
    Publisher,
)
from quantdeck.core.fleet.live import LiveTrial, drain
from quantdeck.core.fleet.live import sleep as sleep_server
from quantdeck.core.fleet.liveness import (
    tree_pids,
)
from quantdeck.core.fleet.rows import launch_knobs
from quantdeck.core.fleet.spec import (
    CPU_BIND_ENV,
    FleetSpec,
    InstanceSpec,
    admit_candidate,
    is_fleet_of_one,
    spare_cpus,
)
from quantdeck.core.fleet.tending import _Tended
from quantdeck.core.fleet.trial import TrialOptions
from quantdeck.core.launch import LaunchConfig, validate
from quantdeck.core.launch.diff import change_text, knob_diff, knobs_text, live_candidate
from quantdeck.core.launch.knobs import to_yaml
from quantdeck.core.paths import write_atomic
from quantdeck.core.runtime import ServerProcess

log = logging.getLogger("quantdeck.core.fleet.supervisor")

RETIRED = "~before"  # a retired (sleeping) incumbent's events: instance NAME~before


@dataclass
class Retired:
    """An instance's launch before its last promotion, kept for ``fleet undo``: its server
    asleep (sleep mode, until ``until``) for a wake-up, or only its launch, to start again."""

    cfg: LaunchConfig
    promotion: str  # what was promoted over it (the knob diff, one line)
    server: ServerProcess | None = None
    until: float = 0.0  # (monotonic) the sleeper is stopped then
    slept_s: float | None = None  # how long it took to fall asleep
    residual: dict[int, int] | None = None  # GPU index -> bytes it holds asleep (NVML)


class FleetTrials:
    """The trials' side of the fleet (a part of ``Fleet``: the names below are the fleet's)."""

    spec: FleetSpec
    servers: dict[str, ServerProcess]
    retired: dict[str, Retired]
    trial: LiveTrial | None
    nice: int
    startup_timeout: float | None
    _trial_lock: threading.Lock
    _tended: dict[str, _Tended]
    _events: Publisher[Event]
    _forwards: dict[int, Callable[[], None]]
    _routed: set[str]
    _router_ready: threading.Event

    def _save_state(self) -> None:
        raise NotImplementedError  # the fleet's: its state file written again

    # -- live trials ---------------------------------------------------------------------------
    def start_trial(self, name: str, cfg: LaunchConfig, opts: TrialOptions) -> LiveTrial:
        """Admit and start a live trial of instance ``name`` against ``cfg`` (its events come
        as the instance's): refused (ConfigError, one line, nothing started) when another trial
        runs, the instance is not a local primary that serves, or the candidate does not fit
        beside the fleet (the planner's figures)."""
        with self._trial_lock:
            if self.trial is not None and not self.trial.done.is_set():
                raise ConfigError(f"a trial of '{self.trial.name}' is under way: one at a time")
            inst = next((i for i in self.spec.instances if i.name == name), None)
            if inst is None:
                names = ", ".join(i.name for i in self.spec.instances)
                raise ConfigError(f"no instance '{name}' in this fleet (it has {names})")
            if inst.cfg is None or inst.role != "primary":
                raise ConfigError(
                    f"instance '{name}': a trial is of a primary that Quantdeck starts"
                )
            if self.servers[name].state != "ready" or not self._router_ready.is_set():
                raise ConfigError(f"instance '{name}' does not serve now: try it once it does")
            cfg = validate(cfg.copy())
            changed = {k for k in knob_diff(inst.cfg, live_candidate(inst.cfg, cfg)) if k != "port"}
            if not changed:  # as A/B refuses identical arms: a restart to compare it with itself
                running = knobs_text(launch_knobs(inst.cfg)) or "vLLM's defaults"
                raise ConfigError(
                    f"the candidate changes no knob of '{name}' (it runs {running}): "
                    "a trial would compare the instance with itself; change a knob to try"
                )
            admitted = admit_candidate(self.spec, inst, cfg, asleep=self._asleep())
            trial = self._trial(inst, cfg, opts)
        trial.start(admitted)
        return trial

    def _trial(
        self, inst: InstanceSpec, cfg: LaunchConfig, opts: TrialOptions, **kw: Any
    ) -> LiveTrial:
        if inst.cpus is None and inst.gpus is None and CPU_BIND_ENV not in os.environ:
            # the candidate's CPU engine on the cores the incumbent's is not bound to
            kw.setdefault("cpus", spare_cpus(self.servers[inst.name].pid))
        trial = LiveTrial(
            inst,
            cfg,
            opts,
            emit=self._events.emit,
            promote=self._promote,
            routed_now=lambda url: url in self._routed,
            nice=self.nice,
            startup_timeout=self.startup_timeout,
            **kw,
        )
        self.trial = trial
        return trial

    def _asleep(self) -> dict[int, list[tuple[str, int]]]:
        """The sleeping retired incumbents' GPU memory (NVML, when they fell asleep), per GPU:
        what a candidate's admission counts beside the fleet."""
        held: dict[int, list[tuple[str, int]]] = {}
        for name, r in self.retired.items():
            if r.server is not None:
                for gpu, used in (r.residual or {}).items():
                    held.setdefault(gpu, []).append((name + RETIRED + " (asleep)", used))
        return held

    def undo(self, name: str) -> LiveTrial:
        """Undo the last promotion of instance ``name``: its launch from before back without
        downtime, as a trial that promotes as soon as it serves: woken up where it sleeps
        (seconds), else started beside the instance (a start-up). Refused (ConfigError, one
        line) when a trial runs or nothing was promoted."""
        with self._trial_lock:
            if self.trial is not None and not self.trial.done.is_set():
                raise ConfigError(f"a trial of '{self.trial.name}' is under way: one at a time")
            inst = next((i for i in self.spec.instances if i.name == name), None)
            before = self.retired.get(name)
            if inst is None or inst.cfg is None or before is None:
                raise ConfigError(f"instance '{name}' has no promotion to undo in this fleet")
            if self.servers[name].state != "ready" or not self._router_ready.is_set():
                raise ConfigError(f"instance '{name}' does not serve now: undo it once it does")
            asleep = before.server
            if asleep is not None and asleep.state == "ready":
                admitted = f"the launch before ({before.promotion}) sleeps: a wake-up"
                self._forwards.pop(id(asleep), lambda: None)()  # the trial forwards it now
            else:
                asleep = None
                admitted = admit_candidate(self.spec, inst, before.cfg, asleep=self._asleep())
            del self.retired[name]
            opts = TrialOptions(keep_s=self._keep_s)
            trial = self._trial(
                inst,
                before.cfg,
                opts,
                undo=f"undo of the promotion ({before.promotion})",
                asleep=asleep,
            )
        trial.start(admitted)
        return trial

    def _promote(self, trial: LiveTrial) -> str:
        """The candidate becomes the instance: the incumbent out of the router, drained and
        stopped; the instance's launch is the candidate's from now (restarts included) and its
        profile is saved. Returns where it was saved (one line)."""
        inst, t = trial.inst, self._tended[trial.name]
        old, old_url = t.server, inst.url
        trial.retiring = True
        if trial.wait_routes(old_url, False):
            drain(old_url, inst.api_key, trial.opts.drain_timeout_s)
        with self._trial_lock:
            inst.cfg = trial.server.cfg.copy()
            t.server = self.servers[trial.name] = trial.server
            t.up_since, t.crashes, t.crash_seen, t.restart_at = None, 0, False, None
            t.hung_since = None
            trial.label = trial.name  # its events are the instance's from now
            trial.routed = trial.retiring = False  # its URL is the instance's: a primary's
            self._forwards[id(trial.server)] = trial.forward
        self._keep_s = trial.opts.keep_s
        if trial.undo is not None:  # an undo is not undone in turn: Undo is off once used
            old.stop()
            kept = "the promoted launch stopped"
        else:
            kept = self._retire(trial, old)
        saved = "; ".join(x for x in (self._save_profile(inst, trial), kept) if x)
        self._save_state()
        return saved

    _keep_s = TrialOptions().keep_s  # the last trial's: an undo keeps what it retires as long

    def _retire(self, trial: LiveTrial, old: ServerProcess) -> str:
        """The promoted-over incumbent, kept for ``fleet undo``: asleep for ``keep_s`` where
        it runs with sleep mode (its events become instance ``NAME~before``), else stopped
        (its launch kept). One line saying which."""
        name = trial.name
        diff = change_text(trial.knobs) or "the same knobs"
        earlier = self.retired.pop(name, None)
        if earlier is not None and earlier.server is not None:
            earlier.server.stop()  # one launch kept per instance: the last one
        before = Retired(trial.incumbent_cfg.copy(), diff)
        self.retired[name] = before
        keep = trial.opts.keep_s
        if not old.cfg.model.enable_sleep_mode:
            why = "it runs without sleep mode"
        elif keep <= 0:
            why = "--keep 0"
        else:
            try:
                slept = sleep_server(old.url, old.cfg.server.api_key)
            except ServerError as e:
                why = f"it did not sleep: {e}"
            else:
                self._forwards.pop(id(old), lambda: None)()
                self._forwards[id(old)] = old.subscribe(
                    lambda ev: self._events.emit(InstanceEvent(name + RETIRED, ev))
                )
                before.server, before.slept_s = old, slept
                before.until = time.monotonic() + keep
                before.residual = _gpu_memory(old, trial.inst.gpus or [])
                held = ", ".join(
                    f"{b / 2**30:.2f} GiB of GPU {g}" for g, b in (before.residual or {}).items()
                )
                return (
                    f"the launch before sleeps for {keep:g} s (asleep in {slept:.1f} s"
                    f"{', holding ' + held if held else ''}): undo wakes it up"
                )
        old.stop()
        return f"the launch before stopped ({why}): undo starts it again"

    def _expire(self, now: float) -> None:
        """Stop the sleepers whose time is up (their launch stays, for an undo by start)."""
        for r in self.retired.values():
            if r.server is not None and now >= r.until:
                server, r.server = r.server, None
                threading.Thread(target=server.stop, name="fleet-stop-retired").start()

    def _save_profile(self, inst: InstanceSpec, trial: LiveTrial) -> str:
        """The promoted launch saved: over the instance's profile file (atomically; the one
        before kept beside it), or beside the fleet file when its profile is inline (the fleet
        file is never rewritten); a fleet of one made from a launch (``serve --behind-router``,
        the Launch tab) keeps it while it runs, no file asked of the operator. One line
        saying where ("" for the fleet of one)."""
        if inst.profile_file is None and is_fleet_of_one(self.spec.path):
            return ""
        cfg = trial.server.cfg.copy()
        cfg.server.port = trial.incumbent_cfg.server.port  # the port the fleet gives it
        try:
            version = trial.server.engine.version()[1]
            text = f"# saved with vLLM {version}\n" + to_yaml(cfg)
        except QuantdeckError:
            text = to_yaml(cfg)
        stamp = time.strftime("%Y%m%d-%H%M%S")
        try:
            if inst.profile_file is not None:
                path = inst.profile_file
                kept = path.with_name(f"{path.name}.before-trial-{stamp}")
                private = path.stat().st_mode & 0o077 == 0
                write_atomic(kept, path.read_text(encoding="utf-8"), replace=False)
                write_atomic(path, text, private=private)
                return f"saved over its profile {path} (the one before: {kept})"
            path = self.spec.path.with_name(f"{self.spec.path.stem}.{inst.name}.{stamp}.yaml")
            write_atomic(path, text, replace=False)
        except OSError as e:
            return f"it serves, but was not saved: {e}"
        return (
            f"saved as {path} (the fleet file has '{inst.name}' inline and is left as it is: "
            "name this file as its profile to keep it)"
        )


def _gpu_memory(server: ServerProcess, gpus: list[int]) -> dict[int, int] | None:
    """What ``server``'s processes hold on each of ``gpus`` (NVML); None without NVML."""
    from quantdeck.core.monitor.telemetry import read_gpu

    pids = tree_pids(server.pid)
    held: dict[int, int] = {}
    for g in gpus:
        used = read_gpu(g, frozenset(pids)).server_memory_bytes
        if isinstance(used, int):
            held[g] = used
    return held or None
