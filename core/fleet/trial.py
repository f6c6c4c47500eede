"""A live trial's judgement: two arms of one fleet instance compared on the same traffic.

The incumbent (the instance as it runs) and the candidate (the same instance with other knobs,
on a port of its own) serve the router's split of the live traffic side by side. Each arm's
figures are the deltas of its own ``/metrics`` since the measuring began: vLLM's histograms of
TTFT, inter-token latency and end-to-end latency, its token and finish counters.

The verdict on the goal is a stated test, not a threshold on two averages:

- latency goals (``ttft_p99``, ``itl_p99``, ``e2e_p99``) and ``throughput`` (a sequence's decode
  speed, the inverse of its inter-token latency): a Mann-Whitney U test on the two arms' binned
  observations (vLLM's histogram buckets; ties within a bucket corrected for), one-sided in
  each direction;
- ``goodput`` (the share of requests within every SLO limit): a two-proportion z-test.

The arms are looked at as the requests come, so the error rate of the looks is held by
Bonferroni over the planned looks (:data:`LOOKS`: at the minimum sample, then each time the
smaller arm has grown by half). A verdict needs both the test (p under ``alpha / looks``) and an
effect beyond ``margin`` in the same direction (the p99 ratio, or the goodput difference); a
difference the test cannot tell from noise, or one smaller than the margin, is "no difference",
and the incumbent is kept.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from typing import Any

from quantdeck.core.errors import ConfigError
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
LOOKS = 8  # planned looks at the arms (Bonferroni); the last one is at max_duration_s
GROWTH = 1.5  # a look each time the smaller arm has grown by half
ERROR_BURST = 3  # a candidate's failed requests in a breach window that roll it back...
ERROR_SHARE = 0.1  # ...when they are at least this share of its finished requests
BREACH_MIN_REQUESTS = 5  # an SLO breach is judged on at least this many of the window's
TAIL_REQUESTS = 100  # per arm, before a latency goal's effect is read at p99 (else p90)


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
            tokens_per_s=round(self.counter("generation_tokens") / self.seconds, 2),
            decode_tokens_per_s=round(itl_n / itl_sum, 2) if itl_n and itl_sum > 0 else None,
            goodput_pct=None if share is None else round(100 * share, 2),
            errors=self.errors,
            preemptions=int(self.counter("preemptions")),
            kv_usage_pct=None if kv is None else round(100 * kv, 2),
        )


# -- the tests -----------------------------------------------------------------------------------
def _normal_sf(z: float) -> float:
    """P(Z > z) for a standard normal Z."""
    return 0.5 * math.erfc(z / math.sqrt(2))


def _per_bin(
    a: tuple[tuple[float, float], ...], b: tuple[tuple[float, float], ...]
) -> tuple[list[float], list[float]]:
    """Both arms' counts per bucket, on the bucket bounds they share (cumulative counts at a
    shared bound are exact; two engine versions may bound their buckets differently)."""
    da, db = dict(a), dict(b)
    shared = sorted(set(da) & set(db))
    ca = [da[le] for le in shared]
    cb = [db[le] for le in shared]
    per_a = [c - p for c, p in zip(ca, [0.0, *ca][:-1], strict=True)]
    per_b = [c - p for c, p in zip(cb, [0.0, *cb][:-1], strict=True)]
    return [max(0.0, x) for x in per_a], [max(0.0, x) for x in per_b]


def mann_whitney_binned(
    lower: tuple[tuple[float, float], ...], upper: tuple[tuple[float, float], ...]
) -> float:
    """One-sided p-value that observations of ``lower`` tend to be smaller than those of
    ``upper`` (both cumulative ``(le, count)`` histograms): the Mann-Whitney U test with the
    normal approximation and the tie correction for binned data (1.0 without data)."""
    a, b = _per_bin(lower, upper)
    n1, n2 = sum(a), sum(b)
    n = n1 + n2
    if n1 < 1 or n2 < 1:
        return 1.0
    # U: pairs where the lower arm's observation is smaller, a tie counting one half
    u, b_above = 0.0, n2
    for ai, bi in zip(a, b, strict=True):
        b_above -= bi
        u += ai * (b_above + bi / 2)
    ties = sum((ai + bi) ** 3 - (ai + bi) for ai, bi in zip(a, b, strict=True))
    var = n1 * n2 / 12 * ((n + 1) - ties / (n * (n - 1))) if n > 1 else 0.0
    if var <= 0:
        return 1.0
    z = (u - n1 * n2 / 2) / math.sqrt(var)
    return _normal_sf(z)


def two_proportions(good_a: float, n_a: float, good_b: float, n_b: float) -> float:
    """One-sided p-value that arm a's share of good requests is higher than arm b's (pooled
    two-proportion z-test; 1.0 without data)."""
    if n_a < 1 or n_b < 1:
        return 1.0
    pool = (good_a + good_b) / (n_a + n_b)
    var = pool * (1 - pool) * (1 / n_a + 1 / n_b)
    if var <= 0:
        return 1.0
    return _normal_sf((good_a / n_a - good_b / n_b) / math.sqrt(var))


_LATENCY = {"ttft_p99": "ttft", "itl_p99": "itl", "e2e_p99": "e2e"}


def judge(
    incumbent: ArmSpan, candidate: ArmSpan, opts: TrialOptions, *, final: bool = False
) -> Verdict:
    """The verdict on ``opts.goal`` for the two arms' spans. ``final``: the last look (time is
    up): what is not a difference is "no difference", not "undecided"."""
    goal = opts.goal
    threshold = opts.alpha / LOOKS
    n_i, n_c = incumbent.requests, candidate.requests
    open_ = "no difference" if final else "undecided"
    v = Verdict(open_, goal, "", None, threshold, None, None, None, n_i, n_c, "")
    if min(n_i, n_c) < opts.min_requests:
        # too few requests is never "no difference", not even when time is up: nothing was
        # compared (the trial then rolls back for want of traffic and says so)
        why = f"{n_i} and {n_c} requests measured; {opts.min_requests} per arm are needed"
        return dataclasses.replace(v, outcome="undecided", reason=why)
    fig_i: float | None
    fig_c: float | None
    if goal == "goodput":
        si, sc = incumbent.slo_share(opts.slo), candidate.slo_share(opts.slo)
        v = dataclasses.replace(v, test="two-proportion z")
        if si is None or sc is None:
            return dataclasses.replace(v, reason="no SLO figures yet")
        p_better = two_proportions(sc * n_c, n_c, si * n_i, n_i)
        p_worse = two_proportions(si * n_i, n_i, sc * n_c, n_c)
        effect: float | None = round(100 * (sc - si), 2)
        better_effect, worse_effect = sc - si >= opts.margin, si - sc >= opts.margin
        fig_i, fig_c = round(100 * si, 2), round(100 * sc, 2)
    else:
        key = _LATENCY.get(goal, "itl")
        bi, bc = incumbent.buckets(key), candidate.buckets(key)
        # latency: lower is better; throughput (decode speed): lower ITL is better too
        p_better = mann_whitney_binned(bc, bi)
        p_worse = mann_whitney_binned(bi, bc)
        v = dataclasses.replace(v, test="Mann-Whitney U (binned)")
        if goal == "throughput":
            fig_i = incumbent.figures({}).decode_tokens_per_s
            fig_c = candidate.figures({}).decode_tokens_per_s
            ratio = fig_c / fig_i if fig_i and fig_c else None
            better_effect = ratio is not None and ratio >= 1 + opts.margin
            worse_effect = ratio is not None and ratio <= 1 - opts.margin
        else:
            # the effect at p99 once each arm has a request past it; before, at p90 (with a few
            # dozen requests p99 is the slowest one, read through coarse buckets: noise)
            q = 0.99 if min(n_i, n_c) >= TAIL_REQUESTS else 0.9
            fig_i, fig_c = _ms(q, bi), _ms(q, bc)
            ratio = fig_c / fig_i if fig_i and fig_c else None
            better_effect = ratio is not None and ratio <= 1 - opts.margin
            worse_effect = ratio is not None and ratio >= 1 + opts.margin
        effect = None if ratio is None else round(ratio, 4)
    v = dataclasses.replace(v, effect=effect, incumbent=fig_i, candidate=fig_c)
    caveats = (
        queueing_caveat(incumbent, candidate, goal),
        queueing_caveat(candidate, incumbent, goal),
    )
    return _settle(v, opts, (p_better, better_effect), (p_worse, worse_effect), caveats)


def _settle(
    v: Verdict,
    opts: TrialOptions,
    better: tuple[float, bool],
    worse: tuple[float, bool],
    caveats: tuple[str, str] = ("", ""),
) -> Verdict:
    """The outcome from each direction's (p, effect beyond the margin): better, worse, or
    neither (the reason says whether the test or the margin held it back)."""
    (p_better, better_effect), (p_worse, worse_effect) = better, worse
    if p_better < v.threshold and better_effect:
        why = _why(v, opts) + caveats[0]
        return dataclasses.replace(v, outcome="better", p_value=p_better, reason=why)
    if p_worse < v.threshold and worse_effect:
        why = _why(v, opts) + caveats[1]
        return dataclasses.replace(v, outcome="worse", p_value=p_worse, reason=why)
    p = min(p_better, p_worse)
    if p < v.threshold:
        why = f"a difference the test sees, but within the {opts.margin:.0%} margin"
    else:
        why = f"p = {p:.3g} is not under {v.threshold:.3g}"
    return dataclasses.replace(v, p_value=p, reason=why)


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


def _why(v: Verdict, opts: TrialOptions) -> str:
    if opts.goal == "goodput":
        effect = f"{v.effect:+g} points"
    else:
        effect = f"×{v.effect:g}"
    return (
        f"{opts.goal}: candidate {v.candidate:g} vs incumbent {v.incumbent:g} ({effect}), {v.test}"
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


def wilcoxon_signed_rank(diffs: list[float]) -> tuple[float, float]:
    """One-sided p-values that paired differences tend to be negative, and positive: the
    Wilcoxon signed-rank test, normal approximation with the tie correction, zero differences
    dropped ((1.0, 1.0) without data)."""
    d = [x for x in diffs if x != 0]
    n = len(d)
    if n == 0:
        return 1.0, 1.0
    order = sorted(range(n), key=lambda k: abs(d[k]))
    ranks = [0.0] * n
    ties = 0.0
    i = 0
    while i < n:
        j = i
        while j + 1 < n and abs(d[order[j + 1]]) == abs(d[order[i]]):
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        t = j - i + 1
        ties += t**3 - t
        i = j + 1
    w_plus = sum(r for r, x in zip(ranks, d, strict=True) if x > 0)
    mean = n * (n + 1) / 4
    var = n * (n + 1) * (2 * n + 1) / 24 - ties / 48
    if var <= 0:
        return 1.0, 1.0
    z = (w_plus - mean) / math.sqrt(var)
    return _normal_sf(-z), _normal_sf(z)


def mcnemar(only_a: int, only_b: int) -> float:
    """One-sided p-value that arm a keeps the SLO where b does not more often than the other
    way round (McNemar's test on the discordant pairs, normal approximation; 1.0 without)."""
    n = only_a + only_b
    if n == 0:
        return 1.0
    return _normal_sf((only_a - only_b) / math.sqrt(n))


def _quantile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


def judge_paired(pairs: list[ProbePair], opts: TrialOptions, *, final: bool = False) -> Verdict:
    """The verdict on ``opts.goal`` from the probe's pairs (the failed ones left out): the
    Wilcoxon signed-rank test on each pair's difference (goodput: McNemar's test), and the
    effect as :func:`judge` reads it, on the pairs' figures."""
    goal, threshold = opts.goal, opts.alpha / LOOKS
    good = [p for p in pairs if p.ok]
    n = len(good)
    open_ = "no difference" if final else "undecided"
    v = Verdict(open_, goal, "", None, threshold, None, None, None, n, n, "")
    if n < opts.min_requests:
        why = f"{n} probe pairs measured; {opts.min_requests} are needed"
        return dataclasses.replace(v, outcome="undecided", reason=why)
    if goal == "goodput":
        keep_i = [p.incumbent.within(opts.slo) for p in good]
        keep_c = [p.candidate.within(opts.slo) for p in good]
        only_c = sum(1 for i, c in zip(keep_i, keep_c, strict=True) if c and not i)
        only_i = sum(1 for i, c in zip(keep_i, keep_c, strict=True) if i and not c)
        p_better, p_worse = mcnemar(only_c, only_i), mcnemar(only_i, only_c)
        si, sc = sum(keep_i) / n, sum(keep_c) / n
        fig_i: float | None = round(100 * si, 2)
        fig_c: float | None = round(100 * sc, 2)
        effect: float | None = round(100 * (sc - si), 2)
        better_effect, worse_effect = sc - si >= opts.margin, si - sc >= opts.margin
        v = dataclasses.replace(v, test="McNemar (paired probe)")
    else:
        vi = [p.incumbent.value(goal) for p in good]
        vc = [p.candidate.value(goal) for p in good]
        p_better, p_worse = wilcoxon_signed_rank([c - i for i, c in zip(vi, vc, strict=True)])
        v = dataclasses.replace(v, test="Wilcoxon signed-rank (paired probe)")
        if goal == "throughput":
            mi, mc = _quantile(vi, 0.5), _quantile(vc, 0.5)
            fig_i = round(1 / mi, 2) if mi > 0 else None
            fig_c = round(1 / mc, 2) if mc > 0 else None
            ratio = fig_c / fig_i if fig_i and fig_c else None
            better_effect = ratio is not None and ratio >= 1 + opts.margin
            worse_effect = ratio is not None and ratio <= 1 - opts.margin
        else:
            q = 0.99 if n >= TAIL_REQUESTS else 0.9
            fig_i = round(1000 * _quantile(vi, q), 3)
            fig_c = round(1000 * _quantile(vc, q), 3)
            ratio = fig_c / fig_i if fig_i and fig_c is not None else None
            better_effect = ratio is not None and ratio <= 1 - opts.margin
            worse_effect = ratio is not None and ratio >= 1 + opts.margin
        effect = None if ratio is None else round(ratio, 4)
    v = dataclasses.replace(v, effect=effect, incumbent=fig_i, candidate=fig_c)
    return _settle(v, opts, (p_better, better_effect), (p_worse, worse_effect))


def probe_figures(pairs: list[ProbePair], why: str = "") -> ProbeFigures:
    """What the trial events carry of the probe: pairs, failures, each arm's medians (ms),
    and ``why`` it runs."""
    good = [p for p in pairs if p.ok]

    def med(arm: str, key: str) -> float | None:
        values = [getattr(getattr(p, arm), key) for p in good]
        return round(1000 * _quantile(values, 0.5), 2) if values else None

    medians = {
        f"{arm}_{key[:-2]}_p50_ms": med(arm, key)
        for arm in ("incumbent", "candidate")
        for key in ("ttft_s", "itl_s", "e2e_s")
    }
    return ProbeFigures(len(good), len(pairs) - len(good), **medians, why=why)


def next_look(n: int, opts: TrialOptions) -> int:
    """The smaller arm's request count at which the look after one at ``n`` is due."""
    return max(n + 1, math.ceil(max(n, opts.min_requests) * GROWTH))


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
