"""Tune, live: the tuner's coordinate search as a chain of live trials on a running fleet.

Each candidate is the instance's running launch (the incumbent, the best so far) with one knob
of the space changed, tried beside it on the operator's own traffic (``fleet try``'s trial: the
fleet starts the candidate, compares the two arms and promotes or rolls back by the verdict). A
promoted candidate becomes the incumbent, and the next candidates change it. The traffic never
sees a restart: that is the trial's.

The walk (:class:`LiveSearch`) is the offline tuner's coordinate walk (core/bench/tune.py),
with a trial's decision in place of a goodput comparison: for each knob in the space's order,
walk up the candidate list from the running value while candidates are promoted, and down only
when the first step up was not; the next knob starts from the best so far. Where the offline
tuner makes one pass, the chain makes another after any promotion (an earlier knob may have
another best beside the new launch) and stops after a pass without one; a point tried once is
not tried again (a loser stays a loser: the incumbent it lost to was no better than today's).
Two cases the offline tuner does not have, since it starts from a listed value:

- a running value between two numeric candidates: up walks the larger ones from the nearest,
  down the smaller ones from the nearest;
- a running value that cannot be placed (unset: vLLM's default; a choice not in the list):
  each candidate in the list's order, against the best so far.

A candidate the fleet refuses (it does not fit; nothing started) or that is no valid launch is
reported and skipped: the walk goes on to the next value the same way. The chain ends when the
space is exhausted, at the budget (trials that ran, or seconds: no trial starts after it), at
the goal (``until``: a promoted launch meets every limit, read on the candidate arm's figures
the trial decided on), on cancel (between trials), or when the fleet goes away (a ``failed``
trial).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from quantdeck.core.bench.results import LiveTuneResult
from quantdeck.core.bench.space import apply_point, check_key, space_value
from quantdeck.core.errors import ConfigError, QuantdeckError
from quantdeck.core.events import ABSENT, Event, LiveTuneEvent, Publisher, TrialEvent
from quantdeck.core.launch import LaunchConfig, to_dict
from quantdeck.core.launch.diff import knob_diff
from quantdeck.core.payloads import ArmFigures, TrialArms, Verdict

RESULTS = ("promoted", "rolled back", "refused", "failed")
# the limits ``until`` may name (as ``--slo`` writes them) and the arm figure each is read on
# (core/fleet/trial.py ArmSpan.figures: p50 and p99 of TTFT, ITL and E2E, in ms)
UNTIL_FIGURES = {f"{m}_{q}": f"{m}_{q}_ms" for m in ("ttft", "itl", "e2e") for q in ("p50", "p99")}


@dataclass(frozen=True)
class TrialOutcome:
    """What became of one candidate: ``result`` promoted or rolled back (a trial ran and its
    decision was carried out), refused (nothing started: skipped), or failed (no decision came:
    the fleet went away; the chain stops); the trial's ``decision``, ``reason`` (or why refused
    or failed), ``verdict`` and ``figures``: the candidate arm's figures the
    decision was made on (the ``decided`` event's ``arms["candidate"]``: what ``until`` reads)."""

    result: str
    reason: str = ""
    decision: str | None = None
    verdict: Verdict | None = None
    figures: ArmFigures | None = None

    def __post_init__(self) -> None:
        if self.result not in RESULTS:
            raise ValueError(f"trial result {self.result!r}: one of {', '.join(RESULTS)}")


def carried_out(result: str, decided: TrialEvent | None) -> TrialOutcome:
    """What became of a trial whose decision was carried out (``result`` promoted or rolled
    back), from its ``decided`` event (None: none came): the decision, its reason, the verdict
    and the candidate's figures it was made on."""
    if decided is None:
        return TrialOutcome(result)
    arms = decided.arms if isinstance(decided.arms, TrialArms) else None
    return TrialOutcome(
        result,
        reason=decided.reason if isinstance(decided.reason, str) else "",
        decision=decided.decision if isinstance(decided.decision, str) else None,
        verdict=decided.verdict if isinstance(decided.verdict, Verdict) else None,
        figures=arms.candidate if arms is not None else None,
    )


def check_until(until: dict[str, float]) -> dict[str, float]:
    """The goal's limits (``{"ttft_p99": ms, ...}``, as core.fleet.trial's ``parse_slo`` reads
    ``--slo``): ConfigError, in one line, for a limit on a figure the trials do not report."""
    for name, limit in until.items():
        if name not in UNTIL_FIGURES:
            raise ConfigError(
                f"--until {name}: the trials report {', '.join(UNTIL_FIGURES)} (ms) to meet"
            )
        if not (_number(limit) and limit > 0):
            raise ConfigError(f"--until {name}: the limit must be a positive number of ms")
    return dict(until)


def until_text(until: dict[str, float]) -> str:
    """The goal as ``--until`` writes it: ``ttft_p99<=200ms,itl_p99<=50ms``."""
    return ",".join(f"{name}<={limit:g}ms" for name, limit in until.items())


def goal_met(until: dict[str, float], figures: ArmFigures | None) -> tuple[bool, str]:
    """Whether ``figures`` (an arm's, as a trial reports them) meet every limit of ``until``,
    and each limit's reading (``ttft_p99 150 ms <= 200 ms``); a figure the arm lacks misses."""
    met, parts = True, []
    for name, limit in until.items():
        value = figures.figure(UNTIL_FIGURES[name]) if figures is not None else None
        if value is None:
            met = False
            parts.append(f"{name}: no figure")
        elif value <= limit:
            parts.append(f"{name} {value:g} ms <= {limit:g} ms")
        else:
            met = False
            parts.append(f"{name} {value:g} ms > {limit:g} ms")
    return met, ", ".join(parts)


def _key(point: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, repr(v)) for k, v in point.items()))


def _number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def walks(current: Any, candidates: list[Any]) -> tuple[str, list[list[Any]]]:
    """How one knob is walked from its ``current`` value: ``("walk", [up, down])`` (each way
    tried while its candidates are promoted; down only when up gained nothing), or
    ``("each", [candidates])`` (every one tried) where the value cannot be placed."""
    if current in candidates:
        i = candidates.index(current)
        return "walk", [candidates[i + 1 :], candidates[:i][::-1]]
    if _number(current) and all(_number(c) for c in candidates):
        up = sorted(c for c in candidates if c > current)
        down = sorted((c for c in candidates if c < current), reverse=True)
        return "walk", [up, down]
    return "each", [list(candidates)]


class LiveSearch:
    """The coordinate walk of a live tuning chain over ``space`` (``{knob: [values]}``, as
    :func:`~quantdeck.core.bench.space.parse_space` reads it) from the running values ``start``
    (``{knob: value}`` of every knob of the space). :meth:`next` gives the next candidate (the
    best so far with one knob changed), :meth:`tell` what became of it; None: the space is
    exhausted."""

    def __init__(self, space: dict[str, list[Any]], start: dict[str, Any]) -> None:
        for knob, values in space.items():
            check_key(knob)
            if not values:
                raise ConfigError(f"tune: no candidate values for {knob}")
            if knob not in start:
                raise ConfigError(f"tune: no running value of {knob}")
        self.space = {k: list(v) for k, v in space.items()}
        self.best = {k: start[k] for k in space}  # the incumbent's values of the space's knobs
        self._seen = {_key(self.best)}  # points tried (or the incumbent's, which won)
        self._refused: set[tuple[tuple[str, str], ...]] = set()
        self._pending: dict[str, Any] | None = None
        self._result = ""
        self._walk = self._coordinate()

    def next(self) -> dict[str, Any] | None:
        """The next candidate point (every knob of the space), or None: nothing left."""
        if self._pending is not None:
            raise RuntimeError("tell() what became of the last candidate first")
        self._pending = next(self._walk, None)
        return None if self._pending is None else dict(self._pending)

    def tell(self, result: str) -> None:
        """What became of the last candidate (a :data:`RESULTS` word): promoted makes it the
        best so far."""
        if self._pending is None:
            raise RuntimeError("no candidate to tell of")
        if result not in RESULTS:
            raise ValueError(f"trial result {result!r}: one of {', '.join(RESULTS)}")
        self._result = result
        if result == "promoted":
            self.best = dict(self._pending)
        elif result == "refused":
            self._refused.add(_key(self._pending))
        self._pending = None

    def _coordinate(self) -> Iterator[dict[str, Any]]:
        while True:
            promoted = False
            for knob, cands in self.space.items():
                how, ways = walks(self.best[knob], cands)
                for way in ways:
                    gained = False
                    for value in way:
                        point = {**self.best, knob: value}
                        key = _key(point)
                        if key in self._refused:
                            continue  # refused before (it did not fit): the next one this way
                        if key in self._seen:
                            if how == "each":
                                continue
                            break  # judged before, not better: no gain this way
                        self._seen.add(key)
                        yield point
                        if self._result == "promoted":
                            gained = promoted = True
                        elif self._result != "refused" and how == "walk":
                            break  # not better: turn back
                    if gained:
                        break  # up gained: no walk down
            if not promoted:
                return


@dataclass
class LiveStep:
    """One candidate of the chain and what became of it."""

    step: int
    knobs: dict[str, list[Any]]
    outcome: TrialOutcome
    seconds: float = 0.0
    meets: bool | None = None  # a promoted launch against the goal (None: no goal, or not run)

    def to_json(self) -> dict[str, Any]:
        o = self.outcome
        out = {
            "step": self.step,
            "knobs": self.knobs,
            "result": o.result,
            "decision": o.decision,
            "reason": o.reason,
            "outcome": o.verdict.outcome if o.verdict is not None else None,
            "seconds": round(self.seconds, 1),
        }
        if self.meets is not None:
            out["meets"] = self.meets
        return out


TrialFn = Callable[[LaunchConfig], TrialOutcome]
LaunchFn = Callable[[], LaunchConfig]


class LiveTuner:
    """A live tuning chain over ``space``. :meth:`run` takes ``launch`` (the instance's launch
    as it runs now: the incumbent, read again before each candidate and at the end) and
    ``trial`` (tries a candidate launch on the fleet and returns its :class:`TrialOutcome`);
    ``budget``: the most trials that run (refused candidates do not count), ``budget_s``: no
    trial starts after this many seconds, ``until``: the goal's limits (``{"ttft_p99": ms}``,
    see :data:`UNTIL_FIGURES`): the chain ends once a promoted launch meets every one, read on
    the candidate's figures in its trial (a rolled-back one's never count). Every step is a
    :class:`LiveTuneEvent`."""

    def __init__(
        self,
        space: dict[str, list[Any]],
        *,
        budget: int | None = None,
        budget_s: float | None = None,
        until: dict[str, float] | None = None,
        on_event: Callable[[Event], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not space:
            raise ConfigError("tune --live: an empty space (give --space KNOB=V1,V2)")
        for knob, values in space.items():
            check_key(knob)
            if not values:
                raise ConfigError(f"tune: no candidate values for {knob}")
        if budget is not None and budget < 1:
            raise ConfigError("--budget: at least 1 trial")
        if budget_s is not None and not budget_s > 0:
            raise ConfigError("--budget-s: a positive number of seconds")
        self.space, self.budget, self.budget_s = space, budget, budget_s
        self.until = check_until(until) if until else None
        self._clock = clock
        self._events: Publisher[Event] = Publisher("live tuner")
        if on_event is not None:
            self._events.subscribe(on_event)
        self._cancel = threading.Event()
        self.steps: list[LiveStep] = []
        self._known = LaunchConfig()  # the instance's launch as last read

    def subscribe(self, fn: Callable[[Event], None]) -> Callable[[], None]:
        return self._events.subscribe(fn)

    def cancel(self) -> None:
        """No further trial starts (the one under way is the caller's to stop)."""
        self._cancel.set()

    @staticmethod
    def values(cfg: LaunchConfig, space: dict[str, list[Any]]) -> dict[str, Any]:
        """The running values of the space's knobs in ``cfg`` (an engine option it does not set:
        None)."""
        return {knob: space_value(cfg, knob) for knob in space}

    def run(self, launch: LaunchFn, trial: TrialFn) -> LiveTuneResult:
        """The chain, until the space is exhausted, the budget, the goal, a cancel or a failed
        trial; the chain's result (``ended``: why; ``failed``: True when the fleet went away;
        ``goal_met``: None without ``until``, else whether trial ``met_by``'s launch met it)."""
        t0 = self._clock()
        start = self._known = launch()
        search = LiveSearch(self.space, self.values(start, self.space))
        failed, ended = False, ""
        met_by: int | None = None  # the trial whose promoted launch met the goal
        while not ended:
            ran = sum(1 for s in self.steps if s.outcome.result in ("promoted", "rolled back"))
            if self._cancel.is_set():  # the operator's stop, whatever was left to try
                ended = "stopped"
                continue
            point = search.next()
            if point is None:
                ended = "the space is exhausted: no candidate left to try"
                if not ran:
                    ended = "nothing ran: " + (
                        "every candidate was refused" if self.steps else "no candidate to try"
                    )
            elif self.budget is not None and ran >= self.budget:
                ended = f"the budget: {self.budget} trials"
            elif self.budget_s is not None and self._clock() - t0 >= self.budget_s:
                ended = f"the budget: {self.budget_s:g} s"
            else:
                step = self._step(len(self.steps) + 1, point, search, launch, trial)
                search.tell(step.outcome.result)
                if step.outcome.result == "failed":
                    failed, ended = True, step.outcome.reason
                elif step.meets:
                    met_by = step.step
                    _, reading = goal_met(self.until or {}, step.outcome.figures)
                    ended = f"the goal: trial {step.step}'s launch meets it ({reading})"
        try:
            current = launch()
        except QuantdeckError as e:  # the launch as last read stands for it
            current = self._known
            failed, ended = True, f"{ended}; the fleet's state: {e}"
        # the port is a trial's own (a promoted candidate keeps its port): not a knob tuned
        changed = {k: [a, b] for k, (a, b) in knob_diff(start, current).items() if k != "port"}
        trials = [s.to_json() for s in self.steps]
        final = to_dict(current)
        self._events.emit(LiveTuneEvent("finished", reason=ended, trials=trials, launch=final))
        # the order of its keys as it was always written (LiveTuneResult keeps it)
        return LiveTuneResult.from_json(
            {
                "kind": "live_tune",
                "space": self.space,
                "budget": self.budget,
                "budget_s": self.budget_s,
                "until": self.until,
                # None without a goal; else whether a promoted launch met it, and which trial's
                "goal_met": None if self.until is None else met_by is not None,
                "met_by": met_by,
                "seconds": round(self._clock() - t0, 1),
                "ended": ended,
                "failed": failed,
                "cancelled": self._cancel.is_set(),
                "trials": trials,
                "start": self.values(start, self.space),
                "best": self.values(current, self.space),
                "changed": changed,
                "launch": final,
            }
        )

    def _step(
        self,
        n: int,
        point: dict[str, Any],
        search: LiveSearch,
        launch: LaunchFn,
        trial: TrialFn,
    ) -> LiveStep:
        t0 = self._clock()
        changed = {k: v for k, v in point.items() if search.best[k] != v}
        knobs = {k: [search.best[k], v] for k, v in changed.items()}
        try:
            base = self._known = launch()
        except QuantdeckError as e:
            return self._done(LiveStep(n, knobs, TrialOutcome("failed", str(e))))
        try:
            cfg = apply_point(base, changed)
        except ConfigError as e:  # no valid launch: refused before the fleet is asked
            return self._done(LiveStep(n, knobs, TrialOutcome("refused", str(e))))
        self._events.emit(LiveTuneEvent("trying", n, knobs))
        outcome = trial(cfg)
        meets = None
        if self.until is not None and outcome.result == "promoted":
            meets, _ = goal_met(self.until, outcome.figures)
        return self._done(LiveStep(n, knobs, outcome, self._clock() - t0, meets))

    def _done(self, step: LiveStep) -> LiveStep:
        self.steps.append(step)
        o = step.outcome
        self._events.emit(
            LiveTuneEvent(
                "tried",
                step.step,
                step.knobs,
                result=o.result,
                decision=o.decision,
                reason=o.reason,
                verdict=o.verdict,
                meets=ABSENT if step.meets is None else step.meets,  # a goal's only
            )
        )
        return step
