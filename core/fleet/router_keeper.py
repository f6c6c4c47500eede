"""The fleet's care of vLLM's router: its liveness probed in a thread of its own, its death
or hang restarted on its port (with back-off), its workers kept in step with the instances that
serve, its own facts read. A part of :class:`~quantdeck.core.fleet.supervisor.Fleet`."""

from __future__ import annotations

import logging
import signal
import subprocess
import threading
import time
from typing import Any

import httpx
import psutil

from quantdeck.core.errors import ServerError
from quantdeck.core.events import (
    Event,
    RestartEvent,
    RouteEvent,
    StateEvent,
)
from quantdeck.core.fleet.live import LiveTrial
from quantdeck.core.fleet.liveness import (
    DEGRADED,
    HUNG,
    OK,
    Judgement,
    Liveness,
    look_at,
    read_pressure,
)
from quantdeck.core.fleet.router import FallbackJudge, RouterClient
from quantdeck.core.fleet.spec import FleetSpec, InstanceSpec
from quantdeck.core.fleet.tending import STABLE_S, _Tended
from quantdeck.core.http import auth_headers
from quantdeck.core.procs import Child, signal_group
from quantdeck.core.runtime import ServerProcess
from quantdeck.core.runtime.server import alive_pids

log = logging.getLogger("quantdeck.core.fleet.supervisor")

# The router, judged by its own prober as the instances are: hung, it is killed and, like a
# router that died, started again on its port with the workers it should have, after
# ROUTER_DELAYS (more than ROUTER_LIMIT deaths in a row, none up STABLE_S: the fleet ends).
ROUTER_DELAYS = (0.5, 1.0, 2.0, 4.0, 8.0)
ROUTER_LIMIT = 5
PROBE_TIMEOUT_S = 2.0
ROUTE_RETRY_S = 5.0  # a change of the router's workers it refused, tried again
SAMPLE_S = 1.0  # the router probed (as the instances are scraped)


class RouterKeeping:
    """The router's side of the fleet (a part of ``Fleet``: the names below are the
    fleet's)."""

    spec: FleetSpec
    servers: dict[str, ServerProcess]
    trial: LiveTrial | None
    router: Child | None
    router_log: Any
    router_api: RouterClient
    fallback: FallbackJudge | None
    failure: str | None
    _tended: dict[str, _Tended]
    _routed: set[str]
    _route_retry: dict[tuple[str, str], float]
    _metrics_port: int | None
    _stopping: bool
    _router_seen_down: bool
    _router_crashes: int
    _router_up_since: float | None
    _router_restart_at: float | None
    _router_action: threading.Thread | None
    _router_live: Liveness | None
    _router_said: str
    _router_ready: threading.Event

    def _router_event(self, ev: Event) -> None:
        raise NotImplementedError  # the fleet's

    def start_router(
        self,
        stop: threading.Event | None = None,
        timeout: float = 60.0,
        workers: list[str] | None = None,
    ) -> None:
        raise NotImplementedError  # the fleet's

    def router_healthy(self) -> bool:
        r = self.spec.router
        return probe(r.url, api_key=r.api_key) == "ready"

    def workers(self) -> list[str]:
        """The router's workers, as it lists them."""
        return self.router_api.workers()

    @property
    def router_running(self) -> bool:
        return self.router is not None and self.router.poll() is None

    def _router_watch_loop(self, stop: threading.Event, done: threading.Event) -> None:
        """The router's liveness, probed every SAMPLE_S in a thread of its own: slow scrapes
        of busy instances (the watcher's) must not make a router that answers look hung (a
        loaded machine once had it killed while it served, every client then refused)."""
        r = self.spec.router
        while not (stop.is_set() or done.is_set()):
            now = time.monotonic()
            try:
                live, router = self._router_live, self.router
                if live is not None and router is not None and self.router_running:
                    if probe(r.url, PROBE_TIMEOUT_S, r.api_key) == "ready":
                        live.answered(time.monotonic())
                    else:
                        live.scraped(time.monotonic(), None)
                    live.judge(time.monotonic(), look_at(router.pid), read_pressure())
            except Exception:
                log.exception("the router's probe failed a turn")
            done.wait(max(0.0, SAMPLE_S - (time.monotonic() - now)))

    # -- the router's supervision --------------------------------------------------------------
    def _tend_router(self, now: float, stop: threading.Event) -> bool:
        """One look at the router: its death or hang noticed and its restart planned (with
        back-off) or started; False once it is given up."""
        if self.router is None or (
            self._router_action is not None and self._router_action.is_alive()
        ):
            return True
        if self.router_running:
            if self._router_up_since is None and self._router_ready.is_set():
                self._router_up_since = now
            if self._router_up_since is not None and now - self._router_up_since >= STABLE_S:
                self._router_crashes = 0
            live = self._router_live
            j = live.judgement if live is not None else Judgement(OK)
            if self._router_ready.is_set() and j.verdict != self._router_said:
                self._router_said = j.verdict
                if j.verdict == DEGRADED:
                    self._router_event(StateEvent("degraded", reason=j.why))
                elif j.verdict == OK:
                    self._router_event(StateEvent("ready", url=self.spec.router.url))
            if self._router_ready.is_set() and j.verdict == HUNG:
                self._router_event(StateEvent("hung", reason=j.why))
                signal_group(self.router.pid, signal.SIGKILL)  # its death follows: restarted
                signal_group(self.router.pid, signal.SIGCONT)
                self._router_ready.clear()
            return True
        if not self._router_seen_down:
            self._router_seen_down, self._router_up_since = True, None
            self._router_ready.clear()
            code = self.router.poll()
            tail = self.router_log.read_text(errors="replace").splitlines()[-20:]
            how = f"killed by signal {-code}" if code is not None and code < 0 else f"code {code}"
            reason = f"the router exited ({how})"
            self._router_event(StateEvent("crashed", exit_code=code, reason=reason, log_tail=tail))
            self._router_crashes += 1
            gave_up = self._router_crashes > ROUTER_LIMIT
            delay = ROUTER_DELAYS[min(self._router_crashes, len(ROUTER_DELAYS)) - 1]
            self._router_event(RestartEvent(self._router_crashes, delay, gave_up=gave_up))
            if gave_up:
                self.failure = f"router: {reason}, {self._router_crashes} times in a row"
                return False
            self._router_restart_at = now + delay
        if self._router_restart_at is not None and now >= self._router_restart_at:
            self._router_restart_at = None
            workers = sorted(self.wanted_workers())

            def restart() -> None:
                if self._stopping:
                    return
                try:
                    self.start_router(stop, workers=workers)
                except ServerError as e:  # counted as its death on the next look
                    log.info("router restart failed: %s", e)

            self._router_action = threading.Thread(
                target=restart, name="fleet-router-restart", daemon=True
            )
            self._router_action.start()
        return True

    def _serving(self, inst: InstanceSpec) -> bool:
        """Remote (always), or ready and not hung."""
        if inst.url_ is not None:
            return True
        t = self._tended.get(inst.name)
        return self.servers[inst.name].state == "ready" and (t is None or t.hung_since is None)

    def _ready_primaries(self) -> list[InstanceSpec]:
        return [i for i in self.spec.instances if i.role == "primary" and self._serving(i)]

    def wanted_workers(self) -> dict[str, str]:
        """The workers the router should have now, each with why: the primaries that are
        ready (remote ones always); the backups while the fallback is active or no primary is
        ready."""
        primaries = self._ready_primaries()
        active = self.fallback is not None and self.fallback.active
        backups_on = active or not primaries
        wanted = {i.url: "ready" for i in primaries}
        for i in self.spec.instances if backups_on else []:
            if i.role == "backup" and self._serving(i):
                wanted[i.url] = "fallback" if active else "no primary ready"
        trial = self.trial
        if trial is not None:
            if trial.retiring:
                wanted.pop(trial.inst.url, None)
            if trial.routed and trial.server.state == "ready":
                wanted[trial.url] = "trial"
        if not wanted:  # the last that serves is kept, hung or not: else nothing would serve
            for i in self.spec.local:
                t = self._tended.get(i.name)
                if i.url in self._routed and t is not None and t.server.state == "ready":
                    wanted[i.url] = f"hung ({t.hung_why}), but the last instance that serves"
        return wanted

    def sync_routes(self) -> None:
        """Add to the router what should serve and is missing; remove what should not."""
        wanted = self.wanted_workers()
        by_url = {i.url: i for i in self.spec.instances}
        for url in sorted(self._routed - set(wanted)):
            inst = by_url.get(url)
            if inst is None:  # a trial's candidate (or an incumbent promoted away)
                self._route("remove", url, "trial")
                continue
            state = self.servers[inst.name].state if inst.name in self.servers else "ready"
            t = self._tended.get(inst.name)
            if state == "ready" and t is not None and t.hung_since is not None:
                state = f"hung: {t.hung_why}"
            trial = self.trial
            if trial is not None and trial.retiring and url == trial.inst.url:
                state = "trial: promoting the candidate"
            reason = state if state != "ready" else "recovered"
            self._route("remove", url, reason)
        for url in sorted(set(wanted) - self._routed):
            self._route("add", url, wanted[url])

    def _route(self, action: str, url: str, reason: str) -> None:
        """One change of the router's workers; one the router refused is tried again after
        ROUTE_RETRY_S (one event per try, not one per look)."""
        if time.monotonic() < self._route_retry.get((action, url), 0.0):
            return
        try:
            if action == "add":
                self.router_api.add_worker(url)
                self._routed.add(url)
            else:
                self.router_api.remove_worker(url)
                self._routed.discard(url)
        except ServerError as e:
            self._route_retry[(action, url)] = time.monotonic() + ROUTE_RETRY_S
            self._router_event(RouteEvent(action, url, reason, ok=False, error=str(e)))
            return
        self._route_retry.pop((action, url), None)
        self._router_event(RouteEvent(action, url, reason))

    def router_facts(self) -> dict[str, Any]:
        """The router's own view: its workers with health, load and circuit state, and its
        request, retry and error counts (from its Prometheus port and ``/get_loads``)."""
        if self._metrics_port is None:
            return {}
        return self.router_api.facts(f"http://127.0.0.1:{self._metrics_port}/metrics")

    def _stop_router(self, proc: Child) -> None:
        pids = {proc.pid}
        try:
            pids |= {c.pid for c in psutil.Process(proc.pid).children(recursive=True)}
        except psutil.Error:
            pass
        running = proc.poll() is None
        if running:
            self._router_event(StateEvent("stopping"))
        for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
            if proc.poll() is not None and not alive_pids(pids):
                break
            signal_group(proc.pid, sig)
            try:
                proc.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                pass
        if running:
            self._router_event(StateEvent("stopped", exit_code=proc.returncode))


def probe(url: str, timeout: float = 2.0, api_key: str | None = None) -> str:
    """``ready`` when ``url``'s ``/health`` answers 200 within ``timeout`` seconds (sent
    ``api_key`` where given), else ``down``. vLLM's /health wants no key; a keyed router's
    does: asked without a key, its 401 counts as ready (it answered; ``fleet status`` in
    another shell does not know the key)."""
    try:
        r = httpx.get(url.rstrip("/") + "/health", headers=auth_headers(api_key), timeout=timeout)
    except httpx.HTTPError:
        return "down"
    return "ready" if r.status_code == 200 or (r.status_code == 401 and not api_key) else "down"
