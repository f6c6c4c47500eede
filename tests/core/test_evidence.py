"""core/evidence.py: intervals that hold at every look, and the four outcomes.

The coverage tests draw seeded samples and look after every observation (or every few): the
share of sequences whose interval ever misses the truth stays under ``alpha``, which is what
"valid at every look" means; a fixed-sample interval looked at so often would miss far more
(shown for contrast on the same draws)."""

from __future__ import annotations

import math
import random

import pytest

from quantdeck.core import evidence
from quantdeck.core.evidence import (
    BETTER,
    EQUIVALENT,
    INCONCLUSIVE,
    WORSE,
    Effect,
    Estimate,
    binned_quantile,
    bounded_from,
    classify,
    count_bounds,
    difference,
    quantile,
    quantile_ratio,
    ratio,
    requests_to_settle,
    share,
)


def test_the_count_bounds_hold_at_every_look_where_a_fixed_interval_does_not() -> None:
    """200 Bernoulli(0.9) sequences of 1,500, looked at after every trial: the sequence's
    bounds are left by under alpha of them; the usual fixed-n 90 % interval by most."""
    rng = random.Random(45)
    alpha, p, n_max = 0.1, 0.9, 1500
    ever_out = ever_out_fixed = 0
    for _ in range(200):
        k, out, out_fixed = 0, False, False
        for n in range(1, n_max + 1):
            k += rng.random() < p
            lo, hi = count_bounds(n, p, alpha)
            out = out or not lo <= k <= hi
            half = 1.645 * math.sqrt(n * p * (1 - p))
            out_fixed = out_fixed or (n >= 30 and abs(k - n * p) > half)
        ever_out += out
        ever_out_fixed += out_fixed
    assert ever_out / 200 <= alpha
    assert ever_out_fixed / 200 > 0.3  # why the looks need a sequence


def test_a_quantiles_interval_holds_the_true_one_at_every_look() -> None:
    """Lognormal latencies (true p99 known), looked at every 50 requests up to 3,000: the
    interval from the order statistics misses the true p99 in under alpha of 100 runs."""
    rng = random.Random(7)
    alpha, q, sigma = 0.1, 0.99, 0.6
    true = math.exp(sigma * 2.3263478740408408)
    missed = 0
    for _ in range(100):
        values: list[float] = []
        miss = False
        for _ in range(60):
            values.extend(rng.lognormvariate(0, sigma) for _ in range(50))
            e = quantile(values, q, alpha)
            miss = miss or not e.lo <= true <= e.hi
        missed += miss
    assert missed / 100 <= alpha


def test_a_p99_is_unbounded_until_the_sample_can_bound_it() -> None:
    n = bounded_from(0.99, 0.05)
    assert 300 < n < 1000  # a few hundred requests before anything is said of a p99
    few = quantile([float(i) for i in range(n - 1)], 0.99, 0.05)
    assert math.isinf(few.hi) and not few.bounded
    enough = quantile([float(i) for i in range(n)], 0.99, 0.05)
    assert enough.bounded and enough.lo <= enough.value <= enough.hi  # type: ignore[operator]


def test_a_histograms_bounds_are_its_bucket_edges() -> None:
    """1,000 observations: 900 at or under 0.1 s, 90 more under 0.25, 10 under 0.5: the p99's
    interval is whole buckets (no value inside one is known), its estimate interpolates."""
    buckets = ((0.05, 500.0), (0.1, 900.0), (0.25, 990.0), (0.5, 1000.0), (math.inf, 1000.0))
    e = binned_quantile(buckets, 0.99, 0.05)
    assert e.n == 1000 and e.value == pytest.approx(0.25)
    assert e.lo in (0.1, 0.25) and e.hi in (0.5, math.inf)
    assert binned_quantile((), 0.99, 0.05) == Estimate(None, 0.0, math.inf, 0)


def test_a_share_interval_holds_and_narrows() -> None:
    small, large = share(9, 10, 0.05), share(900, 1000, 0.05)
    assert small.lo < 0.9 < small.hi and large.lo < 0.9 < large.hi
    assert large.hi - large.lo < (small.hi - small.lo) / 3
    assert share(0, 0, 0.05).value is None


def test_the_four_outcomes_against_the_margin() -> None:
    m = 0.1
    assert classify(Effect(0.8, 0.75, 0.85), m) == BETTER  # beyond 0.9 on the good side
    assert classify(Effect(1.3, 1.2, 1.4), m) == WORSE
    assert classify(Effect(1.0, 0.95, 1.05), m) == EQUIVALENT  # within ±10 % both sides
    assert classify(Effect(0.88, 0.85, 0.91), m) == INCONCLUSIVE  # better, not surely by 10 %
    assert classify(Effect(1.42, 0.7, 2.9), m) == INCONCLUSIVE
    assert classify(Effect(None, 0.0, math.inf), m) == INCONCLUSIVE
    # throughput: higher is better
    assert classify(Effect(1.3, 1.2, 1.4), m, lower_is_better=False) == BETTER
    # a share's difference in points
    assert classify(Effect(12.0, 11.0, 13.0, "points"), m, lower_is_better=False) == BETTER
    assert classify(Effect(1.0, -4.0, 5.0, "points"), m, lower_is_better=False) == EQUIVALENT


def test_the_ratio_and_difference_intervals_bound_each_arms() -> None:
    c, i = Estimate(80.0, 70.0, 90.0, 500), Estimate(100.0, 95.0, 110.0, 500)
    r = ratio(c, i)
    assert (r.value, r.lo, r.hi) == pytest.approx((0.8, 70 / 110, 90 / 95))
    assert r.text() == "×0.8 [0.636–0.947]"
    assert ratio(c, Estimate(100.0, 0.0, math.inf, 5)).text() == "×0.8 [0–∞]"
    d = difference(Estimate(0.95, 0.9, 0.98, 100), Estimate(0.9, 0.85, 0.95, 100))
    assert d.text() == "+5.0 [-5.0 to +13.0] points"


def test_requests_to_settle_grows_as_the_effect_nears_the_margin() -> None:
    far = requests_to_settle(Effect(0.6, 0.4, 0.95), 100, 0.1)
    near = requests_to_settle(Effect(0.85, 0.6, 1.2), 100, 0.1)
    assert far is not None and near is not None and 0 < far < near
    assert requests_to_settle(Effect(1.42, 0.0, math.inf), 18, 0.1) is None  # unbounded
    assert requests_to_settle(Effect(None, 0.0, math.inf), 18, 0.1) is None


def test_the_asymptotic_ratio_waits_for_the_tail_then_is_calibrated() -> None:
    """A/A: the same lognormal on both arms, looked at every 200 requests to 6,000: no run
    of 60 ends better or worse; a 40 % slower candidate is called worse in most."""
    rng = random.Random(3)
    q, alpha = 0.99, 0.05
    assert quantile_ratio([1.0] * 500, [1.0] * 500, q, alpha).value is None  # no tail yet
    wrong = worse = 0
    for effect in (1.0, 1.4):
        for _ in range(60):
            a: list[float] = []
            b: list[float] = []
            for _ in range(30):
                a.extend(rng.lognormvariate(0, 0.5) for _ in range(200))
                b.extend(effect * rng.lognormvariate(0, 0.5) for _ in range(200))
                word = classify(quantile_ratio(b, a, q, alpha), 0.1)
                if word in (BETTER, WORSE):
                    break
            if effect == 1.0:
                wrong += word in (BETTER, WORSE)
            else:
                worse += word == WORSE
    assert wrong == 0 and worse >= 45


def test_outcome_words_are_the_ones_the_module_names() -> None:
    assert evidence.OUTCOMES == (BETTER, WORSE, EQUIVALENT, INCONCLUSIVE)


def test_a_share_of_all_or_none_is_bounded_away_from_the_other_end() -> None:
    """Every request good (or none): (b + n) − k once rounded to 0 and the log of 0's gamma
    failed; the interval reaches the end it sits at and stops short of the other."""
    all_good, none_good = share(300, 300, 0.025), share(0, 300, 0.025)
    assert all_good.value == 1.0 and 0.95 < all_good.lo < 1.0 and all_good.hi == pytest.approx(1)
    assert none_good.value == 0.0 and none_good.lo == pytest.approx(0) and none_good.hi < 0.05
