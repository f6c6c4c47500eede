"""What a live trial's events carry, typed: its verdict and each arm's figures (issue 44).

The trial events (``TrialEvent``, ``LiveTuneEvent``) carried these as string-keyed mappings,
read back by string in the Trial view, the Tune page and the CLI. They are the core's
dataclasses now, from the judge (core/fleet/trial.py) to the widget; they are flattened only in
``to_json`` and read back by ``from_json``, in the keys and order they were always written (a
recording stays byte for byte). They sit beneath ``core.events`` (which imports them), as the
metrics snapshots do.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from quantdeck.core.evidence import BETTER, EQUIVALENT, INCONCLUSIVE, WORSE, Effect

_D = TypeVar("_D")


def _fields_of(cls: type[_D], data: Mapping[str, Any], skip: tuple[str, ...] = ()) -> _D:
    """``cls`` from the keys of ``data`` that are its fields (a key ``skip`` names is derived
    and written only); TypeError, as a bad event is refused, for a key it does not know."""
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(data) - names - set(skip))
    if unknown:
        raise TypeError(f"{cls.__name__}: unknown keys {', '.join(unknown)}")
    return cls(**{k: v for k, v in data.items() if k in names})


# what a verdict written before issue 45 carried and a reader no longer needs (its test's p)
_LEGACY_VERDICT = ("confidence", "test", "p_value", "threshold")


@dataclass(frozen=True)
class Verdict:
    """The running answer on the goal, in the goal's own figure (``figure``: ``TTFT p99``):
    ``better`` or ``worse`` (the effect's interval lies beyond the margin), ``equivalent``
    (inside it on both sides) or ``inconclusive`` (neither yet; ``needed``: about how many
    more requests an arm would settle it). The effect is the candidate's figure over the
    incumbent's (``kind`` "ratio"; goodput: the difference in points), ``lo``–``hi`` its
    interval, valid at every look (core/evidence.py); ``source`` says what it was read from
    (the arms' histograms, the probe's requests). Verdicts recorded before issue 45 read back
    with their words ("no difference", "undecided") and without an interval."""

    outcome: str
    goal: str = ""
    figure: str = ""
    source: str = ""
    effect: float | None = None
    lo: float | None = None
    hi: float | None = None
    kind: str = "ratio"
    incumbent: float | None = None  # the goal figure per arm (ms, tokens/s, %)
    candidate: float | None = None
    n_incumbent: int = 0
    n_candidate: int = 0
    margin: float = 0.0
    needed: int | None = None
    reason: str = ""

    @property
    def effect_estimate(self) -> Effect:
        return Effect(
            self.effect,
            0.0 if self.lo is None else self.lo,
            math.inf if self.hi is None else self.hi,
            self.kind,
        )

    def describe(self) -> str:
        """The verdict in one line, as the Trial view, the CLI and the live tune's table say
        it: ``TTFT p99 210 → 151 ms, ×0.72 [0.61–0.85]: better (beyond the 10 % margin) ·
        812 / 790 requests``; an inconclusive one with what would settle it."""
        counts = f"{self.n_incumbent} / {self.n_candidate} requests"
        if self.effect is None:
            head = f"{self.figure or self.goal}: {self.outcome}"
            return f"{head} ({self.reason}) · {counts}" if self.reason else f"{head} · {counts}"
        margin = f"{self.margin:.0%}".replace("%", " %")
        words = {
            BETTER: f"better (beyond the {margin} margin)",
            WORSE: f"worse (beyond the {margin} margin)",
            EQUIVALENT: f"equivalent (no difference larger than {margin})",
        }.get(self.outcome, self.outcome)
        if self.outcome == INCONCLUSIVE:
            words += (
                f": about {self.needed:,} more requests an arm would settle it"
                if self.needed
                else f": the interval does not clear the margin ({self.source or 'its figures'})"
            )
        figures = ""
        if self.incumbent is not None and self.candidate is not None:
            unit = {"goodput": " %", "throughput": " tok/s"}.get(self.goal, " ms")
            figures = f" {self.incumbent:,.4g} → {self.candidate:,.4g}{unit},"
        head = f"{self.figure or self.goal}{figures} {self.effect_estimate.text()}"
        return f"{head}: {words} · {counts}"

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Verdict:
        return _fields_of(cls, data, skip=_LEGACY_VERDICT)


@dataclass(frozen=True)
class ArmFigures:
    """One arm's figures over the trial's measuring (ms, tokens/s, counts, %), as
    ``ArmSpan.figures`` makes them; None where the arm had none."""

    requests: int | None = None
    seconds: float | None = None
    ttft_p50_ms: float | None = None
    ttft_p99_ms: float | None = None
    itl_p50_ms: float | None = None
    itl_p99_ms: float | None = None
    e2e_p50_ms: float | None = None
    e2e_p99_ms: float | None = None
    # the p90s a verdict reads while too few requests bound a p99 (None: not measured)
    ttft_p90_ms: float | None = None
    itl_p90_ms: float | None = None
    e2e_p90_ms: float | None = None
    tokens_per_s: float | None = None
    decode_tokens_per_s: float | None = None
    goodput_pct: float | None = None
    errors: int | None = None
    preemptions: int | None = None
    kv_usage_pct: float | None = None

    def figure(self, key: str) -> float | None:
        """The figure named ``key`` (a field's name: ``ttft_p99_ms``); None for another."""
        value = getattr(self, key, None) if key in _ARM_KEYS else None
        return value if isinstance(value, int | float) and not isinstance(value, bool) else None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ArmFigures:
        return _fields_of(cls, data)


_ARM_KEYS = frozenset(f.name for f in dataclasses.fields(ArmFigures))


@dataclass(frozen=True)
class ProbeFigures:
    """The paired probe's part, once it runs: the pairs measured (they decide), those that
    failed, each arm's medians (ms) and why the probe runs."""

    pairs: int
    failed: int
    incumbent_ttft_p50_ms: float | None = None
    incumbent_itl_p50_ms: float | None = None
    incumbent_e2e_p50_ms: float | None = None
    candidate_ttft_p50_ms: float | None = None
    candidate_itl_p50_ms: float | None = None
    candidate_e2e_p50_ms: float | None = None
    why: str = ""

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ProbeFigures:
        return _fields_of(cls, data)


@dataclass(frozen=True)
class TrialArms:
    """Both arms' figures (None before the measuring began) and the probe's (None while it
    does not run)."""

    incumbent: ArmFigures | None = None
    candidate: ArmFigures | None = None
    probe: ProbeFigures | None = None

    def of(self, arm: str) -> ArmFigures | None:
        """``incumbent`` or ``candidate``'s figures."""
        return {"incumbent": self.incumbent, "candidate": self.candidate}.get(arm)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in ("incumbent", "candidate", "probe"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value.to_json()
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> TrialArms:
        unknown = sorted(set(data) - {"incumbent", "candidate", "probe"})
        if unknown:
            raise TypeError(f"TrialArms: unknown keys {', '.join(unknown)}")
        inc, cand, probe = data.get("incumbent"), data.get("candidate"), data.get("probe")
        return cls(
            ArmFigures.from_json(inc) if isinstance(inc, Mapping) else inc,
            ArmFigures.from_json(cand) if isinstance(cand, Mapping) else cand,
            ProbeFigures.from_json(probe) if isinstance(probe, Mapping) else probe,
        )


@dataclass(frozen=True)
class KvGroupStats:
    """One KV-cache group's figures in a ``kv`` event (core/monitor/kv_events.py; docs/kv.md
    defines each): its kind and block size, blocks resident, stored, removed, reused and
    evicted since the subscriber started, its prefix hit rate, and ``cells``, the block map's
    runs ``[age bucket, reuse bucket, count]`` (None: the event carried no map)."""

    group: int = 0
    kind: str | None = None
    sliding_window: int | None = None
    block_size: int | None = None
    medium: str | None = None
    resident: int = 0
    stored: int = 0
    removed: int = 0
    reused: int = 0
    duplicates: int = 0
    removed_unknown: int = 0
    evicted: int = 0
    prefix_hit_rate: float | None = None
    cells: list[list[int]] | None = None

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        if self.cells is None:
            del out["cells"]
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> KvGroupStats:
        return _fields_of(cls, data)


@dataclass(frozen=True)
class SharedPrefix:
    """One of the most reused shared prefixes of a ``kv`` event: its ``id`` (its token ids
    come in the event's ``prefix_tokens`` under it), its group, its blocks and hits."""

    id: str
    group: int = 0
    blocks: int = 0
    hits: int = 0

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> SharedPrefix:
        return _fields_of(cls, data)
