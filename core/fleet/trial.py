"""A live trial's judgement: two arms of one fleet instance compared on the same traffic.

The incumbent (the instance as it runs) and the candidate (the same instance with other knobs,
on a port of its own) serve the router's split of the live traffic side by side. Each arm's
figures are the deltas of its own ``/metrics`` since the measuring began: vLLM's histograms of
TTFT, inter-token latency and end-to-end latency, its token and finish counters.

The verdict on the goal is an interval, not a threshold on two averages: the candidate's goal
figure over the incumbent's (goodput: their difference in points), with an interval valid
however often it is looked at (core/evidence.py: a confidence sequence), read against the
margin. Beyond it on the good side the candidate is ``better``, on the bad side ``worse``;
inside it on both sides ``equivalent``; else ``inconclusive``, with about how many more
requests an arm would settle it. The goal's figure is named as it is (``TTFT p99``) and is the
figure the arms' table shows: one computation. From the arms' histograms a percentile is known
only to its bucket; the paired probe's per-request figures narrow it as requests come.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import Any

from quantdeck.core.errors import ConfigError
from quantdeck.core.evidence import (
    INCONCLUSIVE,
    Effect,
    Estimate,
    binned_quantile,
    bounded_from,
    classify,
    difference,
    mean,
    mean_of,
    quantile_effect,
    ratio,
    requests_to_settle,
    sample_quantile,
    share,
)
from quantdeck.core.monitor.metrics import (
    Histogram,
    RawMetrics,
    histogram_fraction_at_most,
    histogram_quantile,
)
from quantdeck.core.payloads import ArmFigures, ProbeFigures, Verdict

CANDIDATE = "+try"  # a trial candidate's events: instance NAME+try ('+' is in no instance's name)

GOALS = ("ttft_p99", "itl_p99", "e2e_p99", "goodput", "throughput")
DECIDE = ("auto", "ask")
# the figures an SLO limit may name, and the histogram each is read from
SLO_METRICS = {
    f"{m}_{q}": (m, float(q[1:]) / 100)
    for m in ("ttft", "itl", "e2e")
    for q in ("p50", "p90", "p99")
}
ERROR_BURST = 3  # a candidate's failed requests in a breach window that roll it back...
ERROR_SHARE = 0.1  # ...when they are at least this share of its finished requests
BREACH_MIN_REQUESTS = 5  # an SLO breach is judged on at least this many of the window's


@dataclass(frozen=True)
class TrialOptions:
    """How a trial measures and decides (``fleet try``'s options)."""

    goal: str = "ttft_p99"
    slo: dict[str, float] = field(default_factory=dict)  # {"ttft_p99": ms, ...}
    min_requests: int = 30  # per arm, before the first look
    max_duration_s: float = 300.0  # measuring; then the last look decides
    warmup_requests: int = 3  # sent to the candidate before it is routed (not counted)
    decide: str = "auto"  # "ask": wait for the operator's promote or rollback
    alpha: float = 0.05
    margin: float = 0.10  # the smallest effect called a difference (a share: 0.10 = 10 %)
    breach_window_s: float = 10.0  # the SLO breach and error burst rule's window
    drain_timeout_s: float = 120.0  # the retired arm's requests finish within this
    # after a promotion, an incumbent launched with sleep mode sleeps this long (weights in
    # host RAM, KV cache freed) so that `fleet undo` is a wake-up; 0: it stops at once
    keep_s: float = 600.0
    # a paired probe load: identical prompts sent to both arms back to back, beside the live
    # traffic; its pairs decide (the router's split cannot confound them). Off: it starts by
    # itself when the live traffic is too thin to reach min_requests in time
    probe: bool = False

    def __post_init__(self) -> None:
        if self.goal not in GOALS:
            raise ConfigError(f"--goal {self.goal!r}: one of {', '.join(GOALS)}")
        if self.decide not in DECIDE:
            raise ConfigError(f"--decide {self.decide!r}: auto or ask")
        if self.goal == "goodput" and not self.slo:
            raise ConfigError("--goal goodput needs --slo (the limits a good request keeps)")
        if not 0 < self.alpha < 1 or not 0 <= self.margin < 1:
            raise ConfigError("--alpha must be in (0, 1) and --margin in [0, 1)")
        if self.min_requests < 5:
            raise ConfigError("--min-requests must be at least 5")
        if self.max_duration_s <= 0 or self.breach_window_s <= 0:
            raise ConfigError("--max-duration and the breach window must be positive")
        if self.keep_s < 0:
            raise ConfigError("--keep must be 0 (stop the incumbent) or more seconds")

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> TrialOptions:
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - names
        if unknown:
            raise ConfigError(f"trial options: unknown {', '.join(sorted(unknown))}")
        return cls(**data)


_SLO_ITEM = re.compile(r"\s*([a-z0-9_]+)\s*<=\s*([0-9]*\.?[0-9]+)\s*(ms|s)?\s*")


def parse_slo(text: str) -> dict[str, float]:
    """``'ttft_p99<=500ms,itl_p99<=50ms'`` -> ``{"ttft_p99": 500.0, "itl_p99": 50.0}`` (ms;
    a value in ``s`` is converted, a bare number is ms)."""
    out: dict[str, float] = {}
    for item in filter(None, (x.strip() for x in text.split(","))):
        m = _SLO_ITEM.fullmatch(item)
        if m is None or m.group(1) not in SLO_METRICS:
            raise ConfigError(
                f"--slo {item!r}: expected METRIC<=VALUE[ms|s], METRIC one of "
                + ", ".join(SLO_METRICS)
            )
        value = float(m.group(2)) * (1000.0 if m.group(3) == "s" else 1.0)
        if value <= 0:
            raise ConfigError(f"--slo {item!r}: the limit must be positive")
        out[m.group(1)] = value
    if not out:
        raise ConfigError("--slo: no limit given (e.g. 'ttft_p99<=500ms,itl_p99<=50ms')")
    return out


# -- one arm's figures ---------------------------------------------------------------------------
def _delta(new: Histogram | None, old: Histogram | None) -> tuple[tuple[float, float], ...]:
    """Cumulative ``(le, count)`` pairs of the observations between two scrapes."""
    if new is None:
        return ()
    o = dict(old.buckets) if old is not None else {}
    return tuple((le, max(0.0, c - o.get(le, 0.0))) for le, c in new.buckets)


def _count(buckets: tuple[tuple[float, float], ...]) -> int:
    return int(round(buckets[-1][1])) if buckets else 0


def _ms(q: float, buckets: tuple[tuple[float, float], ...]) -> float | None:
    v = histogram_quantile(q, buckets)
    return None if v is None else round(v * 1000, 3)


@dataclass(frozen=True)
class ArmSpan:
    """One arm between two scrapes of its ``/metrics``: what happened in between."""

    start: RawMetrics
    end: RawMetrics

    def buckets(self, key: str) -> tuple[tuple[float, float], ...]:
        return _delta(self.end.histograms.get(key), self.start.histograms.get(key))

    def mean_s(self, key: str) -> float | None:
        """The mean of histogram ``key``'s observations in the span (seconds), None: none."""
        end, start = self.end.histograms.get(key), self.start.histograms.get(key)
        if end is None:
            return None
        n = end.count - (start.count if start else 0.0)
        total = end.total - (start.total if start else 0.0)
        return total / n if n > 0 else None

    @property
    def seconds(self) -> float:
        return max(1e-9, self.end.t - self.start.t)

    @property
    def requests(self) -> int:
        """Requests finished (their end-to-end latency observed)."""
        return _count(self.buckets("e2e"))

    def counter(self, key: str) -> float:
        return max(0.0, self.end.counters.get(key, 0.0) - self.start.counters.get(key, 0.0))

    @property
    def errors(self) -> int:
        """Requests that ended in an error or were aborted (vLLM's finished_reason)."""
        new, old = self.end.finished_by_reason, self.start.finished_by_reason
        return int(sum(max(0.0, new.get(r, 0.0) - old.get(r, 0.0)) for r in ("abort", "error")))

    def slo_share(self, slo: dict[str, float]) -> float | None:
        """The share of requests within every limit: the lowest of the per-limit shares (the
        histograms keep no request's joint figures, so this is an upper bound on the joint)."""
        shares = []
        for name, limit_ms in slo.items():
            key, _ = SLO_METRICS[name]
            s = histogram_fraction_at_most(limit_ms / 1000, self.buckets(key))
            if s is not None:
                shares.append(s)
        return min(shares) if shares else None

    def slo_estimate(self, slo: dict[str, float], alpha: float) -> Estimate:
        """The share of requests within every limit (the lowest per-limit share: the
        histograms keep no request's joint figures) and its interval: a limit inside a bucket
        counts the bucket's requests as within at most and outside at least."""
        n = self.requests
        worst: Estimate | None = None
        for name, limit_ms in slo.items():
            key, _ = SLO_METRICS[name]
            buckets = self.buckets(key)
            share_now = histogram_fraction_at_most(limit_ms / 1000, buckets)
            if share_now is None or n == 0:
                continue
            below = max((c for le, c in buckets if le <= limit_ms / 1000), default=0.0)
            upto = min((c for le, c in buckets if le >= limit_ms / 1000), default=float(n))
            e = Estimate(
                share_now,
                share(int(below), n, alpha).lo,
                share(min(n, int(upto)), n, alpha).hi,
                n,
            )
            if worst is None or (e.value or 0.0) < (worst.value or 0.0):
                worst = e
        return worst if worst is not None else Estimate(None, 0.0, 1.0, n)

    def decode_speed(self, alpha: float) -> Estimate:
        """Tokens a second while decoding: one over the mean inter-token gap (the histogram's
        sum over its count, exact), its interval from the gaps' spread across the buckets."""
        buckets = self.buckets("itl")
        n = _count(buckets)
        mean_s = self.mean_s("itl")
        if not n or not mean_s:
            return Estimate(None, 0.0, math.inf, n)
        var, below_le, below_c = 0.0, 0.0, 0.0
        for le, c in buckets:
            mid = (below_le + le) / 2 if math.isfinite(le) else below_le
            var += (c - below_c) * (mid - mean_s) ** 2
            below_le, below_c = (le if math.isfinite(le) else below_le), c
        gap = mean_of(mean_s, var / max(1, n - 1), n, alpha)
        hi = 1 / gap.lo if gap.lo > 0 else math.inf
        return Estimate(1 / mean_s, 1 / gap.hi, hi, n)

    def figures(self, slo: dict[str, float]) -> ArmFigures:
        """What the trial events carry for the arm (ms, tokens/s, counts, %)."""
        itl = self.buckets("itl")
        itl_n = _count(itl)
        end_h = self.end.histograms.get("itl")
        start_h = self.start.histograms.get("itl")
        itl_sum = (end_h.total if end_h else 0.0) - (start_h.total if start_h else 0.0)
        share = self.slo_share(slo) if slo else None
        kv = self.end.gauges.get("kv_usage")
        return ArmFigures(
            requests=self.requests,
            seconds=round(self.seconds, 1),
            ttft_p50_ms=_ms(0.5, self.buckets("ttft")),
            ttft_p99_ms=_ms(0.99, self.buckets("ttft")),
            itl_p50_ms=_ms(0.5, itl),
            itl_p99_ms=_ms(0.99, itl),
            e2e_p50_ms=_ms(0.5, self.buckets("e2e")),
            e2e_p99_ms=_ms(0.99, self.buckets("e2e")),
            ttft_p90_ms=_ms(0.9, self.buckets("ttft")),
            itl_p90_ms=_ms(0.9, itl),
            e2e_p90_ms=_ms(0.9, self.buckets("e2e")),
            tokens_per_s=round(self.counter("generation_tokens") / self.seconds, 2),
            decode_tokens_per_s=round(itl_n / itl_sum, 2) if itl_n and itl_sum > 0 else None,
            goodput_pct=None if share is None else round(100 * share, 2),
            errors=self.errors,
            preemptions=int(self.counter("preemptions")),
            kv_usage_pct=None if kv is None else round(100 * kv, 2),
        )


# -- the verdict ---------------------------------------------------------------------------------
_QUANTILE = {"ttft_p99": ("ttft", 0.99, "TTFT p99"), "itl_p99": ("itl", 0.99, "ITL p99")}
_QUANTILE["e2e_p99"] = ("e2e", 0.99, "E2E p99")
FIGURE_NAMES = {**{g: f for g, (_, _, f) in _QUANTILE.items()}, "goodput": "goodput"}
FIGURE_NAMES["throughput"] = "decode speed"
HISTOGRAMS = "the arms' histograms (vLLM's buckets)"


def _verdict(
    goal: str,
    effect: Effect,
    figures: tuple[float | None, float | None],
    counts: tuple[int, int],
    opts: TrialOptions,
    source: str,
    reason: str = "",
    q: float | None = None,
) -> Verdict:
    """The outcome of ``effect`` against the margin, and what would settle it (``q``: the
    quantile a latency goal was read at, when not its own)."""
    outcome = classify(effect, opts.margin, lower_is_better=goal in _QUANTILE)
    needed = None
    if outcome == INCONCLUSIVE:
        needed = requests_to_settle(effect, min(counts), opts.margin)
        if needed is None and goal in _QUANTILE:  # a percentile not bounded yet: until it is
            short = bounded_from(q or _QUANTILE[goal][1], opts.alpha / 2) - min(counts)
            needed = short if short > 0 else None
    figure = FIGURE_NAMES[goal]
    if q is not None:
        figure = f"{figure.split()[0]} p{round(100 * q)}"
    return Verdict(
        outcome,
        goal,
        figure,
        source,
        None if effect.value is None else round(effect.value, 4),
        None if effect.value is None else round(effect.lo, 4),
        None if effect.value is None or math.isinf(effect.hi) else round(effect.hi, 4),
        effect.kind,
        figures[0],
        figures[1],
        counts[0],
        counts[1],
        opts.margin,
        needed,
        reason,
    )


def _fig(e: Estimate, scale: float = 1.0) -> float | None:
    return None if e.value is None else round(scale * e.value, 2)


def too_few(goal: str, n_i: int, n_c: int, opts: TrialOptions, what: str = "requests") -> Verdict:
    """Inconclusive before the first look: fewer than ``min_requests`` an arm."""
    why = f"{n_i} and {n_c} {what} measured; {opts.min_requests} an arm before the first look"
    return Verdict(
        INCONCLUSIVE, goal, FIGURE_NAMES[goal], n_incumbent=n_i, n_candidate=n_c,
        margin=opts.margin, reason=why,
    )  # fmt: skip


def judge(incumbent: ArmSpan, candidate: ArmSpan, opts: TrialOptions) -> Verdict:
    """The verdict on ``opts.goal`` from the arms' histograms: each arm's figure with its
    interval at ``alpha / 2``, valid at every look (core/evidence.py), their ratio (goodput:
    difference) against the margin. A percentile read from buckets is known only to the
    bucket: what lies inside one bucket on both arms stays inconclusive, however many requests
    come (the probe's per-request figures can tell it)."""
    goal, half = opts.goal, opts.alpha / 2
    n_i, n_c = incumbent.requests, candidate.requests
    if min(n_i, n_c) < opts.min_requests:
        return too_few(goal, n_i, n_c, opts)
    if goal == "goodput":
        ei, ec = incumbent.slo_estimate(opts.slo, half), candidate.slo_estimate(opts.slo, half)
        effect = difference(ec, ei)
        figures = (_fig(ei, 100), _fig(ec, 100))
    elif goal == "throughput":
        si, sc = incumbent.decode_speed(half), candidate.decode_speed(half)
        effect = ratio(sc, si)
        figures = (_fig(si), _fig(sc))
    else:
        key, _, _ = _QUANTILE[goal]
        q, why = read_at(goal, min(n_i, n_c), opts)
        bi, bc = incumbent.buckets(key), candidate.buckets(key)
        effect = ratio(binned_quantile(bc, q, half), binned_quantile(bi, q, half))
        figures = (_ms(q, bi), _ms(q, bc))  # as the arms' table reads them: one computation
        if figures[0] and figures[1] is not None:
            effect = dataclasses.replace(effect, value=figures[1] / figures[0])
        caveat = queueing_caveat(incumbent, candidate, goal) or queueing_caveat(
            candidate, incumbent, goal
        )
        reason = "; ".join(x for x in (why, caveat.lstrip("; ")) if x)
        return _verdict(goal, effect, figures, (n_i, n_c), opts, HISTOGRAMS, reason, q)
    return _verdict(goal, effect, figures, (n_i, n_c), opts, HISTOGRAMS)


def read_at(goal: str, n: int, opts: TrialOptions) -> tuple[float, str]:
    """The quantile a latency goal is read at with ``n`` requests an arm: its own (p99) once
    the sample can bound it, else p90, saying so (the figure is then named p90: before issue
    45 a "p99" verdict compared p90s without a word)."""
    q = _QUANTILE[goal][1]
    need = bounded_from(q, opts.alpha / 2)
    if n >= need:
        return q, ""
    return FALLBACK_Q, f"read at p90: a p99 is bounded from {need} requests an arm, {n} measured"


FALLBACK_Q = 0.9


QUEUED_SHARE = 0.5  # a slower arm's TTFT that is more than this share queueing: a caveat


def queueing_caveat(slower: ArmSpan, faster: ArmSpan, goal: str) -> str:
    """When most of the slower arm's time to first token (or end to end) was spent waiting in
    its queue: a caveat. Under a fixed number of clients that keep every seat busy, the
    router's alternate split lets the arms' queues drift apart even for the same config (A/A
    trials here: 8 of 10 called a difference), so the difference may be the split's, not the
    config's. A config with more seats also shows as less queueing: the caveat does not
    change the verdict, it says what to check (an open load, a repeat)."""
    if goal not in ("ttft_p99", "e2e_p99"):
        return ""
    key = "ttft" if goal == "ttft_p99" else "e2e"
    queue, latency = slower.mean_s("queue"), slower.mean_s(key)
    if queue is None or not latency or queue / latency <= QUEUED_SHARE:
        return ""
    other = faster.mean_s("queue")
    theirs = f" against {1000 * other:.0f} ms" if other is not None else ""
    return (
        f"; caveat: {100 * queue / latency:.0f} % of the slower arm's {key.upper()} was queueing "
        f"(mean {1000 * queue:.0f} ms{theirs}): with every seat busy, the router's split of the "
        "queue can make such a difference by itself: confirm under an open load or repeat"
    )


# -- the paired probe --------------------------------------------------------------------------
@dataclass(frozen=True)
class ProbeRecord:
    """One probe request as its client saw it: time to first token, mean inter-token gap and
    end to end (seconds); ``error`` when it failed."""

    ttft_s: float = 0.0
    itl_s: float = 0.0
    e2e_s: float = 0.0
    error: str | None = None

    def value(self, goal: str) -> float:
        """The figure the goal compares (lower is better for every goal: throughput reads
        the inter-token gap, the inverse of decode speed)."""
        if goal == "ttft_p99":
            return self.ttft_s
        if goal == "e2e_p99":
            return self.e2e_s
        return self.itl_s

    def within(self, slo: dict[str, float]) -> bool:
        """Whether the request kept every limit (each read on its own figures)."""
        figures = {"ttft": self.ttft_s, "itl": self.itl_s, "e2e": self.e2e_s}
        return self.error is None and all(
            1000 * figures[SLO_METRICS[name][0]] <= limit for name, limit in slo.items()
        )


@dataclass(frozen=True)
class ProbePair:
    """One prompt sent to both arms, one right after the other."""

    incumbent: ProbeRecord
    candidate: ProbeRecord

    @property
    def ok(self) -> bool:
        return self.incumbent.error is None and self.candidate.error is None


def judge_paired(pairs: list[ProbePair], opts: TrialOptions) -> Verdict:
    """The verdict on ``opts.goal`` from the probe's requests (the failed pairs left out):
    each request's own figure, so a percentile's interval narrows with the count (no bucket
    holds it back); the arms' samples compared as independent (valid, if cautious: the
    pairing is not used)."""
    goal = opts.goal
    good = [p for p in pairs if p.ok]
    n = len(good)
    if n < opts.min_requests:
        return too_few(goal, n, n, opts, "probe pairs")
    source = f"the probe's {n} pairs (per-request figures)"
    if goal == "goodput":
        keep_i = sum(p.incumbent.within(opts.slo) for p in good)
        keep_c = sum(p.candidate.within(opts.slo) for p in good)
        half = opts.alpha / 2
        effect = difference(share(keep_c, n, half), share(keep_i, n, half))
        figures: tuple[float | None, float | None] = (
            round(100 * keep_i / n, 2),
            round(100 * keep_c / n, 2),
        )
        return _verdict(goal, effect, figures, (n, n), opts, source)
    vi = [p.incumbent.value(goal) for p in good]
    vc = [p.candidate.value(goal) for p in good]
    if goal == "throughput":  # decode speed: tokens a second, each request's
        half = opts.alpha / 2
        si = mean([1 / v for v in vi if v > 0], half)
        sc = mean([1 / v for v in vc if v > 0], half)
        effect = ratio(sc, si)
        figures = (_fig(si), _fig(sc))
        return _verdict(goal, effect, figures, (n, n), opts, source)
    q, why = read_at(goal, n, opts)
    effect = quantile_effect(vc, vi, q, opts.alpha)
    figures = (round(1000 * sample_quantile(vi, q), 3), round(1000 * sample_quantile(vc, q), 3))
    return _verdict(goal, effect, figures, (n, n), opts, source, why, q)


def probe_figures(pairs: list[ProbePair], why: str = "") -> ProbeFigures:
    """What the trial events carry of the probe: pairs, failures, each arm's medians (ms),
    and ``why`` it runs."""
    good = [p for p in pairs if p.ok]

    def med(arm: str, key: str) -> float | None:
        values = [getattr(getattr(p, arm), key) for p in good]
        return round(1000 * sample_quantile(values, 0.5), 2) if values else None

    medians = {
        f"{arm}_{key[:-2]}_p50_ms": med(arm, key)
        for arm in ("incumbent", "candidate")
        for key in ("ttft_s", "itl_s", "e2e_s")
    }
    return ProbeFigures(len(good), len(pairs) - len(good), **medians, why=why)


def breach(candidate: ArmSpan, opts: TrialOptions) -> str | None:
    """Why the candidate must be rolled back at once (over the breach window's span): an SLO
    limit broken, or an error burst; None when neither."""
    n = candidate.requests
    errors = candidate.errors
    if errors >= ERROR_BURST and errors >= ERROR_SHARE * max(1, n + errors):
        return f"{errors} failed requests of {n + errors} in {candidate.seconds:.0f} s"
    if n < BREACH_MIN_REQUESTS:
        return None
    for name, limit_ms in opts.slo.items():
        key, q = SLO_METRICS[name]
        value = _ms(q, candidate.buckets(key))
        if value is not None and value > limit_ms:
            return (
                f"SLO breach: {name} {value:g} ms > {limit_ms:g} ms over the last "
                f"{candidate.seconds:.0f} s ({n} requests)"
            )
    return None
