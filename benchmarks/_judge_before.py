"""The live trial's judge as it was before issue 45 (core/fleet/trial.py at 9d7df3d), frozen
for benchmarks/verdicts.py's comparison: a Mann-Whitney U test on vLLM's histogram buckets,
Bonferroni over 8 planned looks, the point p99 (p90 under 100 requests) ratio against the
margin, "no difference" at the limit. Not used by Quantdeck."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from quantdeck.core.fleet.trial import ArmSpan, TrialOptions, _ms, queueing_caveat


@dataclass(frozen=True)
class Verdict:
    """The verdict as it was: better, worse, no difference or undecided, with the test's p."""

    outcome: str
    goal: str = ""
    test: str = ""
    p_value: float | None = None
    threshold: float = 0.0
    effect: float | None = None
    incumbent: float | None = None
    candidate: float | None = None
    n_incumbent: int = 0
    n_candidate: int = 0
    reason: str = ""


LOOKS = 8
GROWTH = 1.5
TAIL_REQUESTS = 100


def next_look(n: int, opts: TrialOptions) -> int:
    return max(n + 1, math.ceil(max(n, opts.min_requests) * GROWTH))


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


def _why(v: Verdict, opts: TrialOptions) -> str:
    if opts.goal == "goodput":
        effect = f"{v.effect:+g} points"
    else:
        effect = f"×{v.effect:g}"
    return (
        f"{opts.goal}: candidate {v.candidate:g} vs incumbent {v.incumbent:g} ({effect}), {v.test}"
    )
