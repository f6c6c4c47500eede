"""The Fleet view's rows, Qt-free: the router and each instance, kept from the fleet's events
and the instances' metrics.

:class:`FleetRows` holds one :class:`FleetRow` per instance and one for the router (first);
:meth:`FleetRows.apply` takes the fleet's :class:`InstanceEvent` objects and
:meth:`FleetRows.apply_metrics` a scrape of one instance, each returning the row that changed.
:class:`InstanceSampler` scrapes the serving instances (in a worker thread: HTTP).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quantdeck.core.errors import ConfigError, ServerError
from quantdeck.core.events import (
    AdviceEvent,
    Event,
    FactEvent,
    FallbackEvent,
    InstanceEvent,
    MarkerEvent,
    MetricsEvent,
    RestartEvent,
    RouteEvent,
    StateEvent,
    TrialEvent,
)
from quantdeck.core.fleet.roles import ROUTER, TRIAL_CANDIDATE
from quantdeck.core.fleet.spec import FleetSpec, InstanceSpec
from quantdeck.core.fleet.trial import CANDIDATE
from quantdeck.core.launch import LaunchConfig
from quantdeck.core.launch.diff import after_text, change_text, knob_diff, knobs_text
from quantdeck.core.models import ModelInfo
from quantdeck.core.monitor.metrics import MetricsScraper
from quantdeck.core.monitor.recording import Recording

DOWN = ("stopped", "crashed")
# a start under way, told every STARTING_EVERY_S: {"stage", "elapsed_s", "limit_s"} (no state
# goes without an event longer than the hang window)
STARTING_FACT = "starting"  # an instance in these states has no metrics
_NOT_KNOBS = ("model", "host", "port")  # shown in other columns, or the fleet's to give


@dataclass
class FleetRow:
    """What the table shows of one instance, or of the router (``role`` ``router``)."""

    name: str
    role: str  # primary, backup or router
    url: str
    local: bool = True  # started by Quantdeck (False: a server elsewhere, attached by url)
    model: str = ""
    format: str = ""
    placement: str = ""  # "GPU 0,1", "CPU 0-3", "remote"
    state: str = "stopped"
    note: str = ""  # what the state leaves out: a restart planned, a refused route
    reason: str = ""  # why it crashed (its crashed event's reason), until its next state
    kv_pct: float | None = None
    running: int | None = None
    waiting: int | None = None
    tok_s: float | None = None  # generated tokens per second
    ttft_p99_ms: float | None = None
    routed: bool | None = None  # in the router's workers (None: not known yet)
    healthy: bool | None = None
    load: float | None = None
    circuit: str | None = None
    api_key: str | None = field(default=None, repr=False)
    # the router's own figures
    requests: int | None = None
    requests_per_s: float | None = None
    retries: int | None = None
    errors: int | None = None
    fallback: bool | None = None  # None: the fleet has no fallback rule
    # the launch knobs set away from vLLM's defaults, as the instance runs now ({knob: value})
    knobs: dict[str, Any] = field(default_factory=dict)

    @property
    def is_router(self) -> bool:
        return self.role == ROUTER

    @property
    def down(self) -> bool:
        """Stopped or crashed: it can be started (a local instance)."""
        return self.state in DOWN

    @property
    def serving(self) -> bool:
        """Answers requests: ready, or degraded (slow, kept routed; a remote one: its last
        scrape answered)."""
        return self.state in ("ready", "degraded")

    def state_text(self) -> str:
        state = f"{self.state}: {self.reason}" if self.reason else self.state
        return f"{state} ({self.note})" if self.note else state

    def route_text(self) -> str:
        """The router's view: its counts on the router's row; on an instance's, whether the
        router sends it requests and, from the router's metrics, its health, load, circuit."""
        if self.is_router:
            parts = []
            if self.requests_per_s is not None:
                parts.append(f"{self.requests_per_s:.1f} req/s")
            for name in ("requests", "retries", "errors"):
                value = getattr(self, name)
                if value is not None:
                    parts.append(f"{value} {name}")
            if self.fallback is not None:
                parts.append(f"fallback {'on' if self.fallback else 'off'}")
            return " · ".join(parts)
        if self.routed is None:
            return ""
        if not self.routed:
            return "not routed"
        parts = ["routed"]
        if self.healthy is not None:
            parts.append("healthy" if self.healthy else "unhealthy")
        if self.load is not None and self.load >= 0:
            parts.append(f"load {self.load:g}")
        if self.circuit is not None:
            parts.append(f"circuit {self.circuit}")
        return " · ".join(parts)

    def knobs_text(self) -> str:
        """The launch knobs set, ``max-num-seqs=16`` each (the Fleet tab's knobs column; one
        wording of knobs everywhere: core/launch/diff.py)."""
        return knobs_text(self.knobs)

    def clear_metrics(self) -> None:
        self.kv_pct = self.running = self.waiting = self.tok_s = self.ttft_p99_ms = None

    def describe(self) -> dict[str, Any]:
        """What the fleet is made of, without its state or secrets: the ``fleet`` fact that
        ``fleet up`` reports first, from which a recording's rows are rebuilt."""
        return {k: getattr(self, k) for k in _DESCRIBED}


_DESCRIBED = ("name", "role", "url", "local", "model", "format", "placement")
_TEXT = ("name", "role", "url", "model", "format", "placement")


def instance_row(inst: InstanceSpec, info: ModelInfo | None = None) -> FleetRow:
    """An instance's row before anything runs: what its profile says."""
    row = FleetRow(inst.name, inst.role, inst.url, api_key=inst.api_key)
    if inst.cfg is None:
        row.local, row.placement, row.state = False, "remote", "remote"
        return row
    m = inst.cfg.model
    row.model = m.served_model_name or Path(m.model).name
    row.format = (m.quantization or "").upper() or (info.badge if info else "?")
    if inst.gpus is not None:
        row.placement = "GPU " + ",".join(map(str, inst.gpus))
    elif inst.cpus is not None:
        row.placement = f"CPU {inst.cpus}"
    else:
        row.placement = "all"  # nothing given: the engine sees every GPU (or core)
    row.knobs = launch_knobs(inst.cfg)
    return row


def launch_knobs(cfg: LaunchConfig) -> dict[str, Any]:
    """The knobs of ``cfg`` set away from the defaults (but the model and the address)."""
    return {k: v for k, (_, v) in knob_diff(LaunchConfig(), cfg).items() if k not in _NOT_KNOBS}


class FleetRows:
    """The rows of one fleet, kept up to date from its events; the router's row is first."""

    def __init__(self, spec: FleetSpec, infos: dict[str, ModelInfo | None] | None = None) -> None:
        infos = infos or {}
        router = FleetRow(ROUTER, ROUTER, spec.router.url, model=f"policy {spec.router.policy}")
        router.fallback = None if spec.fallback is None else False
        self._last_requests: tuple[float, int] | None = None  # (t, count) of the last facts
        self._set([router, *(instance_row(i, infos.get(i.name)) for i in spec.instances)])

    def _set(self, rows: list[FleetRow]) -> None:
        self.rows = rows
        self._by_name = {r.name: n for n, r in enumerate(self.rows)}

    @classmethod
    def from_description(cls, described: list[Any]) -> FleetRows:
        """The rows of a recorded fleet, from its ``fleet`` fact (``FleetRow.describe`` of
        each row, the router first); ValueError when it is not one."""
        rows: list[FleetRow] = []
        for d in described:
            if not isinstance(d, dict) or not all(isinstance(d.get(k), str) for k in _TEXT):
                raise ValueError(f"not a fleet row: {str(d)[:100]}")
            rows.append(FleetRow(**{k: d[k] for k in _TEXT}, local=d.get("local") is not False))
        if not rows or not rows[0].is_router or len({r.name for r in rows}) < len(rows):
            raise ValueError("a fleet's rows start with the router and name each row once")
        self = cls.__new__(cls)
        self._last_requests = None
        self._set(rows)
        return self

    def describe(self) -> list[dict[str, Any]]:
        return [r.describe() for r in self.rows]

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def index(self, name: str) -> int:
        return self._by_name[name]

    def row(self, name: str) -> FleetRow:
        return self.rows[self._by_name[name]]

    def by_url(self, url: str) -> FleetRow | None:
        return next((r for r in self.rows[1:] if r.url == url.rstrip("/")), None)

    def apply(self, event: Event) -> list[int]:
        """Take one of the fleet's events; returns the rows it changed (indexes)."""
        if not isinstance(event, InstanceEvent) or event.instance not in self._by_name:
            return []
        row, ev = self.row(event.instance), event.event
        if isinstance(ev, MetricsEvent):
            return [self.apply_metrics(row.name, ev)]
        if isinstance(ev, TrialEvent):
            return self._trial(row, ev)
        if not isinstance(ev, StateEvent | RestartEvent | RouteEvent | FallbackEvent | FactEvent):
            return []  # log lines, progress: nothing the table shows
        changed = [self.index(row.name)]
        if isinstance(ev, StateEvent):
            row.state, row.note = ev.state, ""
            row.reason = (ev.reason or "") if ev.state in ("crashed", "hung", "degraded") else ""
            if row.is_router and isinstance(ev.url, str):
                row.url = ev.url
            if ev.state in DOWN:
                row.clear_metrics()
                if row.is_router:
                    changed += self._unroute_all()
        elif isinstance(ev, RestartEvent):
            row.note = (
                "restart given up" if ev.gave_up else f"restart {ev.attempt} in {ev.delay_s:g} s"
            )
        elif isinstance(ev, RouteEvent):
            changed = self._route(ev)
        elif isinstance(ev, FallbackEvent):
            row.fallback = ev.active
        elif isinstance(ev, FactEvent) and ev.name == STARTING_FACT and isinstance(ev.value, dict):
            row.note = _start_told(ev.value)
        elif isinstance(ev, FactEvent) and row.is_router:
            if ev.name == "workers" and isinstance(ev.value, list):
                changed += self._set_routed({str(u) for u in ev.value})
            elif ev.name == "router" and isinstance(ev.value, dict):
                changed += self._router_facts(row, ev.value, ev.when)
        return changed

    def _trial(self, row: FleetRow, ev: TrialEvent) -> list[int]:
        """A live trial's step: its candidate gets a row of its own (below the instance's)
        while it runs, its states and metrics coming as instance ``NAME+try``; a promotion
        gives the instance the candidate's URL and knobs. Returns every row (rows may have
        come or gone: the caller shows them again)."""
        label = row.name + CANDIDATE
        if ev.phase in ("admitted", "started", "measuring", "decided"):
            if label not in self._by_name and ev.candidate:
                candidate = FleetRow(
                    label,
                    TRIAL_CANDIDATE,
                    ev.candidate.rstrip("/"),
                    model=row.model,
                    format=row.format,
                    placement=row.placement,
                    state="starting" if ev.phase == "admitted" else "ready",
                    api_key=row.api_key,
                    knobs={**row.knobs, **{k: b for k, (_, b) in ev.knobs.items()}},
                )
                n = self.index(row.name) + 1
                self._set([*self.rows[:n], candidate, *self.rows[n:]])
        elif ev.phase in ("promoted", "rolled back", "refused"):
            gone = self.rows[self._by_name[label]] if label in self._by_name else None
            if ev.phase == "promoted":
                row.url = ev.candidate.rstrip("/") or row.url
                row.knobs = {**row.knobs, **{k: b for k, (_, b) in ev.knobs.items()}}
                if gone is not None:  # its server is the instance's now (the incumbent stopped)
                    row.state, row.reason, row.note = gone.state, "", ""
                    row.routed, row.healthy = gone.routed, gone.healthy
            if gone is not None:
                self._set([r for r in self.rows if r is not gone])
        return list(range(len(self.rows)))

    def _route(self, ev: RouteEvent) -> list[int]:
        target = self.by_url(ev.worker)
        if target is None:
            return []
        if ev.ok:
            target.routed, target.note = ev.action == "add", ""
        else:
            target.note = f"router {ev.action} failed"
        return [self.index(target.name)]

    def _set_routed(self, urls: set[str]) -> list[int]:
        urls = {u.rstrip("/") for u in urls}
        for r in self.rows[1:]:
            r.routed = r.url in urls
        return list(range(1, len(self.rows)))

    def _unroute_all(self) -> list[int]:
        for r in self.rows[1:]:
            r.routed = r.healthy = r.load = r.circuit = None
        return list(range(1, len(self.rows)))

    def _router_facts(self, router: FleetRow, facts: dict[str, Any], t: float | None) -> list[int]:
        """The router's counts (requests per second from the last two reports with a time)
        and, per worker, its health, load and circuit state."""
        counts = {k: facts.get(k) for k in ("requests", "retries", "errors")}
        for k, v in counts.items():
            setattr(router, k, int(v) if isinstance(v, int | float) else None)
        if router.requests is not None and t is not None:
            last = self._last_requests
            if last is not None and t > last[0]:
                router.requests_per_s = max(0.0, (router.requests - last[1]) / (t - last[0]))
            self._last_requests = (t, router.requests)
        changed = []
        workers = facts.get("workers")
        for w in workers if isinstance(workers, list) else []:
            target = self.by_url(str(w.get("url", ""))) if isinstance(w, dict) else None
            if target is None:
                continue
            target.routed = True
            target.healthy = w.get("healthy") if isinstance(w.get("healthy"), bool) else None
            load = w.get("load")
            target.load = float(load) if isinstance(load, int | float) else None
            target.circuit = str(w["circuit"]) if w.get("circuit") is not None else None
            changed.append(self.index(target.name))
        return changed

    def apply_metrics(self, name: str, ev: MetricsEvent) -> int:
        """One scrape of an instance (with ``error``: it did not answer); returns its row's
        index. A remote instance's state is whether it answers."""
        row = self.row(name)
        answered = ev.error is None
        if not row.local:
            row.state = "ready" if answered else "down"
        if not answered:
            row.clear_metrics()
            return self.index(name)
        m = ev.metrics
        if m is None:  # it answered, with no figures
            row.clear_metrics()
            return self.index(name)
        row.kv_pct, row.tok_s = _number(m.kv_usage_pct), _number(m.generation_tokens_per_s)
        running, waiting = _number(m.running), _number(m.waiting)
        row.running = None if running is None else int(running)
        row.waiting = None if waiting is None else int(waiting)
        row.ttft_p99_ms = _number(m.ttft_p99_ms)
        return self.index(name)

    def targets(self) -> list[tuple[str, str, str | None]]:
        """What to scrape now: the local instances that serve, and every remote one."""
        return [(r.name, r.url, r.api_key) for r in self.rows[1:] if r.serving or not r.local]


def recorded_rows(rec: Recording) -> FleetRows:
    """The rows of a recording of ``fleet up --record`` (its ``fleet`` fact), before any
    event is applied; ConfigError when it is not a fleet's."""
    for ev in rec.events:
        inner = ev.event if isinstance(ev, InstanceEvent) and ev.instance == ROUTER else None
        if isinstance(inner, FactEvent) and inner.name == "fleet":
            try:
                return FleetRows.from_description(list(inner.value or []))
            except (TypeError, ValueError) as e:
                raise ConfigError(f"the recording's fleet is unreadable: {e}") from None
    raise ConfigError(
        "not a fleet recording (no 'fleet' fact): record one with "
        "`quantdeck fleet up FILE --record OUT`"
    )


def event_line(event: InstanceEvent) -> str | None:
    """The fleet's own news as one line (``NAME: what``): states, restarts, the router's
    routes, the fallback rule's switches with their figures; None for the rest (log lines,
    facts, progress)."""
    ev, name = event.event, event.instance
    if isinstance(ev, StateEvent):
        extra = (
            ev.reason if isinstance(ev.reason, str) else ev.url if isinstance(ev.url, str) else ""
        )
        return f"{name}: {ev.state} {extra}".rstrip()
    text = fleet_news(ev)
    return None if text is None else f"{name}: {text}"


def _start_told(v: dict[str, Any]) -> str:
    """``30 s of at most 1800 s`` (a starting fact's figures; as numbers print, 1800 not
    1800.0)."""

    def num(x: object) -> str:
        return f"{x:g}" if isinstance(x, int | float) else str(x)

    return f"{num(v.get('elapsed_s'))} s of at most {num(v.get('limit_s'))} s"


def fleet_news(ev: Event) -> str | None:
    """A restart, a route or a fallback switch, in words (``fleet up``'s lines and the
    Fleet tab's): the event's :meth:`~Event.describe` without its ``[kind]``; None for any
    other event."""
    if isinstance(ev, RestartEvent | RouteEvent | FallbackEvent):
        return ev.describe().removeprefix(f"[{ev.kind}] ")
    if isinstance(ev, TrialEvent) and ev.phase != "measuring":  # (every 2 s: the Trial view's)
        return trial_news(ev)
    if isinstance(ev, FactEvent) and ev.name == STARTING_FACT and isinstance(ev.value, dict):
        return f"still {ev.value.get('stage')}: {_start_told(ev.value)}"
    if isinstance(ev, AdviceEvent):  # the fleet check's warnings: "[warning] ..."
        return ev.describe().removeprefix("[").replace("] ", ": ", 1)
    return None


def trial_news(ev: TrialEvent) -> str:
    """A step of a trial, or of an undo, in the operator's words: ``trial admitted:
    max-num-seqs 8 → 16 (…)``, ``promoted max-num-seqs 16: …``, ``undone: back to
    max-num-seqs 8``; the knobs named as everywhere (core/launch/diff.py)."""
    undo = ev.undo is True
    reason = f" ({ev.reason})" if isinstance(ev.reason, str) and ev.reason else ""
    if ev.phase == "admitted":
        if undo:
            return f"undo admitted: back to {after_text(ev.knobs)}{reason}"
        return f"trial admitted: {change_text(ev.knobs) or 'the same knobs'}{reason}"
    if ev.phase == "promoted":
        if undo:
            return f"undone: back to {after_text(ev.knobs)}{reason}"
        return f"promoted {after_text(ev.knobs) or 'the same knobs'}{reason}"
    if ev.phase == "decided" and isinstance(ev.decision, str):
        return f"{'undo' if undo else 'trial'} decided: {ev.decision}{reason}"
    return f"{'undo' if undo else 'trial'} {ev.phase}{reason}"


# a live trial's markers on its instance's Monitor source: where it started or was rolled back
# (the router's split changed, as a fleet's switch does), where the instance's knobs changed (a
# promotion, an undo: as a launch with other knobs)
TRIAL_MARKERS = {"admitted": "trial", "rolled back": "trial", "promoted": "promoted"}


def trial_marker(ev: TrialEvent) -> MarkerEvent | None:
    """The marker a step of a live trial (or of an undo) makes on its instance's timeline: its
    start (``admitted``), its promotion or rollback, in :func:`trial_news`'s words, the knobs
    as its diff; None for the steps between (started, measuring, decided)."""
    what = TRIAL_MARKERS.get(ev.phase)
    if what is None:
        return None
    if what == "promoted" and ev.undo is True:
        what = "undone"
    return MarkerEvent(what, trial_news(ev), {k: list(v) for k, v in ev.knobs.items()}, t=ev.t)


def _number(v: object) -> float | None:
    """A recorded figure as a float; None for anything else (a bool, text, no figure)."""
    return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None


class InstanceSampler:
    """Scrapes instances' ``/metrics``, side by side; one :class:`MetricsScraper` per URL,
    kept (its quantiles are over a window of scrapes). Not thread-safe: one sample at a
    time."""

    def __init__(self, window_s: float = 60.0) -> None:
        self.window_s = window_s
        self._scrapers: dict[str, MetricsScraper] = {}

    def sample(self, targets: list[tuple[str, str, str | None]]) -> dict[str, MetricsEvent]:
        """``{name: metrics event}`` for ``(name, url, api_key)`` targets: the instance's
        figures, as ``serve --json-events`` prints them, or ``error`` where it did not
        answer."""
        scrapers = []
        for name, url, key in targets:
            scraper = self._scrapers.get(url)
            if scraper is None:
                scraper = MetricsScraper(url, api_key=key, window_s=self.window_s, timeout=2.0)
                self._scrapers[url] = scraper
            scrapers.append((name, scraper))

        def one(scraper: MetricsScraper) -> MetricsEvent:
            try:
                snap = scraper.scrape()
            except ServerError as e:
                return MetricsEvent(time.time(), error=str(e))
            return MetricsEvent(snap.t, metrics=snap)

        if len(scrapers) < 2:
            return {name: one(scraper) for name, scraper in scrapers}
        # side by side: a hung instance costs the others nothing (each scrape has its timeout)
        with ThreadPoolExecutor(len(scrapers), thread_name_prefix="fleet-scrape") as pool:
            done = list(pool.map(one, [scraper for _, scraper in scrapers]))
        return {name: ev for (name, _), ev in zip(scrapers, done, strict=True)}

    def forget(self, urls: set[str]) -> None:
        """Drop the scrapers of URLs no longer sampled (an instance restarted starts its
        counters anew: a new scraper does not read the reset as a negative rate)."""
        for url in set(self._scrapers) - urls:
            self._scrapers.pop(url).close()

    def close(self) -> None:
        for s in self._scrapers.values():
            s.close()
        self._scrapers.clear()
