"""Auto-tune: the launch knobs that give the most goodput under latency targets.

Search space: max_num_seqs, max_num_batched_tokens, chunked prefill, block size and (on a GPU)
gpu_memory_utilization by default; with ``--space``, any knob that changes how the engine serves
(eager mode, the performance mode, speculative decoding, CUDA-graph mode, ...) and any other
option of the engine (``vllm:NAME``), as :mod:`quantdeck.core.bench.space` reads them; every
point is a fresh server start with one knob set changed and the same load. Objective: request
goodput (requests/s whose TTFT <= ``ttft_ms`` and TPOT <= ``tpot_ms``, as ``vllm bench serve
--goodput`` counts them); a point *meets* the targets when its p99 TTFT and p99 TPOT are within
them too.

Strategy (``coordinate``): start from the base config; for each knob in the space's order,
try its candidate values with the others at the best so far, walking outward from the current value
and turning back when goodput drops (down only when the first step up gained nothing); keep the
best. A point is dropped early once it has more SLO-missing or failed requests than the best point
had requests left over, since it can then no longer win. ``grid`` measures every combination (the
yardstick for the tuner)."""

from __future__ import annotations

import dataclasses
import itertools
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from quantdeck.core.bench.ab import ABRun, Arm
from quantdeck.core.bench.client import LoadSpec, RequestRecord
from quantdeck.core.bench.results import BenchResult, PointFigures, TuneResult
from quantdeck.core.bench.space import (
    apply_point,
    check_key,
    default_space,
    parse_space,
    space_value,
)
from quantdeck.core.errors import ConfigError
from quantdeck.core.events import (
    ArmEvent,
    ArmServerEvent,
    BenchProgress,
    Event,
    PointEvent,
    Publisher,
)
from quantdeck.core.launch import LaunchConfig, to_dict
from quantdeck.core.runtime import EngineEnv

EventFn = Callable[[Event], None]

__all__ = ["Point", "Tuner", "apply_point", "default_space", "parse_space", "point_outcome"]


def point_outcome(result: PointFigures | Mapping[str, Any]) -> str:
    """What became of a tuning point, in one line, from its figures (a ``point`` event's
    result when done, or an entry of the run's ``points``): why it has no goodput (an error,
    dropped early, cancelled), or its goodput and whether its p99 latencies meet the targets."""
    p = result if isinstance(result, PointFigures) else PointFigures.from_json(result)
    if p.error:
        return f"error: {p.error}"
    if p.dropped:
        return p.dropped
    if p.goodput is None:
        return "no result (cancelled)"
    meets = "meets the p99 targets" if p.meets else "misses the p99 targets"
    return f"goodput {p.goodput:.2f} req/s, {meets}"


def _tag_point(ev: Event, n: int) -> Event:
    """``ev`` tagged with tuning point ``n`` where its kind carries one (arm, progress, arm
    server); any other event as it is."""
    if isinstance(ev, (ArmEvent, BenchProgress, ArmServerEvent)):
        return dataclasses.replace(ev, point=n)
    return ev


@dataclass
class Point:
    values: dict[str, Any]
    goodput: float | None = None  # requests/s within the SLO
    meets: bool = False  # p99 TTFT and p99 TPOT within the targets
    dropped: str | None = None
    error: str | None = None
    seconds: float = 0.0
    result: BenchResult | None = field(default=None, repr=False)

    def key(self) -> tuple[tuple[str, str], ...]:
        # by each value's repr: an engine option's JSON object is no dict key
        return tuple(sorted((k, repr(v)) for k, v in self.values.items()))

    def to_json(self) -> dict[str, Any]:
        r = self.result or BenchResult()
        return {
            "values": self.values,
            "goodput": self.goodput,
            "meets": self.meets,
            "dropped": self.dropped,
            "error": self.error,
            "seconds": round(self.seconds, 1),
            "p99_ttft_ms": r.p99_ttft_ms,
            "p99_tpot_ms": r.p99_tpot_ms,
            "output_throughput": r.output_throughput,
            "completed": r.completed,
            "failed": r.failed,
        }


class Tuner:
    def __init__(
        self,
        base: LaunchConfig,
        spec: LoadSpec,
        *,
        ttft_ms: float,
        tpot_ms: float,
        space: dict[str, list[Any]],
        strategy: str = "coordinate",
        max_points: int | None = None,
        engine: EngineEnv | None = None,
        warmups: int = 1,
        on_event: EventFn | None = None,
    ) -> None:
        if not ttft_ms > 0 or not tpot_ms > 0:
            raise ConfigError("tune needs latency targets: --ttft-ms and --tpot-ms (> 0)")
        if strategy not in ("coordinate", "grid"):
            raise ConfigError(f"--strategy: '{strategy}' is not one of coordinate, grid")
        for knob, values in space.items():
            check_key(knob)
            if not values:
                raise ConfigError(f"tune: no candidate values for {knob}")
        spec.check()
        self.base, self.spec, self.space = base.copy(), spec, space
        self.slo = {"ttft": float(ttft_ms), "tpot": float(tpot_ms)}
        self.strategy, self.max_points = strategy, max_points
        self.engine, self.warmups = engine, warmups
        self._events: Publisher[Event] = Publisher("tuner")
        if on_event is not None:
            self._events.subscribe(on_event)
        self.points: dict[tuple[tuple[str, str], ...], Point] = {}
        self.best: Point | None = None
        self._cancel = threading.Event()
        self._run: ABRun | None = None

    def cancel(self) -> None:
        self._cancel.set()
        if self._run is not None:
            self._run.cancel()

    def subscribe(self, fn: EventFn) -> Callable[[], None]:
        """Call ``fn`` with every :class:`PointEvent` and, tagged with their point, the events
        of the point's run (arm, progress, its server's states)."""
        return self._events.subscribe(fn)

    def _emit(self, ev: Event) -> None:
        self._events.emit(ev)

    # -- one point ---------------------------------------------------------------------------
    def _hopeless(self, records: list[RequestRecord]) -> str | None:
        if self.best is None or not self.best.result:
            return None
        best_good = self.best.result.good_completed or 0
        bad = sum(
            1
            for r in records
            if not r.success or r.ttft * 1000 > self.slo["ttft"] or r.tpot * 1000 > self.slo["tpot"]
        )
        n = self.spec.num_prompts
        if bad > n - best_good:
            return (
                f"dropped: {bad} of {n} requests missed the targets, more than the best "
                f"point's {n - best_good}: it cannot win"
            )
        return None

    def measure(self, values: dict[str, Any]) -> Point:
        point = Point(dict(values))
        if point.key() in self.points:
            return self.points[point.key()]
        self.points[point.key()] = point
        n = len(self.points)
        self._emit(PointEvent(n, point.values, "starting"))
        t0 = time.time()
        try:
            cfg = apply_point(self.base, values)
        except ConfigError as e:
            point.error = str(e)
            self._emit(PointEvent(n, point.values, "done", self._result(point)))
            return point
        run = ABRun(
            [Arm(f"point {n}", cfg)],
            self.spec,
            slo=self.slo,
            engine=self.engine,
            warmups=self.warmups,
            on_event=lambda ev: self._emit(_tag_point(ev, n)),
            stop_when=self._hopeless,
        )
        self._run = run
        arm = run.run_arm(Arm(f"point {n}", cfg), n)
        self._run = None
        point.seconds = time.time() - t0
        point.error = arm.error
        res = arm.result
        if res is not None:
            point.result = res
            ended = res.ended_early
            point.dropped = ended if ended and ended.startswith("dropped") else None
            if point.dropped is None and not ended:
                point.goodput = res.request_goodput
                point.meets = (
                    res.p99_ttft_ms is not None
                    and res.p99_tpot_ms is not None
                    and res.p99_ttft_ms <= self.slo["ttft"]
                    and res.p99_tpot_ms <= self.slo["tpot"]
                )
                if self.best is None or (point.goodput or 0) > (self.best.goodput or 0):
                    self.best = point
        self._emit(PointEvent(n, point.values, "done", self._result(point)))
        return point

    @staticmethod
    def _result(point: Point) -> dict[str, Any]:
        return {k: v for k, v in point.to_json().items() if k != "values"}

    def planned_points(self) -> int:
        """The most points this run measures: the grid's size, or for the coordinate walk the
        start and every other candidate of each knob; at most ``max_points``."""
        if self.strategy == "grid":
            n = 1
            for values in self.space.values():
                n *= len(values)
        else:
            n = 1 + sum(len(values) - 1 for values in self.space.values())
        return n if self.max_points is None else min(n, self.max_points)

    def _budget_left(self) -> bool:
        return not self._cancel.is_set() and (
            self.max_points is None or len(self.points) < self.max_points
        )

    # -- strategies --------------------------------------------------------------------------
    def run(self) -> TuneResult:
        t0 = time.time()
        # the start point is the base config with the knobs' start values: checking it checks
        # the base's model and settings too
        ABRun([Arm("start", apply_point(self.base, self.start_values()))], self.spec).preflight()
        if self.strategy == "grid":
            self._grid()
        else:
            self._coordinate()
        # in the order a run file was always written in (TuneResult keeps it)
        return TuneResult.from_json(
            {
                "kind": "tune",
                "strategy": self.strategy,
                "slo_ms": self.slo,
                "load": self.spec.__dict__,
                "space": self.space,
                "base": to_dict(self.base),
                "seconds": round(time.time() - t0, 1),
                "cancelled": self._cancel.is_set(),
                "points": [p.to_json() for p in self.points.values()],
                "best": self.best.to_json() if self.best else None,
                "best_config": to_dict(apply_point(self.base, self.best.values))
                if self.best
                else None,
            }
        )

    def start_values(self) -> dict[str, Any]:
        """Each knob's candidate nearest the base config's value (middle if unset)."""
        values = {}
        for knob, cands in self.space.items():
            cur = space_value(self.base, knob)
            if cur in cands:
                values[knob] = cur
            elif (
                isinstance(cur, (int, float))
                and not isinstance(cur, bool)
                and all(isinstance(c, (int, float)) for c in cands)
            ):
                values[knob] = min(cands, key=lambda c: abs(c - cur))
            else:
                values[knob] = cands[len(cands) // 2] if cur is None else cands[0]
        return values

    def _grid(self) -> None:
        knobs = list(self.space)
        for combo in itertools.product(*(self.space[k] for k in knobs)):
            if not self._budget_left():
                return
            self.measure(dict(zip(knobs, combo, strict=True)))

    def _coordinate(self) -> None:
        current = self.start_values()
        self.measure(current)
        for knob, cands in self.space.items():
            if not self._budget_left():
                return
            best = self.best.values if self.best else current
            i0 = cands.index(best[knob])
            # walk up from the current value while goodput improves; only when the first step
            # up gained nothing, walk down the same way (goodput is taken to have one peak)
            for direction in (1, -1):
                i, gained = i0 + direction, False
                while 0 <= i < len(cands) and self._budget_left():
                    before = self.best.goodput if self.best else None
                    self.measure({**(self.best.values if self.best else current), knob: cands[i]})
                    if self.best is None or self.best.goodput == before:
                        break  # no gain this way: turn back
                    gained = True
                    i += direction
                if gained:
                    break
            current = self.best.values if self.best else current
