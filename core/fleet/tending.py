"""The fleet's care of its local instances: a crash counted and its restart planned (with
back-off), the liveness verdicts told and acted on (core.fleet.liveness: hung is no progress,
not a slow answer), a start under way told with its limit, a trial's ownership of its arms.
A part of :class:`~quantdeck.core.fleet.supervisor.Fleet` (its loop calls :meth:`_tend`)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from quantdeck.core.errors import QuantdeckError
from quantdeck.core.events import (
    Event,
    FactEvent,
    InstanceEvent,
    Publisher,
    RestartEvent,
    StateEvent,
)
from quantdeck.core.fleet.live import LiveTrial
from quantdeck.core.fleet.liveness import (
    DEGRADED,
    HUNG,
    OK,
    Judgement,
    Liveness,
)
from quantdeck.core.fleet.rows import STARTING_FACT
from quantdeck.core.fleet.spec import FleetSpec, InstanceSpec
from quantdeck.core.runtime import ServerProcess

log = logging.getLogger("quantdeck.core.fleet.supervisor")

# restart: on-failure, as systemd's RestartSec with back-off: the delay before each attempt in a
# row; an instance that crashed more than RESTART_LIMIT times in a row, never staying up
# STABLE_S, is given up (systemd's StartLimitBurst).
RESTART_DELAYS = (1.0, 2.0, 4.0, 8.0, 16.0, 30.0)
RESTART_LIMIT = 5
STABLE_S = 60.0
# a hung instance is out of the router at once (unless it is the last that serves), restarted
# (restart: on-failure) after HUNG_GRACE_S more unless it came back; a degraded one (slow)
# stays routed
HUNG_GRACE_S = 10.0
STARTING_EVERY_S = 10.0  # a start under way is told this often (stage, time, limit)
# a stop of a hung or crashed instance: each signal waits this long (a stopped process gets
# SIGCONT after each, so that it can act on it)
HUNG_STOP_S = 2.0


@dataclass
class _Tended:
    """What the fleet's loop knows of one local instance besides its server's state."""

    spec: InstanceSpec
    server: ServerProcess
    crashes: int = 0  # in a row, without staying up STABLE_S
    crash_seen: bool = False
    restart_at: float | None = None
    up_since: float | None = None
    action: threading.Thread | None = None  # a stop and start, off the fleet's loop
    # liveness: fed and judged by the watcher thread, acted on by the loop (monotonic times)
    live: Liveness | None = None  # since it was last ready
    said: str = OK  # the verdict the fleet last told (ok, degraded, hung)
    told_at: float = 0.0  # a start under way last told then
    hung_since: float | None = None
    hung_why: str = ""

    @property
    def acting(self) -> bool:
        return self.action is not None and self.action.is_alive()


class InstanceTending:
    """The instances' side of the fleet's loop (a part of ``Fleet``: the names below are
    the fleet's)."""

    spec: FleetSpec
    trial: LiveTrial | None
    _tended: dict[str, _Tended]
    _events: Publisher[Event]
    _stopping: bool

    def _serving(self, inst: InstanceSpec) -> bool:
        raise NotImplementedError  # the router keeper's

    def _instance_event(self, t: _Tended, ev: Event) -> None:
        self._events.emit(InstanceEvent(t.spec.name, ev))

    def _act(self, t: _Tended, what: str, fn: Callable[[], None]) -> None:
        """Run ``fn`` (a stop and a start) in the instance's own thread; a start refused
        (a port taken meanwhile...) is a crash like another."""

        def body() -> None:
            try:
                fn()
            except QuantdeckError as e:
                self._instance_event(t, StateEvent("crashed", reason=str(e)))
            except Exception as e:  # a bug: said, and the loop goes on
                log.exception("%s of %s failed", what, t.spec.name)
                self._instance_event(t, StateEvent("crashed", reason=f"{what} failed: {e}"))

        t.action = threading.Thread(target=body, name=f"fleet-{what}-{t.spec.name}", daemon=True)
        t.action.start()

    def _count_crash(self, t: _Tended, now: float) -> None:
        """A crash (or a hang) counted; the restart planned with back-off, or given up."""
        t.crashes += 1
        gave_up = t.crashes > RESTART_LIMIT
        delay = RESTART_DELAYS[min(t.crashes, len(RESTART_DELAYS)) - 1]
        t.restart_at = None if gave_up else now + delay
        self._instance_event(t, RestartEvent(t.crashes, 0.0 if gave_up else delay, gave_up=gave_up))

    def _tend(self, t: _Tended, now: float) -> None:
        """One look at an instance (no waiting: stops and starts run in its own thread): a
        crash counted and its restart planned, a hang noticed, a restart due started, a stay
        long enough to forgive the earlier crashes."""
        if t.acting:
            return
        state = t.server.state
        if state == "ready":
            if t.up_since is None:  # just up: its liveness is counted from now
                t.up_since, t.live, t.said = now, Liveness(now), OK
            if now - t.up_since >= STABLE_S and t.hung_since is None:
                t.crashes = 0
            self._judge_liveness(t, now)
        else:
            t.hung_since, t.live = None, None
            self._tell_start(t, now)
        owner = self._trial_of(t)
        if owner is not None:  # the trial owns its arms: it ends first, then the policy
            if state in ("crashed", "stopped") or t.hung_since is not None:
                why = t.hung_why if state == "ready" else t.server.crash_reason or "crashed"
                owner.arm_failed("incumbent", f"{'hung' if state == 'ready' else state}: {why}")
            return
        if state == "crashed" and not t.crash_seen:
            t.crash_seen, t.up_since = True, None
            if t.spec.restart == "on-failure":
                self._count_crash(t, now)
        if t.restart_at is not None and now >= t.restart_at:
            t.restart_at, t.crash_seen, t.up_since = None, False, None
            server = t.server

            def restart() -> None:
                # what is left of the crashed or hung one goes first, each signal short
                server.stop(sigint_timeout=HUNG_STOP_S, sigterm_timeout=HUNG_STOP_S)
                if not self._stopping:
                    server.start()

            self._act(t, "restart", restart)

    def _judge_liveness(self, t: _Tended, now: float) -> None:
        """Tell the watcher's judgement when it changes: degraded (slow, kept routed), hung
        (out of the router, unless it is the last that serves: :meth:`wanted_workers`), back
        to ready; under ``restart: on-failure`` a hung one is restarted after HUNG_GRACE_S, said
        before it happens."""
        j = t.live.judgement if t.live is not None else Judgement(OK)
        if j.verdict == HUNG and t.hung_since is None:
            t.hung_since, t.hung_why = now, j.why
            last = self._last_serving(t.spec)
            plan = (
                f"; restarted in {HUNG_GRACE_S:g} s unless it comes back (restart: on-failure)"
                if t.spec.restart == "on-failure" and self._trial_of(t) is None
                else ""
            )
            kept = "; the last instance that serves: kept in the router" if last else ""
            self._instance_event(t, StateEvent("hung", reason=j.why + kept + plan))
            t.said = HUNG
        elif j.verdict == DEGRADED and t.said == OK:
            self._instance_event(t, StateEvent("degraded", reason=j.why + "; kept in the router"))
            t.said = DEGRADED
        elif j.verdict == OK and t.said != OK and t.restart_at is None:
            t.hung_since = None  # (a restart planned goes ahead: it stays out of the router)
            self._instance_event(t, StateEvent("ready", url=t.spec.url, reason="recovered"))
            t.said = OK
        if (
            t.hung_since is not None
            and t.restart_at is None
            and t.spec.restart == "on-failure"
            and self._trial_of(t) is None
            and now - t.hung_since >= HUNG_GRACE_S
        ):
            t.crash_seen = True  # the stop to come is not a crash of its own
            self._count_crash(t, now)

    def _tell_start(self, t: _Tended, now: float) -> None:
        """A start under way told every STARTING_EVERY_S (its stage, time and limit)."""
        server = t.server
        if server.state in ("crashed", "stopped", "stopping") or server.started_at is None:
            return
        if now - t.told_at < STARTING_EVERY_S:
            return
        t.told_at = now
        elapsed = round(time.time() - server.started_at)
        if elapsed >= STARTING_EVERY_S:
            value = {"stage": server.state, "elapsed_s": elapsed, "limit_s": server.startup_timeout}
            self._instance_event(t, FactEvent(STARTING_FACT, value))

    def _trial_of(self, t: _Tended) -> LiveTrial | None:
        """The trial under way of this instance, if any: it owns the instance meanwhile."""
        trial = self.trial
        if trial is None or trial.done.is_set() or trial.name != t.spec.name:
            return None
        return None if trial.label == trial.name else trial  # (promoted: the instance's own)

    def _last_serving(self, inst: InstanceSpec) -> bool:
        """Whether no other instance (nor a trial's candidate) serves beside ``inst``."""
        others = [i for i in self.spec.instances if i.name != inst.name and self._serving(i)]
        trial = self.trial
        candidate = trial is not None and trial.routed and trial.server.state == "ready"
        return not others and not candidate
