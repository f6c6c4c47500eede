"""Typed events and the one publish/subscribe helper every emitter uses.

Each kind of event is a frozen dataclass whose ``to_json()`` gives the JSON object of
``--json-events``, recordings and the workers' lines, with the keys in the order they always had
(``{"event": KIND, ...fields}``). A field left :data:`ABSENT` is not written at all, so an event
carries exactly the keys it was given (``"exit_code": null`` and no ``exit_code`` stay different).
:func:`from_json` turns such an object back into its event, for replay and for reading workers.

:class:`Publisher` delivers events to observers in order. An observer that raises does not stop
the others or the emitter, and its error is logged once, with its traceback: never swallowed.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final, Generic, Literal, TypeVar

from quantdeck.core.payloads import KvGroupStats, SharedPrefix, TrialArms, Verdict
from quantdeck.core.snapshots import GpuSnapshot, MetricsSnapshot, TelemetrySnapshot, field_names

log = logging.getLogger("quantdeck.events")


class _Absent:
    """The marker of a field an event does not carry (distinct from a ``None`` it carries)."""

    _instance: ClassVar[_Absent | None] = None

    def __new__(cls) -> _Absent:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "ABSENT"

    def __bool__(self) -> Literal[False]:  # mypy then reads `ev.reason or ""` as str
        return False

    def __reduce__(self) -> str:
        return "ABSENT"


ABSENT: Final = _Absent()

_KINDS: dict[str, type[Event]] = {}


@dataclass(frozen=True)
class Event:
    """Base of every event: ``kind`` is its ``"event"`` key in JSON."""

    kind: ClassVar[str] = ""
    # The A/B and tuning events were always written time first (and the tuner's point number
    # second): {"t": ..., "point": ..., "event": ..., ...}.
    t_first: ClassVar[bool] = False

    def __init_subclass__(cls, **kw: Any) -> None:
        super().__init_subclass__(**kw)
        if cls.__dict__.get("kind") and not cls.__name__.startswith("_"):
            _KINDS.setdefault(cls.kind, cls)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.t_first:
            out["t"] = self._written("t")
            if self._written("point") is not None:
                out["point"] = self._written("point")
        out["event"] = self.kind
        for f in dataclasses.fields(self):
            if f.name in out:
                continue
            value = getattr(self, f.name)
            if value is ABSENT:
                continue
            if f.metadata.get("flatten"):
                out.update(value)
            elif f.metadata.get("payload") is not None:
                out[f.name] = _payload_json(value, f.metadata)
            else:
                out[f.name] = value
        return out

    def _written(self, name: str) -> Any:
        """The value :meth:`to_json` writes for key ``name`` (a field, or a key of a flattened
        mapping), or None when the event does not carry it: the A/B and tuning events write
        their ``t`` and ``point`` first."""
        value = getattr(self, name, ABSENT) if name in self._names() else ABSENT
        if value is ABSENT:
            for f in dataclasses.fields(self):
                if f.metadata.get("flatten") and name in getattr(self, f.name):
                    return getattr(self, f.name)[name]
            return None
        return value

    def describe(self) -> str:
        """One line for a person: what the CLI prints (and the GUI's Logs tab shows) for it."""
        return json.dumps(self.to_json(), default=str)

    @property
    def when(self) -> float | None:
        """The event's time (unix seconds); None where it carries none."""
        t = getattr(self, "t", None)
        return float(t) if isinstance(t, int | float) and not isinstance(t, bool) else None

    @classmethod
    def _names(cls) -> frozenset[str]:
        return _field_names(cls)

    @classmethod
    def from_fields(cls, data: Mapping[str, Any]) -> Event:
        names = [f.name for f in dataclasses.fields(cls)]
        flat = next((f.name for f in dataclasses.fields(cls) if f.metadata.get("flatten")), None)
        kw: dict[str, Any] = {k: v for k, v in data.items() if k in names and k != flat}
        t_field = next((f for f in dataclasses.fields(cls) if f.name == "t"), None)
        optional_t = t_field is not None and t_field.default_factory is not dataclasses.MISSING
        if optional_t and "t" not in data:
            kw["t"] = ABSENT  # read back as it was written: no time stamp invented
        for f in dataclasses.fields(cls):
            if f.metadata.get("payload") is not None and f.name in kw:
                kw[f.name] = _payload_of(kw[f.name], f.metadata)
        if flat is not None:
            kw[flat] = {k: v for k, v in data.items() if k not in names and k != "event"}
        else:
            extra = sorted(set(data) - set(names) - {"event"})
            if extra:
                raise ValueError(f"'{cls.kind}' event: unknown keys {', '.join(extra)}")
        return cls(**kw)


_FIELD_NAMES: dict[type[Event], frozenset[str]] = {}


def _field_names(cls: type[Event]) -> frozenset[str]:
    """The field names of an event class (read on every ``to_json``: computed once per class)."""
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = frozenset(f.name for f in dataclasses.fields(cls))
    return names


def flat() -> Any:
    """A mapping field written inline (its keys at the event's top level), in the position the
    field is declared."""
    return field(default_factory=dict, metadata={"flatten": True})


def changes() -> Any:
    """A mapping field of changes, ``{name: [before, after]}``: a reader refuses a value that
    is not a pair (quantdeck.core.schema.check_event)."""
    return field(default_factory=dict, metadata={"pairs": True})


def payload(cls: type, *, empty_none: bool = False) -> Any:
    """A field that carries a core dataclass (core/payloads.py), written by its ``to_json``
    and read back by its ``from_json``; ``empty_none``: None is written ``{}`` (as it always
    was) and ``{}`` reads None."""
    return field(default=ABSENT, metadata={"payload": cls, "empty_none": empty_none})


def payloads(cls: type) -> Any:
    """A list field of core dataclasses (:func:`payload`'s, one per item)."""
    return field(default_factory=list, metadata={"payload": cls, "many": True})


def _payload_json(value: Any, metadata: Mapping[str, Any]) -> Any:
    if value is None and metadata.get("empty_none"):
        return {}
    if metadata.get("many") and isinstance(value, list):
        return [x.to_json() if hasattr(x, "to_json") else x for x in value]
    return value.to_json() if hasattr(value, "to_json") else value


def _payload_of(value: Any, metadata: Mapping[str, Any]) -> Any:
    """A payload field's value read back from JSON (what is not of its shape is left as it
    is: the schema check then refuses it, in one line)."""
    cls = metadata["payload"]
    if metadata.get("many"):
        if not isinstance(value, list):
            return value
        return [cls.from_json(x) if isinstance(x, Mapping) else x for x in value]
    if not isinstance(value, Mapping):
        return value
    return None if metadata.get("empty_none") and not value else cls.from_json(value)


def now() -> float:
    return time.time()


# -- the server (quantdeck.core.runtime) ------------------------------------------------------


@dataclass(frozen=True)
class StateEvent(Event):
    """The server (or a job) moved to ``state``; the rest says why or where."""

    kind: ClassVar[str] = "state"
    state: str
    command: list[str] | _Absent = ABSENT
    exit_code: int | None | _Absent = ABSENT
    reason: str | _Absent = ABSENT
    log_tail: list[str] | _Absent = ABSENT
    url: str | _Absent = ABSENT
    models: list[str] | _Absent = ABSENT  # attached: what the server serves
    error: str | None | _Absent = ABSENT  # jobs: why a job failed
    t: float = field(default_factory=now)

    def describe(self) -> str:
        extra = self.reason or self.url or ""
        return f"[state] {self.state} {extra}".rstrip()


@dataclass(frozen=True)
class FactEvent(Event):
    """Something learnt about the running server (weights, KV tokens, kernel, ready_s...)."""

    kind: ClassVar[str] = "fact"
    name: str
    value: Any
    t: float = field(default_factory=now)

    def describe(self) -> str:
        return f"[fact] {self.name} = {self.value}"


@dataclass(frozen=True)
class ProgressEvent(Event):
    """Progress of a stage, 0-100 (server start-up, a conversion, the demo build)."""

    kind: ClassVar[str] = "progress"
    stage: str
    pct: float
    extra: Mapping[str, Any] = flat()  # what a worker adds (loss, layer, peak_rss_bytes...)
    t: float | _Absent = field(default_factory=now)

    def describe(self) -> str:
        return f"[progress] {self.stage} {self.pct:.0f}%"

    def _int(self, key: str) -> int | None:
        v = self.extra.get(key)
        return v if isinstance(v, int) and not isinstance(v, bool) else None

    @property
    def layer(self) -> int | None:
        """A conversion's layer (of :attr:`layers`) being quantized; None: not told."""
        return self._int("layer")

    @property
    def layers(self) -> int | None:
        return self._int("layers")

    @property
    def rss_bytes(self) -> int | None:
        """The worker's resident memory as it reported the step; None: not told."""
        return self._int("rss_bytes")


@dataclass(frozen=True)
class LogEvent(Event):
    """One line of the server's (or a worker's) log."""

    kind: ClassVar[str] = "log"
    line: str
    level: str | _Absent = ABSENT
    t: float | _Absent = field(default_factory=now)

    def describe(self) -> str:
        return self.line


@dataclass(frozen=True)
class PlanEvent(Event):
    """The planner's prediction for this launch (:meth:`KvPlan.to_json`'s keys)."""

    kind: ClassVar[str] = "plan"
    plan: Mapping[str, Any] = flat()
    t: float = field(default_factory=now)

    def describe(self) -> str:
        p = self.plan
        if "kv_cache_tokens" not in p:
            return "[plan] none"
        fits = "fits" if p.get("fits") else "does not fit: " + "; ".join(p.get("reasons") or [])
        return (
            f"[plan] KV cache {p.get('kv_cache_tokens')} tokens in {p.get('num_blocks')} "
            f"blocks, max length {p.get('max_model_len')}: {fits}"
        )


@dataclass(frozen=True)
class AdviceEvent(Event):
    """One advisor finding (:meth:`Finding.to_json`'s keys: level, code, message...)."""

    kind: ClassVar[str] = "advice"
    finding: Mapping[str, Any] = flat()
    t: float = field(default_factory=now)

    def describe(self) -> str:
        return f"[{self.finding.get('level')}] {self.finding.get('message')}"


# -- monitoring (quantdeck.core.monitor) ------------------------------------------------------


@dataclass(frozen=True)
class MetricsEvent(Event):
    """One monitoring tick: the scrape of the server's ``/metrics`` (``metrics``), the GPUs and
    the host (``telemetry``), and why either is missing this tick (``error``).

    In JSON it is flat, as ``serve/monitor --json-events`` print it and recordings hold it:
    ``{"event": "metrics", "t": ..., ...the metrics' keys, ...the telemetry's, "error": ...}``
    (the snapshots' own ``t`` is the event's). Read back, ``extra`` keeps the keys that are
    neither (a newer version's), and ``layout``/``gpu_layout`` the keys as they were written
    where the snapshots would write others (an older version's recording lacks figures, which
    read None): every line writes back unchanged."""

    kind: ClassVar[str] = "metrics"
    t: float
    metrics: MetricsSnapshot | None = None
    telemetry: TelemetrySnapshot | None = None
    error: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)
    layout: tuple[str, ...] | None = None  # the flat keys as written (None: the snapshots')
    gpu_layout: tuple[str, ...] | None = None  # each GPU's keys as written (None: the same)

    def to_json(self) -> dict[str, Any]:
        return {"event": self.kind, "t": self.t, **self._flat()}

    def _flat(self) -> dict[str, Any]:
        """The flat figures, as :meth:`to_json` writes them after ``t``."""
        flat: dict[str, Any] = {}
        if self.metrics is not None:
            flat.update(self.metrics.to_json())
        if self.telemetry is not None:
            tel = self.telemetry.to_json()
            if self.gpu_layout is not None:
                tel["gpus"] = [{k: g[k] for k in self.gpu_layout} for g in tel["gpus"]]
            flat.update(tel)
        flat.pop("t", None)
        if self.error is not None:
            flat["error"] = self.error
        flat.update(self.extra)
        if self.layout is not None:
            flat = {k: flat[k] for k in self.layout if k in flat}
        return flat

    @classmethod
    def from_fields(cls, data: Mapping[str, Any]) -> Event:
        if "t" not in data:
            raise ValueError("'metrics' event: no 't'")
        rest = {k: v for k, v in data.items() if k not in ("event", "t")}
        return cls.from_values(data["t"], rest)

    @classmethod
    def from_values(cls, t: float, values: Mapping[str, Any]) -> MetricsEvent:
        """The event whose flat figures (as :meth:`to_json` writes them after ``t``) are
        ``values``: a snapshot is read from its keys where ``values`` has any (those it lacks
        read None), ``error`` where it is text; the rest goes to ``extra``."""
        metrics = telemetry = error = None
        gpu_layout = None
        taken: set[str] = set()
        if any(k in values for k in _METRICS_KEYS):
            metrics = MetricsSnapshot.from_json({**values, "t": t})
            taken.update(_METRICS_KEYS)
        # the GPUs: objects of GpuSnapshot's keys, the same keys each (else kept as written)
        gpus = values.get("gpus", [])
        ok = isinstance(gpus, list) and all(isinstance(g, dict) for g in gpus)
        gpu_keys = {tuple(g) for g in gpus} if ok else set()
        ok = ok and len(gpu_keys) <= 1 and all(set(keys) <= _GPU_KEY_SET for keys in gpu_keys)
        if ok and any(k in values for k in _TELEMETRY_KEYS):
            telemetry = TelemetrySnapshot.from_json({**values, "t": t})
            taken.update(_TELEMETRY_KEYS)
            keys = next(iter(gpu_keys), _GPU_KEYS)
            gpu_layout = None if keys == _GPU_KEYS else keys
        if isinstance(values.get("error"), str):
            error = values["error"]
            taken.add("error")
        extra = {k: v for k, v in values.items() if k not in taken}
        ev = cls(t, metrics, telemetry, error, extra, gpu_layout=gpu_layout)
        if list(ev._flat()) != list(values):
            ev = dataclasses.replace(ev, layout=tuple(values))
        return ev

    def describe(self) -> str:
        m, tel = self.metrics, self.telemetry

        def f(v: Any) -> str:
            return "-" if v is None else format(v, ".1f")

        line = (
            f"[metrics] kv {f(m and m.kv_usage_pct)}% ({m and m.kv_blocks_used}/"
            f"{m and m.kv_blocks_total} blocks) run {m and m.running} wait {m and m.waiting} "
            f"gen {f(m and m.generation_tokens_per_s)} tok/s ttft p99 {f(m and m.ttft_p99_ms)} "
            f"ms cpu {f(tel and tel.host_cpu_pct)}%"
        )
        return line + (f" ({self.error})" if self.error else "")


_METRICS_KEYS = field_names(MetricsSnapshot)[1:]  # t is the event's
_TELEMETRY_KEYS = field_names(TelemetrySnapshot)[1:]
_GPU_KEYS = field_names(GpuSnapshot)
_GPU_KEY_SET = frozenset(_GPU_KEYS)


@dataclass(frozen=True)
class KvEvent(Event):
    """One tick of vLLM's KV-cache events as the block index saw them (``serve --kv-events``;
    core/monitor/kv_events.py). Totals count since the subscriber started, in blocks; rates are
    since the previous ``kv`` event; ages and lifetimes in seconds. ``vllm_prefix_*``: vLLM's
    own prefix-cache counters (tokens) beside the index's figures. ``groups``: the same per
    KV-cache group (``group``, ``kind``, ``resident``, ``stored``, ``reused``...; ``cells``: the
    block map's runs ``[age bucket, reuse bucket, count]``).
    ``top_prefixes``: the most reused shared prefixes (``id``, ``group``, ``blocks``, ``hits``);
    ``prefix_tokens``: the token ids of a prefix, in the first event that lists its id.
    docs/kv.md defines each figure."""

    kind: ClassVar[str] = "kv"
    blocks_stored_total: int
    blocks_removed_total: int
    blocks_resident: int
    prefix_hit_rate: float | None
    blocks_reused_total: int = 0
    # vLLM's own prefix-cache counters of the same server, read from its /metrics for this
    # event (tokens, since the server started, as the index's totals are; absent: not read):
    # hit tokens / queried tokens, the rate to tune by. The index's ``prefix_hit_rate`` counts
    # only what the events show, and a hit that ends in a partial block shows nothing.
    vllm_prefix_hit_rate: float | None | _Absent = ABSENT
    vllm_prefix_hit_tokens_total: int | _Absent = ABSENT
    vllm_prefix_query_tokens_total: int | _Absent = ABSENT
    stored_per_s: float = 0.0
    removed_per_s: float = 0.0
    evicted_total: int = 0
    evicted_lifetime_mean_s: float | None = None
    resident_age_mean_s: float | None = None
    resident_age_max_s: float | None = None
    cleared_total: int = 0
    seq: int | None = None  # the last sequence number taken
    gaps: int = 0
    batches_replayed: int = 0
    batches_lost: int = 0  # neither received nor replayed: the index may be off since
    groups: list[KvGroupStats] = payloads(KvGroupStats)
    top_prefixes: list[SharedPrefix] = payloads(SharedPrefix)
    prefix_tokens: dict[str, list[int]] = field(default_factory=dict)
    t: float = field(default_factory=now)

    def describe(self) -> str:
        rate = self.prefix_hit_rate
        lost = f" lost {self.batches_lost} batches" if self.batches_lost else ""
        return (
            f"[kv] resident {self.blocks_resident} blocks, stored {self.blocks_stored_total}"
            f" removed {self.blocks_removed_total} evicted {self.evicted_total}, "
            f"prefix hits {'-' if rate is None else format(rate * 100, '.1f') + '%'}{lost}"
        )


@dataclass(frozen=True)
class MarkerEvent(Event):
    """A mark on the Monitor's time axis (core/monitor/timeline.py): ``what`` happened
    (``launch``, ``restart``, ``knobs``, ``fleet``, ``bench``), a short ``label``, and ``diff``:
    what changed, ``{name: [before, after]}`` (``None``: vLLM's default, or not there).
    ``config``: the launch's settings as ``knobs.to_dict`` gives them (launches only), so that
    the next launch's diff can be taken from a recording."""

    kind: ClassVar[str] = "marker"
    what: str
    label: str
    diff: dict[str, list[Any]] = changes()
    config: dict[str, Any] | _Absent = ABSENT
    t: float = field(default_factory=now)

    def describe(self) -> str:
        changed = f" ({len(self.diff)} changed)" if self.diff else ""
        return f"[marker] {self.what}: {self.label}{changed}"


@dataclass(frozen=True)
class RecordingHeader(Event):
    """The first line of a recording."""

    kind: ClassVar[str] = "recording"
    version: int
    t: float | _Absent = field(default_factory=now)
    info: Mapping[str, Any] = flat()  # source, config, model, url...

    def describe(self) -> str:
        source = self.source
        return f"[recording] version {self.version}" + (f" of {source}" if source else "")

    def _text(self, key: str) -> str:
        v = self.info.get(key)
        return v if isinstance(v, str) else ""

    @property
    def source(self) -> str:
        """What was recorded: ``fleet`` for a fleet's, else the server's kind ("": not told)."""
        return self._text("source")

    @property
    def title(self) -> str:
        return self._text("title")

    @property
    def model(self) -> str:
        return self._text("model")

    @property
    def note(self) -> str:
        return self._text("note")

    @property
    def file(self) -> str:
        """A fleet's recording: its fleet file."""
        return self._text("file")


# -- benchmarks (quantdeck.core.bench) --------------------------------------------------------


@dataclass(frozen=True)
class BenchProgress(Event):
    """A measured request finished (``index``: the A/B arm or tuning point measuring)."""

    kind: ClassVar[str] = "progress"
    t_first: ClassVar[bool] = True
    done: int
    total: int
    index: int | _Absent = ABSENT
    ttft_ms: float | None | _Absent = ABSENT
    point: int | _Absent = ABSENT
    t: float = field(default_factory=now)

    def describe(self) -> str:
        ttft = f" (ttft {self.ttft_ms:.0f} ms)" if isinstance(self.ttft_ms, int | float) else ""
        return f"[progress] {self.done}/{self.total} requests{ttft}"


@dataclass(frozen=True)
class ArmEvent(Event):
    """An A/B arm (or a tuning point's run) reached ``stage``."""

    kind: ClassVar[str] = "arm"
    t_first: ClassVar[bool] = True
    index: int
    total: int
    label: str
    stage: str
    error: str | None | _Absent = ABSENT  # when done: why the arm has no result
    point: int | _Absent = ABSENT
    t: float = field(default_factory=now)

    def describe(self) -> str:
        why = f" ({self.error})" if self.error else ""
        return f"[{self.index + 1}/{self.total}] {self.label}: {self.stage}{why}"


@dataclass(frozen=True)
class ArmServerEvent(Event):
    """An event of the server of A/B arm ``index`` (its state changes and start-up progress),
    nested whole: ``{"event": "arm_server", "index": 0, "server": {"event": "state", ...}}``."""

    kind: ClassVar[str] = "arm_server"
    t_first: ClassVar[bool] = True
    index: int
    server: Event
    point: int | _Absent = ABSENT
    t: float = field(default_factory=now)

    def to_json(self) -> dict[str, Any]:
        out = super().to_json()
        out["server"] = self.server.to_json()
        return out

    @classmethod
    def from_fields(cls, data: Mapping[str, Any]) -> Event:
        kw = {k: v for k, v in data.items() if k != "event"}
        kw["server"] = from_json(kw["server"])
        return cls(**kw)

    def describe(self) -> str:
        return f"[arm {self.index + 1}] {self.server.describe()}"


@dataclass(frozen=True)
class PointEvent(Event):
    """A tuning point reached ``stage`` (starting, done), with its figures when done."""

    kind: ClassVar[str] = "point"
    t_first: ClassVar[bool] = True
    index: int
    values: Mapping[str, Any]
    stage: str
    result: Mapping[str, Any] = flat()  # goodput, meets, error, dropped, seconds...
    t: float = field(default_factory=now)

    def describe(self) -> str:
        vals = " ".join(f"{k}={v}" for k, v in self.values.items())
        if self.stage != "done":
            return f"point {self.index}: {vals}: {self.stage}"
        r = self.result
        good = "-" if r.get("goodput") is None else f"{r['goodput']:.2f} req/s"
        note = r.get("dropped") or r.get("error")
        note = note or ("meets" if r.get("meets") else "misses targets")
        return f"point {self.index}: {vals}: goodput {good} ({note})"


# -- workers and jobs (quantdeck.core.workers, quantdeck.core.convert) ------------------------


@dataclass(frozen=True)
class DoneEvent(Event):
    """A worker or job finished: what it made (``out``, ``quant_method``, ``bytes``...)."""

    kind: ClassVar[str] = "done"
    result: Mapping[str, Any] = flat()
    t: float | _Absent = ABSENT

    def describe(self) -> str:
        return "[done] " + " ".join(f"{k}={v}" for k, v in self.result.items())


# -- fleets (quantdeck.core.fleet) ------------------------------------------------------------


@dataclass(frozen=True)
class InstanceEvent(Event):
    """An event of the fleet instance ``instance`` (the router is ``"router"``), written as
    the event's own JSON object plus ``"instance": NAME``: a reader of ``serve``'s events reads
    a fleet's as its own, and an event without an instance is written as it always was."""

    instance: str
    event: Event

    def to_json(self) -> dict[str, Any]:
        return {**self.event.to_json(), "instance": self.instance}

    def describe(self) -> str:
        return f"{self.instance}: {self.event.describe()}"

    @property
    def when(self) -> float | None:
        return self.event.when


@dataclass(frozen=True)
class RestartEvent(Event):
    """A crashed instance is started again after ``delay_s`` (attempt ``attempt`` in a row), or,
    ``gave_up``, no more: it crashed that often without staying up."""

    kind: ClassVar[str] = "restart"
    attempt: int
    delay_s: float
    gave_up: bool = False
    t: float = field(default_factory=now)

    def describe(self) -> str:
        if self.gave_up:
            return f"[restart] restart given up after {self.attempt - 1} in a row"
        return f"[restart] restart {self.attempt} in {self.delay_s:g} s"


@dataclass(frozen=True)
class RouteEvent(Event):
    """The router's workers changed: ``action`` add or remove ``worker``, and why (``reason``:
    crashed, restarted, fallback, recovered)."""

    kind: ClassVar[str] = "route"
    action: str
    worker: str
    reason: str
    ok: bool = True  # False: the router refused or did not answer (``error`` says what)
    error: str | _Absent = ABSENT
    t: float = field(default_factory=now)

    def describe(self) -> str:
        failed = "" if self.ok else f" failed: {self.error}"
        return f"[route] {self.action} {self.worker} ({self.reason}){failed}"


@dataclass(frozen=True)
class FallbackEvent(Event):
    """The fleet's fallback rule switched: ``active`` (the backups take traffic) or not, with
    the figures that made it: the worst primary's ``metric`` value against ``above_ms``, and for
    how long it had been over (or back under)."""

    kind: ClassVar[str] = "fallback"
    active: bool
    metric: str
    value_ms: float | None
    above_ms: float
    held_s: float
    backups: list[str] = field(default_factory=list)
    t: float = field(default_factory=now)

    def describe(self) -> str:
        value = "no data" if self.value_ms is None else f"{self.value_ms:g} ms"
        if self.active:
            return (
                f"[fallback] fallback on: the primaries' {self.metric} {value} > "
                f"{self.above_ms:g} ms for {self.held_s:g} s; {', '.join(self.backups)} take "
                "traffic"
            )
        return (
            f"[fallback] fallback off: {self.metric} {value}, under {self.above_ms:g} ms for "
            f"{self.held_s:g} s"
        )


@dataclass(frozen=True)
class TrialEvent(Event):
    """A step of a live trial of one fleet instance (sent as that instance's event): the
    candidate config ``knobs`` (``{knob: [incumbent's, candidate's]}``) on ``candidate`` (its
    URL), judged on ``goal``. ``phase``: ``admitted``, ``started``, ``measuring`` (with the
    running ``verdict`` and both ``arms``' figures), ``decided`` (``decision`` promote or
    rollback, its ``reason``, the figures it was made on), ``promoted`` or ``rolled back`` (the
    decision carried out), or ``refused`` (``reason``: why nothing started). ``undo``: this is
    ``fleet undo`` of the last promotion (the launch from before, promoted once it serves; no
    comparison), not a trial: ``knobs`` go from the promoted launch back to the one before."""

    kind: ClassVar[str] = "trial"
    phase: str
    candidate: str = ""
    knobs: dict[str, list[Any]] = changes()
    goal: str = ""
    verdict: Verdict | None | _Absent = payload(Verdict, empty_none=True)
    arms: TrialArms | _Absent = payload(TrialArms)
    decision: str | _Absent = ABSENT
    reason: str | _Absent = ABSENT
    undo: bool | _Absent = ABSENT
    t: float = field(default_factory=now)

    def describe(self) -> str:
        changed = ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in self.knobs.items())
        if self.phase == "admitted":
            return f"[trial] admitted: {changed or 'the same knobs'} ({self.reason or ''})"
        if self.phase == "measuring" and isinstance(self.verdict, Verdict):
            return f"[trial] measuring: {self.verdict.describe()}"
        if self.phase == "decided":
            return f"[trial] decided: {self.decision} ({self.reason})"
        return f"[trial] {self.phase}" + (f": {self.reason}" if self.reason else "")


@dataclass(frozen=True)
class LiveTuneEvent(Event):
    """A step of a live tuning chain (``tune --live``; core/bench/live_tune.py): candidate
    ``step`` (1, 2...) of the chain, the running launch with one knob changed (``knobs``:
    ``{knob: [incumbent's, candidate's]}``). ``phase``: ``trying`` (sent to the fleet as a
    trial), ``tried`` (``result``: promoted, rolled back, refused (nothing started; skipped) or
    failed (the chain stops); the trial's ``decision``, its ``reason`` and ``verdict``; with a
    goal (``tune --live --until``), ``meets``: whether a promoted launch meets it), or
    ``finished`` (``reason``: why the chain ended; ``trials``: every step's summary;
    ``launch``: the instance's launch knobs as they run now)."""

    kind: ClassVar[str] = "live_tune"
    phase: str
    step: int = 0
    knobs: dict[str, list[Any]] = changes()
    result: str | _Absent = ABSENT
    decision: str | None | _Absent = ABSENT
    reason: str | _Absent = ABSENT
    verdict: Verdict | None | _Absent = payload(Verdict)
    meets: bool | _Absent = ABSENT
    trials: list[dict[str, Any]] | _Absent = ABSENT
    launch: dict[str, Any] | _Absent = ABSENT
    t: float = field(default_factory=now)

    def describe(self) -> str:
        changed = ", ".join(f"{k} {a!r} -> {b!r}" for k, (a, b) in self.knobs.items())
        if self.phase == "trying":
            return f"[tune] trial {self.step}: {changed}"
        if self.phase == "tried":
            why = f" ({self.reason})" if self.reason else ""
            goal = ""
            if isinstance(self.meets, bool):
                goal = "; meets the goal" if self.meets else "; misses the goal"
            return f"[tune] trial {self.step}: {changed}: {self.result}{why}{goal}"
        if self.phase == "finished":
            trials = self.trials or []
            ran = sum(1 for s in trials if s.get("result") in ("promoted", "rolled back"))
            won = sum(1 for s in trials if s.get("result") == "promoted")
            trials_ = "trial" if ran == 1 else "trials"
            return f"[tune] finished: {ran} {trials_}, {won} promoted ({self.reason or ''})"
        return f"[tune] {self.phase}" + (f": {self.reason}" if self.reason else "")


def from_json(data: Mapping[str, Any]) -> Event:
    """The event a JSON object describes (as :meth:`Event.to_json` wrote it). Raises
    ``ValueError`` for an object that is not one."""
    if not isinstance(data, Mapping) or not isinstance(data.get("event"), str):
        raise ValueError("not an event: no 'event' key")
    if isinstance(data.get("instance"), str):
        inner = {k: v for k, v in data.items() if k != "instance"}
        return InstanceEvent(data["instance"], from_json(inner))
    kind = data["event"]
    if kind == "progress":  # a stage's progress, or a benchmark's
        cls: type[Event] = BenchProgress if "done" in data else ProgressEvent
    else:
        cls = _KINDS.get(kind, _Unknown)
    try:
        if cls is _Unknown:
            return _Unknown(name=kind, fields={k: v for k, v in data.items() if k != "event"})
        return cls.from_fields(data)
    except TypeError as e:
        raise ValueError(f"'{kind}' event: {e}") from None
    except KeyError as e:  # a nested event's key (arm_server's 'server')
        raise ValueError(f"'{kind}' event: no {e}") from None


@dataclass(frozen=True)
class _Unknown(Event):
    """An event of a kind this version does not know (a newer recording): kept as it was."""

    name: str = ""
    fields: Mapping[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"event": self.name, **self.fields}


# -- publish / subscribe ----------------------------------------------------------------------

E = TypeVar("E")


class Publisher(Generic[E]):
    """Observers of one emitter. ``subscribe`` returns the function that unsubscribes.

    ``emit`` calls every observer in the emitter's thread, in subscription order. An observer's
    exception is logged once per observer, with its traceback, and delivery goes on.
    """

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self._observers: list[Callable[[E], None]] = []
        self._failed: set[int] = set()
        self._lock = threading.Lock()

    def subscribe(self, fn: Callable[[E], None]) -> Callable[[], None]:
        with self._lock:
            self._observers.append(fn)

        def unsubscribe() -> None:
            with self._lock:
                if fn in self._observers:
                    self._observers.remove(fn)

        return unsubscribe

    def emit(self, event: E) -> None:
        with self._lock:
            observers = list(self._observers)
        for fn in observers:
            try:
                fn(event)
            except Exception:
                if id(fn) not in self._failed:
                    self._failed.add(id(fn))
                    log.exception("an observer of %s failed on %r", self.owner, event)

    def __len__(self) -> int:
        return len(self._observers)
