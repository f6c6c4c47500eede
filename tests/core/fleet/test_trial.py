"""The live trial's judge (Qt-free, no server): the SLO option, the options' checks and round
trip, one arm's figures from two scrapes, the verdict from the arms' histograms (its four
outcomes, its interval, its figures the arms' own, its honesty under A/A traffic) and the
rollback rule."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from quantdeck.core.errors import ConfigError
from quantdeck.core.evidence import bounded_from
from quantdeck.core.fleet.trial import (
    ArmSpan,
    TrialOptions,
    breach,
    judge,
    parse_slo,
)
from quantdeck.core.monitor.metrics import Histogram, RawMetrics
from quantdeck.core.payloads import Verdict

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
        "ttft_p90_ms": pytest.approx(100 + 400 * 5.6 / 6, abs=1e-3),  # rank 21.6 of 24
        "itl_p90_ms": pytest.approx(10 + 40 * 120 / 200, abs=1e-3),
        "e2e_p90_ms": 1000.0,
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
def test_too_few_requests_is_inconclusive_before_the_first_look() -> None:
    """Before: at the time limit, 0 and 0 requests read "no difference". Nothing was compared:
    inconclusive, saying how many an arm the first look needs."""
    rng = np.random.default_rng(0)
    inc, cand = arm(lognormal(rng, 29, 0.2)), arm(lognormal(rng, 100, 0.02))
    v = judge(inc, cand, TrialOptions())
    assert v.outcome == "inconclusive" and v.effect is None
    assert (v.n_incumbent, v.n_candidate) == (29, 100)
    assert v.reason == "29 and 100 requests measured; 30 an arm before the first look"
    assert v.describe().startswith("TTFT p99: inconclusive (29 and 100 requests measured")


def test_a_much_faster_candidate_is_better_with_the_arms_own_figures() -> None:
    """Before: a decision's reason said "candidate 9.61 vs incumbent 16.9" (p90s) while its
    arms said 31.6 and 19.7 ms (p99s). The verdict's figures are the arms' table's, named as
    what they are, with the interval the outcome was read from."""
    rng = np.random.default_rng(1)
    slow, fast = arm(lognormal(rng, 2000, 0.16)), arm(lognormal(rng, 2000, 0.04))
    v = judge(slow, fast, TrialOptions())
    assert v.outcome == "better", v.describe()
    assert v.figure == "TTFT p99" and "histograms" in v.source
    assert v.incumbent == slow.figures({}).ttft_p99_ms
    assert v.candidate == fast.figures({}).ttft_p99_ms
    assert v.effect == pytest.approx(v.candidate / v.incumbent, abs=1e-4)
    assert v.lo is not None and v.hi is not None and v.lo <= v.effect <= v.hi < 0.9
    said = v.describe()
    assert said.startswith(f"TTFT p99 {v.incumbent:,.4g} → {v.candidate:,.4g} ms, ×")
    assert "better (beyond the 10 % margin) · 2000 / 2000 requests" in said
    w = judge(fast, slow, TrialOptions())
    assert w.outcome == "worse" and w.lo is not None and w.lo > 1.1


def test_a_difference_inside_one_bucket_stays_inconclusive() -> None:
    """Both arms' p99 inside vLLM's (0.1, 0.25] s bucket: the histograms cannot say which is
    lower, however many requests come; inconclusive, never "no difference"."""
    inc = arm(np.concatenate([np.full(4850, 0.05), np.full(150, 0.24)]))
    cand = arm(np.concatenate([np.full(4850, 0.05), np.full(150, 0.12)]))
    v = judge(inc, cand, TrialOptions())
    assert v.outcome == "inconclusive", v.describe()
    assert v.effect == 1.0  # the true p99s are 240 and 120 ms; the buckets' counts the same
    assert v.lo is not None and v.lo <= 0.4 and v.hi is not None and v.hi >= 2.5


def test_a_p99_too_thin_to_bound_is_read_at_p90_saying_so() -> None:
    """40 requests an arm: no p99 can be bounded (the issue's 18 / 19 requests, "+42 %",
    read as "no difference"); the verdict reads p90, names it p90, says why, and says about
    how many more requests an arm would bound even that."""
    rng = np.random.default_rng(3)
    inc, cand = arm(lognormal(rng, 40, 0.08)), arm(lognormal(rng, 40, 0.12))
    v = judge(inc, cand, TrialOptions())
    assert v.outcome == "inconclusive" and v.figure == "TTFT p90" and v.hi is None
    assert v.reason == "read at p90: a p99 is bounded from 555 requests an arm, 40 measured"
    assert v.incumbent == inc.figures({}).ttft_p90_ms  # the arms' own p90, in their table
    assert v.needed is not None and v.needed + 40 == bounded_from(0.9, 0.025)
    assert f"about {v.needed:,} more requests an arm would settle it" in v.describe()
    many = judge(arm(lognormal(rng, 600, 0.08)), arm(lognormal(rng, 600, 0.08)), TrialOptions())
    assert many.figure == "TTFT p99" and many.reason == ""


def test_a_a_trials_are_never_called_better_or_worse() -> None:
    """The same distribution on both arms, 100 trials of 500 requests an arm, looked at every
    50: none is called better or worse at any look."""
    opts = TrialOptions()
    called = 0
    for seed in range(100):
        rng = np.random.default_rng(seed)
        a, b = lognormal(rng, 500), lognormal(rng, 500)
        for n in range(50, 501, 50):
            if judge(arm(a[:n]), arm(b[:n]), opts).outcome in ("better", "worse"):
                called += 1
                break
    assert called <= 5


def test_goodput_goal_is_judged_on_the_slo_shares() -> None:
    rng = np.random.default_rng(5)
    inc, cand = arm(lognormal(rng, 300, 0.3)), arm(lognormal(rng, 300, 0.05))
    opts = TrialOptions(goal="goodput", slo={"ttft_p99": 250.0})
    v = judge(inc, cand, opts)
    assert v.outcome == "better" and v.kind == "points", v.describe()
    assert v.candidate is not None and v.incumbent is not None
    assert v.effect == pytest.approx(v.candidate - v.incumbent, abs=0.02) and v.effect > 10
    assert "points" in v.describe()
    assert judge(cand, inc, opts).outcome == "worse"
    # an SLO on a histogram neither arm has: no figures, no verdict
    none = judge(inc, cand, TrialOptions(goal="goodput", slo={"itl_p99": 50.0}))
    assert none.outcome == "inconclusive" and none.effect is None


def test_throughput_goal_is_judged_on_decode_speed() -> None:
    rng = np.random.default_rng(6)
    ttft = lognormal(rng, 100)
    slow = arm(ttft, itl=rng.lognormal(math.log(0.04), 0.3, 3000))
    fast = arm(ttft, itl=rng.lognormal(math.log(0.02), 0.3, 3000))
    v = judge(slow, fast, TrialOptions(goal="throughput"))
    assert v.outcome == "better", v.describe()
    assert v.candidate is not None and v.incumbent is not None
    assert v.candidate > 1.5 * v.incumbent  # decode tokens/s: higher is better
    assert v.figure == "decode speed" and "tok/s" in v.describe()
    assert judge(fast, slow, TrialOptions(goal="throughput")).outcome == "worse"


def test_a_verdict_recorded_before_reads_back_in_its_words() -> None:
    """A recording's verdict from before issue 45 (a test's p, no interval) replays as it was
    said; the new verdict writes no p."""
    old = {
        "outcome": "no difference", "goal": "ttft_p99", "test": "Mann-Whitney U (binned)",
        "p_value": 0.2, "threshold": 0.00625, "effect": 0.9, "incumbent": 10.0,
        "candidate": 9.0, "n_incumbent": 18, "n_candidate": 19, "reason": "p = 0.2",
        "confidence": 0.8,
    }  # fmt: skip
    v = Verdict.from_json(old)
    assert v.outcome == "no difference" and v.n_candidate == 19 and v.lo is None
    assert "p_value" not in Verdict("better").to_json()


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
    fast = lognormal(rng, 2000, 0.03)
    slow_service = lognormal(rng, 2000, 0.03)
    waits = lognormal(rng, 2000, 0.2)
    opts = TrialOptions()
    queued = judge(arm(slow_service + waits, queue=waits), arm(fast, queue=fast * 0.01), opts)
    assert queued.outcome == "better", queued.describe()
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
