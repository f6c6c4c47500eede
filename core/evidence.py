"""What the evidence says: intervals valid at every look, and the four outcomes (issue 45).

A live trial, an A/B run, a tuning and Compare all ask one question of two samples: is the
candidate's figure (a percentile of a latency, a share of good requests, a mean) better, worse,
the same within a margin, or can it not be told yet? This module answers it once, for all of
them, with intervals that stay valid however often they are looked at:

- a **percentile** (``p99`` of TTFT…): the order statistics between which the true percentile
  lies, from a confidence *sequence* for the count of observations below it. That count is
  binomial (``n``, ``q``) whatever the latency's distribution; the beta-binomial mixture
  martingale of Robbins (as in Howard & Ramdas, "Sequential estimation of quantiles with
  applications to A/B-testing and best-arm identification", Bernoulli 2022) bounds it at
  every ``n`` at once (Ville's inequality). From per-request figures the bounds are two
  observed values; from a histogram (vLLM's ``/metrics``) they are the edges of the buckets
  those ranks fall in, which is honest and coarse.
- a **share** (goodput: the requests within every SLO limit): the same mixture, for an
  unknown success probability.
- a **mean**: the asymptotic confidence sequence of Waudby-Smith et al. (2021), the normal
  mixture boundary with the sample's variance.

Two arms' intervals, each at ``alpha / 2``, give the interval of their ratio (or difference);
where it lies against the margin gives the outcome (:func:`classify`): ``better`` or ``worse``
(beyond the margin), ``equivalent`` (within it on both sides), ``inconclusive`` (neither yet;
:func:`requests_to_settle` says about how many more requests an arm would settle it). Since
each interval holds at every look, so does the outcome: a trial may look after every request
and stop as soon as the outcome is not ``inconclusive``, and its error rate stays ``alpha``.

Plain Python, no numpy: the figures here are a few thousand per arm.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from statistics import NormalDist

BETTER, WORSE, EQUIVALENT, INCONCLUSIVE = "better", "worse", "equivalent", "inconclusive"
OUTCOMES = (BETTER, WORSE, EQUIVALENT, INCONCLUSIVE)
# the mixture's prior weight (pseudo-observations): its intervals are tightest near a few
# hundred to a few thousand requests, the sizes a trial decides at (measured in
# benchmarks/verdicts.py; widths within 10 % of the best choice from 300 to 10,000 requests)
PRIOR_WEIGHT = 100.0
MEAN_TUNED_N = 500  # the mean's boundary is tightest at this many observations


def _ln_beta(a: float, b: float) -> float:
    return math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)


def _log_mixture(n: int, k: int, p: float, weight: float = PRIOR_WEIGHT) -> float:
    """log of the beta-binomial mixture martingale for ``k`` successes in ``n`` Bernoulli(p)
    trials (the prior Beta centred on ``p``): under ``p`` it exceeds ``log(1 / alpha)`` at
    some ``n`` with probability at most ``alpha``."""
    a, b = weight * p, weight * (1 - p)
    return (
        _ln_beta(a + k, b + (n - k)) - _ln_beta(a, b) - k * math.log(p) - (n - k) * math.log1p(-p)
    )


@lru_cache(maxsize=4096)
def count_bounds(n: int, p: float, alpha: float) -> tuple[int, int]:
    """The counts ``[lo, hi]`` of ``n`` Bernoulli(``p``) trials the confidence sequence keeps:
    the true count lies in them at every ``n`` at once with probability ``1 - alpha``. (The
    mixture is convex in the count: each side is found by bisection from ``n p``.)"""
    if n <= 0:
        return 0, 0
    limit = math.log(1 / alpha)
    mid = min(n, max(0, round(n * p)))

    def inside(k: int) -> bool:
        return _log_mixture(n, k, p) < limit

    def edge(good: int, bad: int) -> int:  # the last count still inside, going good -> bad
        while abs(bad - good) > 1:
            m = (good + bad) // 2
            good, bad = (m, bad) if inside(m) else (good, m)
        return good

    lo = 0 if inside(0) else edge(mid, 0)
    hi = n if inside(n) else edge(mid, n)
    return lo, hi


@dataclass(frozen=True)
class Estimate:
    """A figure with its interval (valid at every look at its ``alpha``), from ``n``
    observations; ``lo`` may be 0 and ``hi`` infinite where the sample cannot bound it yet."""

    value: float | None
    lo: float
    hi: float
    n: int

    @property
    def bounded(self) -> bool:
        return self.value is not None and math.isfinite(self.hi) and self.lo > 0


def sample_quantile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile of ``values`` as every estimate here reads it: the ⌈q n⌉-th smallest."""
    return _order_statistic(sorted(values), q)


def _order_statistic(s: Sequence[float], q: float) -> float:
    return s[min(len(s) - 1, max(0, math.ceil(q * len(s)) - 1))]


def quantile(values: Sequence[float], q: float, alpha: float) -> Estimate:
    """The ``q`` quantile of ``values`` (per-request figures) and the order statistics that
    hold the true one at every look with probability ``1 - alpha``."""
    n = len(values)
    if n == 0:
        return Estimate(None, 0.0, math.inf, 0)
    s = sorted(values)
    lo_k, hi_k = count_bounds(n, q, alpha)
    # the count of observations at or below the true quantile is in [lo_k, hi_k]: it is at
    # least the lo_k-th observation, and below the (hi_k + 1)-th
    lo = s[lo_k - 1] if lo_k >= 1 else 0.0
    hi = s[hi_k] if hi_k < n else math.inf
    return Estimate(_order_statistic(s, q), lo, hi, n)


def binned_quantile(buckets: Sequence[tuple[float, float]], q: float, alpha: float) -> Estimate:
    """As :func:`quantile` from a histogram's cumulative ``(upper bound, count)`` buckets: the
    bounds are the edges of the buckets the ranks fall in (a value inside a bucket is not
    known better than that); the estimate interpolates in its bucket as Prometheus does."""
    n = int(round(buckets[-1][1])) if buckets else 0
    if n == 0:
        return Estimate(None, 0.0, math.inf, 0)
    lo_k, hi_k = count_bounds(n, q, alpha)

    def bucket_of(rank: float) -> tuple[float, float, float, float]:
        below_le, below_c = 0.0, 0.0
        for le, c in buckets:
            if c >= rank:
                return below_le, le, below_c, c
            below_le, below_c = le, c
        return below_le, math.inf, below_c, float(n)

    lo = bucket_of(lo_k)[0] if lo_k >= 1 else 0.0
    hi = bucket_of(hi_k + 1)[1] if hi_k < n else math.inf
    a, b, ca, cb = bucket_of(q * n)
    if not math.isfinite(b):
        value = a
    else:
        value = a + (b - a) * ((q * n - ca) / (cb - ca) if cb > ca else 1.0)
    return Estimate(value, lo, hi, n)


def share(good: int, n: int, alpha: float) -> Estimate:
    """The share of ``good`` in ``n`` and the interval holding the true share at every look."""
    if n <= 0:
        return Estimate(None, 0.0, 1.0, 0)
    limit = math.log(1 / alpha)
    p_hat = good / n

    def inside(p: float) -> bool:
        return 0 < p < 1 and _log_mixture(n, good, p) < limit

    def edge(inner: float, outer: float) -> float:
        for _ in range(50):
            m = (inner + outer) / 2
            inner, outer = (m, outer) if inside(m) else (inner, m)
        return inner

    centre = min(max(p_hat, 1e-9), 1 - 1e-9)
    return Estimate(p_hat, edge(centre, 0.0), edge(centre, 1.0), n)


def mean(values: Sequence[float], alpha: float) -> Estimate:
    """The mean of ``values`` and its asymptotic confidence sequence (the normal mixture
    boundary with the sample's variance, tuned for :data:`MEAN_TUNED_N` observations)."""
    n = len(values)
    if n < 2:
        return Estimate(values[0] if values else None, 0.0, math.inf, n)
    m = sum(values) / n
    return mean_of(m, sum((v - m) ** 2 for v in values) / (n - 1), n, alpha)


def mean_of(m: float, var: float, n: int, alpha: float) -> Estimate:
    """:func:`mean`'s interval from the sample's mean ``m``, variance ``var`` and size ``n``
    (a histogram knows its sum exactly, its variance from its buckets)."""
    if n < 2:
        return Estimate(m if n else None, 0.0, math.inf, n)
    half = math.sqrt(var) * _boundary(n, alpha, MEAN_TUNED_N)
    return Estimate(m, max(0.0, m - half), m + half, n)


def _boundary(n: int, alpha: float, tuned_n: int) -> float:
    """The normal mixture's half-width for a mean of ``n`` observations of unit variance,
    valid at every ``n`` (asymptotically), tightest near ``tuned_n``."""
    la = -2 * math.log(alpha)
    rho2 = (la + math.log(la + 1)) / tuned_n
    return math.sqrt(
        2 * (n * rho2 + 1) / (n * n * rho2) * math.log(math.sqrt(n * rho2 + 1) / alpha)
    )


@dataclass(frozen=True)
class Effect:
    """The candidate against the incumbent: a ratio (``kind`` "ratio": ×0.88) or a difference
    in points (``kind`` "points": +4.2), with its interval."""

    value: float | None
    lo: float
    hi: float
    kind: str = "ratio"

    def text(self) -> str:
        """``×0.88 [0.85–0.91]``, ``+4.2 [1.0–7.5] points``, ``×1.42 [0.7–∞]``."""
        if self.value is None:
            return "no figure yet"
        if self.kind == "points":
            return f"{self.value:+.1f} [{self.lo:+.1f} to {self.hi:+.1f}] points"
        return f"×{_g(self.value)} [{_g(self.lo)}–{_g(self.hi)}]"


def _g(x: float) -> str:
    if math.isinf(x):
        return "∞"
    return f"{x:.3g}" if x < 10 else f"{x:.0f}"


def ratio(candidate: Estimate, incumbent: Estimate) -> Effect:
    """The candidate's figure over the incumbent's: each interval at ``alpha / 2`` gives the
    ratio's at ``alpha`` (the arms are independent samples)."""
    if candidate.value is None or incumbent.value is None or incumbent.value <= 0:
        return Effect(None, 0.0, math.inf)
    lo = candidate.lo / incumbent.hi if math.isfinite(incumbent.hi) else 0.0
    hi = candidate.hi / incumbent.lo if incumbent.lo > 0 else math.inf
    return Effect(candidate.value / incumbent.value, lo, hi)


def difference(candidate: Estimate, incumbent: Estimate) -> Effect:
    """The candidate's share less the incumbent's, in points (goodput)."""
    if candidate.value is None or incumbent.value is None:
        return Effect(None, -100.0, 100.0, "points")
    return Effect(
        100 * (candidate.value - incumbent.value),
        100 * (candidate.lo - incumbent.hi),
        100 * (candidate.hi - incumbent.lo),
        "points",
    )


def classify(effect: Effect, margin: float, *, lower_is_better: bool = True) -> str:
    """Where the effect's interval lies against the margin (a share: 0.10 is ±10 % for a
    ratio, ±10 points for a difference): beyond it on the good side ``better``, on the bad
    side ``worse``, inside it on both sides ``equivalent``, else ``inconclusive``."""
    if effect.value is None:
        return INCONCLUSIVE
    if effect.kind == "points":
        low, high, m = effect.lo / 100, effect.hi / 100, margin
        good_low, good_high = -m, m
    else:
        low, high = effect.lo, effect.hi
        good_low, good_high = 1 - margin, 1 + margin
    below, above = high < good_low, low > good_high
    if below or above:
        return BETTER if below == lower_is_better else WORSE
    if low > good_low and high < good_high:
        return EQUIVALENT
    return INCONCLUSIVE


def requests_to_settle(effect: Effect, n: int, margin: float) -> int | None:
    """About how many more requests an arm would settle an inconclusive effect, if it held at
    its estimate: the interval narrows as one over the square root of the count, and must
    narrow until it clears the margin's edge nearest the estimate. None: no estimate, an
    interval not bounded on both sides yet (:func:`bounded_from` says when it will be), or an
    estimate on an edge, which no count settles."""
    if effect.value is None or n <= 0:
        return None
    if effect.kind == "points":
        v, lo, hi = effect.value / 100, effect.lo / 100, effect.hi / 100
        edges = (-margin, margin)
    else:
        if effect.value <= 0 or effect.lo <= 0 or not math.isfinite(effect.hi):
            return None
        v, lo, hi = math.log(effect.value), math.log(effect.lo), math.log(effect.hi)
        edges = (math.log(1 - margin), math.log(1 + margin))
    gap = min(abs(v - e) for e in edges)
    half = max(v - lo, hi - v)
    if gap <= 0 or half <= 0:
        return None
    return max(1, math.ceil(n * (half / gap) ** 2 - n))


@lru_cache(maxsize=256)
def bounded_from(q: float, alpha: float) -> int:
    """The fewest observations whose ``q`` quantile the confidence sequence bounds on both
    sides (with fewer, the top observation is not yet above a ``p99`` surely)."""
    n = 1
    while not _bounded(n, q, alpha):
        n *= 2
    lo, hi = n // 2, n
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if _bounded(mid, q, alpha) else (mid, hi)
    return hi


def _bounded(n: int, q: float, alpha: float) -> bool:
    lo_k, hi_k = count_bounds(n, q, alpha)
    return lo_k >= 1 and hi_k < n


def _log_quantile_var(s: list[float], q: float) -> float | None:
    """The asymptotic variance (per observation) of log of the sample ``q`` quantile of the
    sorted ``s``: q(1 − q) / (f(Q) Q)², the density read off the order statistics' spacing
    (Siddiqui's estimator, Hall–Sheather's bandwidth)."""
    n = len(s)
    z = NormalDist().inv_cdf(q)
    phi = math.exp(-z * z / 2) / math.sqrt(2 * math.pi)
    h = n ** (-1 / 3) * 1.96 ** (2 / 3) * (1.5 * phi * phi / (2 * z * z + 1)) ** (1 / 3)
    h = min(h, (1 - q) * 0.9, q * 0.9)
    i_lo = max(0, math.floor(n * (q - h)) - 1)
    i_hi = min(n - 1, math.ceil(n * (q + h)) - 1)
    spread = s[i_hi] - s[i_lo]
    width = (i_hi - i_lo) / n
    value = _order_statistic(s, q)
    if spread <= 0 or width <= 0 or value <= 0:
        return None
    inv_f = spread / width
    return q * (1 - q) * (inv_f / value) ** 2


def quantile_ratio(
    candidate: Sequence[float], incumbent: Sequence[float], q: float, alpha: float
) -> Effect:
    """The ratio of the arms' ``q`` quantiles with an asymptotic confidence sequence (the
    normal mixture boundary of Waudby-Smith et al. on the log ratio, whose variance comes from
    each arm's density at its quantile)."""
    nc, ni = len(candidate), len(incumbent)
    if min(nc, ni) < TAIL_OBSERVATIONS / (1 - q):  # the density at the tail: not read yet
        return Effect(None, 0.0, math.inf)
    sc, si = sorted(candidate), sorted(incumbent)
    vc, vi = _log_quantile_var(sc, q), _log_quantile_var(si, q)
    qc, qi = _order_statistic(sc, q), _order_statistic(si, q)
    if vc is None or vi is None or qc <= 0 or qi <= 0:
        return Effect(None, 0.0, math.inf)
    n = min(nc, ni)
    half = math.sqrt(n * (vc / nc + vi / ni)) * _boundary(n, alpha, ASYMPTOTIC_TUNED_N)
    d = math.log(qc / qi)
    return Effect(qc / qi, math.exp(d - half), math.exp(d + half))


ASYMPTOTIC_TUNED_N = 2000
TAIL_OBSERVATIONS = 10  # an arm's observations past the quantile before its density is read


def quantile_effect(
    candidate: Sequence[float], incumbent: Sequence[float], q: float, alpha: float
) -> Effect:
    """The ratio of the arms' ``q`` quantiles from per-request figures: the asymptotic
    sequence once each arm has enough observations past the quantile to read its density
    (:data:`TAIL_OBSERVATIONS`), the order statistics' before (wide, but valid from the first
    request)."""
    if min(len(candidate), len(incumbent)) * (1 - q) >= TAIL_OBSERVATIONS:
        return quantile_ratio(candidate, incumbent, q, alpha)
    return ratio(quantile(candidate, q, alpha / 2), quantile(incumbent, q, alpha / 2))
