"""The live trial's statistics (Qt-free, no server): the SLO option, the options' checks and
round trip, the binned Mann-Whitney U test (against a direct computation on the binned values),
the two-proportion test, one arm's figures from two scrapes, the verdict and its honesty under
A/A traffic, the looks' schedule and the rollback rule."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from quantdeck.core.errors import ConfigError
from quantdeck.core.fleet.trial import (
    LOOKS,
    ArmSpan,
    TrialOptions,
    breach,
    judge,
    mann_whitney_binned,
    next_look,
    parse_slo,
    two_proportions,
)
from quantdeck.core.monitor.metrics import Histogram, RawMetrics

# vLLM's TTFT bucket bounds (seconds)
BOUNDS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, math.inf)
Buckets = tuple[tuple[float, float], ...]
INF = math.inf


def cumulative(samples: np.ndarray, bounds: tuple[float, ...] = BOUNDS) -> Buckets:
    """The samples as a Prometheus histogram's cumulative ``(le, count)`` pairs."""
    idx = np.searchsorted(np.asarray(bounds), samples, side="left")  # first bound >= x
    per = np.bincount(idx, minlength=len(bounds))
    return tuple(zip(bounds, (float(c) for c in np.cumsum(per)), strict=True))


def histogram(samples: np.ndarray) -> Histogram:
    b = cumulative(samples)
    return Histogram(buckets=b, count=b[-1][1], total=float(np.sum(samples)))


def reference_p(lower: np.ndarray, upper: np.ndarray) -> float:
    """Mann-Whitney U on the samples' bucket indices, computed directly: midranks, U of the
    ``lower`` sample being smaller, the tie-corrected normal approximation, one-sided."""
    bounds = np.asarray(BOUNDS)
    a = np.searchsorted(bounds, lower, side="left").astype(float)
    b = np.searchsorted(bounds, upper, side="left").astype(float)
    n1, n2 = len(a), len(b)
    n = n1 + n2
    both = np.concatenate([a, b])
    values, inverse, counts = np.unique(both, return_inverse=True, return_counts=True)
    below = np.cumsum(counts) - counts
    midrank = below + (counts + 1) / 2
    r1 = midrank[inverse][:n1].sum()
    u_a_greater = r1 - n1 * (n1 + 1) / 2  # pairs where a's value is larger, ties one half
    u = n1 * n2 - u_a_greater
    # the same U counted pair by pair
    pairs = (a[:, None] < b[None, :]).sum() + 0.5 * (a[:, None] == b[None, :]).sum()
    assert u == pytest.approx(pairs)
    ties = float(np.sum(counts.astype(float) ** 3 - counts))
    var = n1 * n2 / 12 * ((n + 1) - ties / (n * (n - 1)))
    z = (u - n1 * n2 / 2) / math.sqrt(var)
    return 0.5 * math.erfc(z / math.sqrt(2))


def raw(
    t: float,
    *,
    histograms: dict[str, Histogram] | None = None,
    counters: dict[str, float] | None = None,
    finished: dict[str, float] | None = None,
    gauges: dict[str, float] | None = None,
) -> RawMetrics:
    return RawMetrics(
        t=t,
        gauges=gauges or {},
        counters=counters or {},
        histograms=histograms or {},
        finished_by_reason=finished or {},
        num_gpu_blocks=None,
        block_size=None,
    )


def arm(
    ttft: np.ndarray,
    *,
    itl: np.ndarray | None = None,
    queue: np.ndarray | None = None,
    seconds: float = 60.0,
    finished: dict[str, float] | None = None,
) -> ArmSpan:
    """An arm that served ``len(ttft)`` requests since a first scrape with nothing in it."""
    hists = {"ttft": histogram(ttft), "e2e": histogram(ttft * 4 + 0.2)}
    if itl is not None:
        hists["itl"] = histogram(itl)
    if queue is not None:
        hists["queue"] = histogram(queue)
    return ArmSpan(raw(100.0), raw(100.0 + seconds, histograms=hists, finished=finished))


def lognormal(rng: np.random.Generator, n: int, median: float = 0.08) -> np.ndarray:
    return rng.lognormal(math.log(median), 0.6, n)


# -- --slo ---------------------------------------------------------------------------------------
def test_parse_slo_reads_ms_seconds_and_bare_numbers() -> None:
    got = parse_slo(" ttft_p99<=500ms, itl_p99 <= 0.05s ,e2e_p50<=2000,")
    assert got == {"ttft_p99": 500.0, "itl_p99": pytest.approx(50.0), "e2e_p50": 2000.0}
    assert parse_slo("ttft_p90<=.5s") == {"ttft_p90": 500.0}


@pytest.mark.parametrize(
    "text",
    ["", " , ", "ttft_p98<=5", "ttft_p99<500", "ttft_p99<=0", "ttft_p99<=-1", "TTFT_P99<=5",
     "ttft_p99<=5min", "ttft_p99<=5ms;itl_p99<=5", "goodput<=5"],
)  # fmt: skip
def test_parse_slo_refuses_what_it_cannot_read(text: str) -> None:
    with pytest.raises(ConfigError, match="--slo"):
        parse_slo(text)


# -- the options ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"goal": "p99"}, "--goal"),
        ({"decide": "maybe"}, "--decide"),
        ({"goal": "goodput"}, "needs --slo"),
        ({"alpha": 0.0}, "--alpha"),
        ({"alpha": 1.0}, "--alpha"),
        ({"margin": -0.1}, "--margin"),
        ({"margin": 1.0}, "--margin"),
        ({"min_requests": 4}, "--min-requests"),
        ({"max_duration_s": 0.0}, "--max-duration"),
        ({"breach_window_s": -1.0}, "breach window"),
    ],
)
def test_options_refuse_bad_values(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        TrialOptions(**kwargs)  # type: ignore[arg-type]


def test_options_accept_their_bounds() -> None:
    TrialOptions(min_requests=5, margin=0.0, alpha=0.5)
    TrialOptions(goal="goodput", slo={"ttft_p99": 500.0})


def test_options_round_trip_through_json() -> None:
    opts = TrialOptions(
        goal="goodput", slo={"ttft_p99": 500.0, "itl_p90": 40.0}, min_requests=50,
        max_duration_s=120.0, decide="ask", alpha=0.01, margin=0.05, breach_window_s=5.0,
    )  # fmt: skip
    data = json.loads(json.dumps(opts.to_json()))
    assert data["goal"] == "goodput" and data["slo"] == {"ttft_p99": 500.0, "itl_p90": 40.0}
    assert TrialOptions.from_json(data) == opts
    assert TrialOptions.from_json({}) == TrialOptions()


def test_options_from_json_refuse_unknown_keys_and_bad_values() -> None:
    with pytest.raises(ConfigError, match="unknown bogus"):
        TrialOptions.from_json({**TrialOptions().to_json(), "bogus": 1})
    with pytest.raises(ConfigError, match="--goal"):
        TrialOptions.from_json({"goal": "latency"})


# -- Mann-Whitney U on binned data ---------------------------------------------------------------
@pytest.mark.parametrize("seed", range(12))
def test_mann_whitney_binned_matches_a_direct_computation(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n1, n2 = rng.integers(5, 300, size=2)
    x = lognormal(rng, int(n1), median=float(rng.uniform(0.02, 0.3)))
    y = lognormal(rng, int(n2), median=float(rng.uniform(0.02, 0.3)))
    hx, hy = cumulative(x), cumulative(y)
    assert mann_whitney_binned(hx, hy) == pytest.approx(reference_p(x, y), rel=1e-9, abs=1e-15)
    assert mann_whitney_binned(hy, hx) == pytest.approx(reference_p(y, x), rel=1e-9, abs=1e-15)
    # the two one-sided p-values of one pair add up to one
    assert mann_whitney_binned(hx, hy) + mann_whitney_binned(hy, hx) == pytest.approx(1.0)


def test_mann_whitney_binned_uses_the_shared_bounds_only() -> None:
    """A bound one arm has and the other lacks is dropped: as if that arm's histogram were the
    coarser one (its cumulative count at the dropped bound just goes)."""
    rng = np.random.default_rng(7)
    x, y = lognormal(rng, 80), lognormal(rng, 90, median=0.05)
    finer = tuple(sorted((*BOUNDS, 0.03, 0.3)))
    assert mann_whitney_binned(cumulative(x, finer), cumulative(y)) == pytest.approx(
        mann_whitney_binned(cumulative(x), cumulative(y)), rel=1e-12
    )


def test_mann_whitney_binned_is_honest_on_identical_distributions() -> None:
    ps = []
    for seed in range(1000):
        rng = np.random.default_rng(1000 + seed)
        ps.append(
            mann_whitney_binned(cumulative(lognormal(rng, 60)), cumulative(lognormal(rng, 60)))
        )
    assert 0.46 < float(np.mean(ps)) < 0.54
    assert sum(p < 0.05 for p in ps) <= 70  # 50 expected
    assert sum(p < 0.05 / LOOKS for p in ps) <= 15  # 6 expected


def test_mann_whitney_binned_sees_a_clear_shift_in_its_direction() -> None:
    rng = np.random.default_rng(3)
    fast, slow = cumulative(lognormal(rng, 200, 0.04)), cumulative(lognormal(rng, 200, 0.16))
    assert mann_whitney_binned(fast, slow) < 1e-6
    assert mann_whitney_binned(slow, fast) > 1 - 1e-6


def test_mann_whitney_binned_without_information_is_one() -> None:
    empty: Buckets = tuple((le, 0.0) for le in BOUNDS)
    some = cumulative(np.array([0.05, 0.2, 0.7]))
    assert mann_whitney_binned((), some) == 1.0  # an arm without the histogram
    assert mann_whitney_binned(some, ()) == 1.0
    assert mann_whitney_binned(some, ((0.3, 1.0), (INF, 3.0))) == 1.0  # no shared bound...
    assert mann_whitney_binned(((0.3, 1.0),), ((0.4, 1.0),)) == 1.0  # ...not even +Inf
    assert mann_whitney_binned(some, empty) == 1.0
    same_bucket = cumulative(np.full(20, 0.07))  # every observation tied: no variance
    assert mann_whitney_binned(same_bucket, same_bucket) == 1.0


# -- two proportions -----------------------------------------------------------------------------
def test_two_proportions_is_the_pooled_z_test() -> None:
    # 90/100 vs 70/100: pooled 0.8, se sqrt(0.16 * 0.02), z = 0.2 / se
    z = 0.2 / math.sqrt(0.8 * 0.2 * (2 / 100))
    expect = 0.5 * math.erfc(z / math.sqrt(2))
    assert two_proportions(90, 100, 70, 100) == pytest.approx(expect, rel=1e-12)
    assert expect == pytest.approx(2.03e-4, rel=0.01)
    assert two_proportions(70, 100, 90, 100) == pytest.approx(1 - expect, rel=1e-12)
    assert two_proportions(40, 80, 50, 100) == pytest.approx(0.5)


def test_two_proportions_without_information_is_one() -> None:
    assert two_proportions(0, 0, 5, 10) == 1.0
    assert two_proportions(5, 10, 0, 0.5) == 1.0
    assert two_proportions(10, 10, 30, 30) == 1.0  # all good on both sides: no variance
    assert two_proportions(0, 10, 0, 30) == 1.0


# -- one arm's span ------------------------------------------------------------------------------
def _h(*pairs: tuple[float, float], total: float = 0.0) -> Histogram:
    return Histogram(buckets=pairs, count=pairs[-1][1], total=total)


START = raw(
    1000.0,
    histograms={
        "e2e": _h((0.5, 2), (1.0, 6), (INF, 6)),
        "ttft": _h((0.1, 4), (0.5, 6), (INF, 6)),
        "itl": _h((0.01, 100), (0.05, 200), (INF, 200), total=5.0),
    },
    counters={"generation_tokens": 1000, "preemptions": 1},
    finished={"stop": 5, "length": 1, "abort": 1},
    gauges={"kv_usage": 0.1},
)
END = raw(
    1040.0,
    histograms={
        "e2e": _h((0.5, 12), (1.0, 26), (INF, 30)),  # +10, +10, +4
        "ttft": _h((0.1, 20), (0.5, 28), (INF, 30)),  # +16, +6, +2
        "itl": _h((0.01, 700), (0.05, 1000), (INF, 1000), total=17.0),  # 800 tokens in 12 s
    },
    counters={"generation_tokens": 3000, "preemptions": 4},
    finished={"stop": 20, "length": 5, "abort": 3, "error": 2},
    gauges={"kv_usage": 0.4567},
)


def test_arm_span_counts_what_happened_between_the_scrapes() -> None:
    span = ArmSpan(START, END)
    assert span.buckets("e2e") == ((0.5, 10), (1.0, 20), (INF, 24))
    assert span.requests == 24
    assert span.errors == 4  # 2 more aborted, 2 errors; stop and length are not errors
    assert span.seconds == 40.0
    assert span.counter("generation_tokens") == 2000
    assert span.counter("missing") == 0


def test_arm_span_figures() -> None:
    fig = ArmSpan(START, END).figures({"ttft_p99": 300.0}).to_json()
    assert fig == {
        "requests": 24,
        "seconds": 40.0,
        "ttft_p50_ms": pytest.approx(100 * 12 / 16, abs=1e-3),  # rank 12 of 16 in the first bucket
        "ttft_p99_ms": 500.0,  # rank 23.76 of 24 is in +Inf: the highest finite bound
        "itl_p50_ms": pytest.approx(10 * 400 / 600, abs=1e-3),  # rounded to µs
        "itl_p99_ms": pytest.approx(10 + 40 * (792 - 600) / 200, abs=1e-3),
        "e2e_p50_ms": pytest.approx(500 + 500 * 2 / 10, abs=1e-3),
        "e2e_p99_ms": 1000.0,
        "tokens_per_s": 50.0,
        "decode_tokens_per_s": pytest.approx(800 / 12, abs=0.01),
        "goodput_pct": pytest.approx(100 * (16 + 6 * 0.5) / 24, abs=0.01),
        "errors": 4,
        "preemptions": 3,
        "kv_usage_pct": 45.67,
    }


def test_arm_span_without_data() -> None:
    span = ArmSpan(raw(5.0), raw(5.0))
    assert span.requests == 0 and span.errors == 0 and span.seconds > 0
    assert span.slo_share({"ttft_p99": 100.0}) is None
    fig = span.figures({})
    assert fig.ttft_p99_ms is None and fig.decode_tokens_per_s is None
    assert fig.goodput_pct is None and fig.kv_usage_pct is None
    # a counter that went back (the server restarted) counts nothing, not a negative
    assert ArmSpan(END, START).counter("generation_tokens") == 0
    assert ArmSpan(END, START).errors == 0


def test_slo_share_is_the_lowest_per_limit_share() -> None:
    span = ArmSpan(START, END)
    ttft_share = (16 + 6 * 0.5) / 24  # 300 ms: halfway through the (0.1, 0.5] bucket
    e2e_share = 10 / 24  # 500 ms: the first bucket's bound
    assert span.slo_share({"ttft_p99": 300.0}) == pytest.approx(ttft_share)
    assert span.slo_share({"ttft_p99": 300.0, "e2e_p50": 500.0}) == pytest.approx(e2e_share)
    # the 2 requests in the +Inf bucket cannot be known to be within any limit
    assert span.slo_share({"ttft_p99": 10_000.0}) == pytest.approx(22 / 24)


# -- the verdict ---------------------------------------------------------------------------------
def test_too_few_requests_is_undecided_even_when_time_is_up() -> None:
    """Before: at the time limit, 0 and 0 requests read "no difference" (a screenshot's trial
    whose load had ended). Nothing was compared: it stays undecided, and the trial rolls back
    for want of traffic, saying so."""
    rng = np.random.default_rng(0)
    inc, cand = arm(lognormal(rng, 29, 0.2)), arm(lognormal(rng, 100, 0.02))
    v = judge(inc, cand, TrialOptions())
    assert v.outcome == "undecided" and v.p_value is None
    assert v.n_incumbent == 29 and v.n_candidate == 100
    assert "30 per arm" in v.reason
    final = judge(inc, cand, TrialOptions(), final=True)
    assert final.outcome == "undecided" and "30 per arm" in final.reason
    assert judge(inc, cand, TrialOptions(min_requests=29)).outcome == "better"
    # with enough requests, the last look's open verdict is "no difference"
    same = arm(lognormal(rng, 60, 0.05)), arm(lognormal(rng, 60, 0.05))
    assert judge(*same, TrialOptions(), final=True).outcome == "no difference"


def test_arms_without_the_goal_histogram_are_not_judged() -> None:
    """Requests finished (e2e) but no TTFT histogram scraped: no test, no crash."""
    rng = np.random.default_rng(9)
    e2e = {"e2e": histogram(lognormal(rng, 50))}
    bare = ArmSpan(raw(0.0), raw(60.0, histograms=e2e))
    v = judge(bare, bare, TrialOptions(), final=True)
    assert v.outcome == "no difference" and v.p_value == 1.0
    assert v.incumbent is None and v.effect is None


def test_a_faster_candidate_is_better_and_a_slower_one_worse() -> None:
    rng = np.random.default_rng(1)
    slow, fast = arm(lognormal(rng, 200, 0.16)), arm(lognormal(rng, 200, 0.04))
    v = judge(slow, fast, TrialOptions())
    assert v.outcome == "better", v
    assert v.p_value is not None and v.p_value < v.threshold == 0.05 / LOOKS
    assert v.candidate is not None and v.incumbent is not None and v.candidate < v.incumbent
    assert v.effect == pytest.approx(v.candidate / v.incumbent, abs=1e-4) and v.effect < 0.9
    assert v.test == "Mann-Whitney U (binned)" and "ttft_p99" in v.reason
    assert v.to_json()["confidence"] == pytest.approx(1 - v.p_value, abs=1e-4)
    w = judge(fast, slow, TrialOptions())
    assert w.outcome == "worse", w
    assert w.effect is not None and w.effect > 1.1


def test_same_traffic_is_undecided_until_the_last_look() -> None:
    rng = np.random.default_rng(2)
    a, b = arm(lognormal(rng, 400)), arm(lognormal(rng, 400))
    v = judge(a, b, TrialOptions())
    assert v.outcome == "undecided" and v.p_value is not None and v.p_value >= v.threshold
    assert "is not under" in v.reason
    assert judge(a, b, TrialOptions(), final=True).outcome == "no difference"


def test_a_difference_within_the_margin_is_no_difference() -> None:
    rng = np.random.default_rng(4)
    inc, cand = arm(lognormal(rng, 400, 0.12)), arm(lognormal(rng, 400, 0.06))
    assert judge(inc, cand, TrialOptions(margin=0.0)).outcome == "better"
    v = judge(inc, cand, TrialOptions(margin=0.9), final=True)  # needs a p99 ten times lower
    assert v.outcome == "no difference", v
    assert v.p_value is not None and v.p_value < v.threshold
    assert "within the 90% margin" in v.reason


def test_goodput_goal_is_judged_on_the_slo_shares() -> None:
    rng = np.random.default_rng(5)
    inc, cand = arm(lognormal(rng, 300, 0.3)), arm(lognormal(rng, 300, 0.05))
    opts = TrialOptions(goal="goodput", slo={"ttft_p99": 250.0})
    v = judge(inc, cand, opts)
    assert v.outcome == "better" and v.test == "two-proportion z"
    assert v.candidate is not None and v.incumbent is not None
    assert v.effect == pytest.approx(v.candidate - v.incumbent, abs=0.02) and v.effect > 10
    assert "points" in v.reason
    assert judge(cand, inc, opts).outcome == "worse"
    # an SLO on a histogram neither arm has: no figures, no verdict
    none = judge(inc, cand, TrialOptions(goal="goodput", slo={"itl_p99": 50.0}), final=True)
    assert none.outcome == "no difference" and none.reason == "no SLO figures yet"


def test_throughput_goal_is_judged_on_inter_token_latency() -> None:
    rng = np.random.default_rng(6)
    ttft = lognormal(rng, 100)
    slow = arm(ttft, itl=rng.lognormal(math.log(0.04), 0.3, 3000))
    fast = arm(ttft, itl=rng.lognormal(math.log(0.02), 0.3, 3000))
    v = judge(slow, fast, TrialOptions(goal="throughput"))
    assert v.outcome == "better", v
    assert v.candidate is not None and v.incumbent is not None
    assert v.candidate > 1.5 * v.incumbent  # decode tokens/s: higher is better
    assert judge(fast, slow, TrialOptions(goal="throughput")).outcome == "worse"


def test_a_a_trials_rarely_find_a_difference() -> None:
    """The honest verdict: with the same distribution on both arms, the default options at the
    last look call "better" or "worse" in no more than ~5 % of trials."""
    opts = TrialOptions()
    outcomes = []
    for seed in range(200):
        rng = np.random.default_rng(seed)
        outcomes.append(judge(arm(lognormal(rng, 60)), arm(lognormal(rng, 60)), opts, final=True))
    assert all(v.outcome in ("better", "worse", "no difference") for v in outcomes)
    assert sum(v.outcome != "no difference" for v in outcomes) <= 10


def _found_better(sigma: float) -> int:
    """Of 200 trials of n=60 per arm, the candidate's latencies half the incumbent's (a
    lognormal of spread ``sigma``): how many are judged better at the last look."""
    opts = TrialOptions()
    better = 0
    for seed in range(200):
        rng = np.random.default_rng(10_000 + seed)
        inc = arm(rng.lognormal(math.log(0.08), sigma, 60))
        cand = arm(rng.lognormal(math.log(0.04), sigma, 60))
        better += judge(inc, cand, opts, final=True).outcome == "better"
    return better


def test_a_twice_faster_candidate_is_found_better() -> None:
    assert _found_better(0.4) >= 190


# with a few dozen requests an arm's p99 is its slowest one (noise): the effect is read at p90
# until each arm has TAIL_REQUESTS (the test still sees the shift)
def test_a_twice_faster_candidate_with_a_wider_spread_is_found_better() -> None:
    assert _found_better(0.6) >= 190


# -- the looks -----------------------------------------------------------------------------------
def test_next_look_waits_for_the_minimum_then_grows_by_half() -> None:
    opts = TrialOptions()
    assert next_look(0, opts) == 45
    assert next_look(10, opts) == 45
    assert next_look(30, opts) == 45
    assert next_look(45, opts) == 68
    assert next_look(68, opts) == 102
    assert next_look(2, TrialOptions(min_requests=5)) == 8
    n = 0
    for _ in range(40):
        after = next_look(n, opts)
        assert after > n and after >= 1.5 * max(n, opts.min_requests)
        n = after


# -- the rollback rule ---------------------------------------------------------------------------
def test_an_error_burst_rolls_back() -> None:
    rng = np.random.default_rng(8)
    opts = TrialOptions()
    assert breach(arm(lognormal(rng, 20)), opts) is None
    burst = breach(arm(lognormal(rng, 20), finished={"abort": 2, "error": 1}, seconds=10), opts)
    assert burst == "3 failed requests of 23 in 10 s"
    assert breach(arm(lognormal(rng, 2), finished={"error": 2}), opts) is None  # two: no burst
    # three errors among many requests are under the burst share
    assert breach(arm(lognormal(rng, 100), finished={"error": 3}), opts) is None
    assert breach(arm(lognormal(rng, 100), finished={"error": 12}), opts) is not None
    assert breach(arm(np.array([]), finished={"error": 3}), opts) is not None


def test_an_slo_breach_rolls_back() -> None:
    opts = TrialOptions(slo={"ttft_p99": 500.0})
    ok = arm(np.full(20, 0.05))
    slow = arm(np.concatenate([np.full(10, 0.05), np.full(10, 0.9)]))
    assert breach(ok, opts) is None
    msg = breach(slow, opts)
    assert msg is not None and msg.startswith("SLO breach: ttft_p99 ")
    assert "> 500 ms" in msg and "(20 requests)" in msg
    assert breach(slow, TrialOptions(slo={"ttft_p99": 2000.0})) is None
    assert breach(slow, TrialOptions()) is None  # no SLO, no breach
    # too few requests in the window to call a breach
    assert breach(arm(np.full(4, 3.0)), opts) is None
    assert breach(arm(np.full(5, 3.0)), opts) is not None


def test_a_difference_made_of_queueing_carries_a_caveat() -> None:
    """A/A trials under a fixed number of clients that kept every seat busy called 8 of 10 a
    difference here: the router's alternate split let one arm's queue grow. A verdict whose
    slower arm spent most of its TTFT queueing says so (and what to check); one where the
    arms differ in their own speed does not."""
    rng = np.random.default_rng(7)
    fast = lognormal(rng, 200, 0.03)
    slow_service = lognormal(rng, 200, 0.03)
    waits = lognormal(rng, 200, 0.2)
    opts = TrialOptions()
    queued = judge(arm(slow_service + waits, queue=waits), arm(fast, queue=fast * 0.01), opts)
    assert queued.outcome == "better"
    assert "caveat: " in queued.reason and "queueing" in queued.reason
    assert "open load" in queued.reason
    # the candidate slower, from queueing too: "worse", with the caveat about the candidate
    worse = judge(arm(fast, queue=fast * 0.01), arm(slow_service + waits, queue=waits), opts)
    assert worse.outcome == "worse" and "caveat: " in worse.reason
    # the same difference in the arms' own speed (no queue): no caveat
    own = judge(arm(slow_service * 8, queue=fast * 0.01), arm(fast, queue=fast * 0.01), opts)
    assert own.outcome == "better" and "caveat" not in own.reason
    # an ITL goal is per token, not queueing: never a caveat
    itl = TrialOptions(goal="itl_p99")
    a, b = arm(fast, itl=fast * 3, queue=waits), arm(fast, itl=fast, queue=waits)
    assert "caveat" not in judge(a, b, itl).reason
