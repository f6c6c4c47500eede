"""How often a trial's verdict is wrong, how often it is right, and how soon (issue 45).

    python benchmarks/verdicts.py                       (about 2 min on 2 cores)
    python benchmarks/verdicts.py --trials 400 --source h200-ttft --arrivals closed

Simulated live trials: two arms draw latencies from a recorded distribution, the candidate's
scaled by a known effect (0 %, ±5 %, ±10 %, ±20 %, ±40 % on every percentile, the goal's p99
among them), under open arrivals (each request independent) or a closed loop (clients that
send their next request when the last one ends, split by the router's round robin over two
arms of a few seats each: a queue on one arm delays its next requests, so they are not
independent). Each trial is judged as it goes, at the looks its method takes, until a
decision or the time limit, by:

- ``current``: the trial as it decided before issue 45 (benchmarks/_judge_before.py: a
  Mann-Whitney test on vLLM's histogram buckets, Bonferroni over 8 planned looks, the point
  p99 ratio against the margin; "no difference" at the limit);
- ``requests``: core/evidence.py's confidence sequence for the p99 of each arm's per-request
  figures, a look after every 10 % more requests;
- ``histogram``: the same intervals from the arms' histogram buckets only (what ``/metrics``
  alone allows).

Prints, per effect: the share of trials ending better, worse, equivalent (``current``: "no
difference"), inconclusive (``current``: undecided), and the median time to a decision.
A wrong verdict is better/worse for an effect inside the margin, or the opposite direction.

Sources (``--source``): ``h200-ttft`` / ``h200-e2e`` (the H200 fixture's histograms under
load, sampled uniformly inside each bucket), ``lognormal`` (p50 50 ms, p99 200 ms), or a saved
run's JSON (``--source path/to/run.json``: its requests' TTFTs, resampled).
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import random
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from _judge_before import judge, next_look

from quantdeck.core import evidence
from quantdeck.core.fleet.trial import ArmSpan, TrialOptions
from quantdeck.core.monitor.metrics import Histogram, RawMetrics, parse_metrics

ROOT = Path(__file__).resolve().parent.parent
H200_LOAD = ROOT / "tests" / "fixtures" / "h200" / "metrics-h200-after.txt"
H200_IDLE = ROOT / "tests" / "fixtures" / "h200" / "metrics-h200-idle.txt"
# vLLM's bucket bounds (the fixture's): a simulated arm's histograms use the same
TTFT_BOUNDS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0, math.inf)  # fmt: skip
EFFECTS = (1.0, 0.95, 1.05, 0.9, 1.1, 0.8, 1.2, 0.6, 1.4)
METHODS = ("current", "requests", "histogram", "asymptotic")


# -- where latencies come from ---------------------------------------------------------------
def from_histogram(key: str) -> Callable[[random.Random], float]:
    """Draws from the H200 fixture's histogram ``key`` (the load's less the idle's counts),
    uniform within a bucket (the +Inf bucket left out)."""
    load = parse_metrics(H200_LOAD.read_text()).histograms[key]
    idle = parse_metrics(H200_IDLE.read_text()).histograms.get(key)
    before = dict(idle.buckets) if idle else {}
    edges, weights, last_le, last_c = [], [], 0.0, 0.0
    for le, c in load.buckets:
        c -= before.get(le, 0.0)
        if math.isfinite(le) and c > last_c:
            edges.append((last_le, le))
            weights.append(c - last_c)
        last_le, last_c = le, max(last_c, c)

    def draw(rng: random.Random) -> float:
        a, b = rng.choices(edges, weights)[0]
        return rng.uniform(a, b)

    return draw


def lognormal(p50: float = 0.05, p99: float = 0.2) -> Callable[[random.Random], float]:
    sigma = math.log(p99 / p50) / 2.326
    return lambda rng: rng.lognormvariate(math.log(p50), sigma)


def from_run(path: Path) -> Callable[[random.Random], float]:
    run = json.loads(path.read_text())
    values = [r["ttft"] for r in run["requests"] if r.get("success", True) and r.get("ttft")]
    if not values:
        sys.exit(f"{path}: no request with a TTFT")
    return lambda rng: rng.choice(values)


# -- the two arms' traffic --------------------------------------------------------------------
@dataclass
class Request:
    arm: int  # 0 incumbent, 1 candidate
    end: float  # when it finished (s from the start)
    latency: float  # s


def open_arrivals(
    draw: Callable[[random.Random], float], effect: float, rate: float, limit_s: float,
    rng: random.Random,
) -> list[Request]:  # fmt: skip
    """Poisson arrivals at ``rate`` a second, alternately to each arm; each latency drawn
    independently (the candidate's scaled by ``effect``)."""
    out, t, arm = [], 0.0, 0
    while t < limit_s:
        t += rng.expovariate(rate)
        lat = draw(rng) * (effect if arm else 1.0)
        out.append(Request(arm, t + lat, lat))
        arm = 1 - arm
    out.sort(key=lambda r: r.end)
    return out


def closed_loop(
    draw: Callable[[random.Random], float], effect: float, clients: int, seats: int,
    limit_s: float, rng: random.Random,
) -> list[Request]:  # fmt: skip
    """``clients`` that each send their next request as the last one ends, the router's
    round robin over the two arms, each arm serving ``seats`` at a time in arrival order: a
    request's latency is its wait for a seat and its service (drawn, the candidate's scaled)."""
    free = [[0.0] * seats, [0.0] * seats]  # when each seat of each arm is free next
    for f in free:
        heapq.heapify(f)
    sends = [(rng.uniform(0, 0.01), c) for c in range(clients)]
    heapq.heapify(sends)
    out, arm = [], 0
    while sends:
        t, c = heapq.heappop(sends)
        if t >= limit_s:
            continue
        seat_free = heapq.heappop(free[arm])
        start = max(t, seat_free)
        service = draw(rng) * (effect if arm else 1.0)
        end = start + service
        heapq.heappush(free[arm], end)
        out.append(Request(arm, end, end - t))
        heapq.heappush(sends, (end, c))
        arm = 1 - arm
    out.sort(key=lambda r: r.end)
    return out


# -- the methods ------------------------------------------------------------------------------
def _span(latencies: list[float], seconds: float) -> ArmSpan:
    """An arm's /metrics delta over its latencies: the TTFT and e2e histograms vLLM keeps."""
    cum, buckets = 0, []
    s = sorted(latencies)
    i = 0
    for le in TTFT_BOUNDS:
        while i < len(s) and s[i] <= le:
            i += 1
        cum = i
        buckets.append((le, float(cum)))
    h = Histogram(tuple(buckets), float(len(s)), sum(s))
    start = RawMetrics(0.0, {}, {}, {}, {}, None, None)
    end = RawMetrics(seconds, {}, {}, {"ttft": h, "e2e": h}, {}, None, None)
    return ArmSpan(start, end)


@dataclass
class Outcome:
    word: str  # better, worse, equivalent, inconclusive
    seconds: float  # when it was decided (the limit: not decided)


def run_current(reqs: list[Request], opts: TrialOptions) -> Outcome:
    arms: tuple[list[float], list[float]] = ([], [])
    look = opts.min_requests
    for r in reqs:
        if r.end > opts.max_duration_s:
            break
        arms[r.arm].append(r.latency)
        if min(len(arms[0]), len(arms[1])) >= look:
            v = judge(_span(arms[0], r.end), _span(arms[1], r.end), opts)
            if v.outcome in ("better", "worse"):
                return Outcome(v.outcome, r.end)
            look = next_look(min(len(arms[0]), len(arms[1])), opts)
    v = judge(_span(arms[0], 1), _span(arms[1], 1), opts, final=True)
    word = {"no difference": "equivalent", "undecided": "inconclusive"}.get(v.outcome, v.outcome)
    return Outcome(word, opts.max_duration_s)


def run_evidence(reqs: list[Request], opts: TrialOptions, method: str) -> Outcome:
    arms: tuple[list[float], list[float]] = ([], [])
    look = opts.min_requests
    half = opts.alpha / 2
    for r in reqs:
        if r.end > opts.max_duration_s:
            break
        arms[r.arm].append(r.latency)
        n = min(len(arms[0]), len(arms[1]))
        if n >= look:
            look = max(n + 1, math.ceil(n * 1.1))
            if method == "asymptotic":
                effect = evidence.quantile_ratio(arms[1], arms[0], 0.99, opts.alpha)
            else:
                if method == "histogram":
                    spans = [_span(a, 1).buckets("ttft") for a in arms]
                    est = [evidence.binned_quantile(b, 0.99, half) for b in spans]
                else:
                    est = [evidence.quantile(a, 0.99, half) for a in arms]
                effect = evidence.ratio(est[1], est[0])
            word = evidence.classify(effect, opts.margin)
            if word != evidence.INCONCLUSIVE:
                return Outcome(word, r.end)
    return Outcome(evidence.INCONCLUSIVE, opts.max_duration_s)


# -- the table --------------------------------------------------------------------------------
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=100, help="simulated trials per effect")
    ap.add_argument("--source", default="h200-ttft")
    ap.add_argument("--arrivals", choices=("open", "closed", "both"), default="both")
    ap.add_argument("--rate", type=float, default=40.0, help="requests/s, both arms (open)")
    ap.add_argument("--clients", type=int, default=6, help="closed loop: clients")
    ap.add_argument("--seats", type=int, default=4, help="closed loop: seats an arm")
    ap.add_argument("--limit", type=float, default=300.0, help="a trial's measuring, s")
    ap.add_argument("--margin", type=float, default=0.10)
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--effects", default=",".join(str(e) for e in EFFECTS))
    ap.add_argument("--seed", type=int, default=45)
    a = ap.parse_args()
    draw = {
        "h200-ttft": lambda: from_histogram("ttft"),
        "h200-e2e": lambda: from_histogram("e2e"),
        "lognormal": lambda: lognormal(),
    }.get(a.source, lambda: from_run(Path(a.source)))()
    opts = TrialOptions(goal="ttft_p99", max_duration_s=a.limit, margin=a.margin)
    methods = a.methods.split(",")
    effects = [float(e) for e in a.effects.split(",")]
    arrivals = ("open", "closed") if a.arrivals == "both" else (a.arrivals,)
    print(
        f"source {a.source}, {a.trials} trials per effect, limit {a.limit:g} s, margin "
        f"{a.margin:.0%}, alpha {opts.alpha}; open: {a.rate:g} req/s; closed: {a.clients} "
        f"clients, {a.seats} seats an arm"
    )
    for mode in arrivals:
        print(f"\n{mode} arrivals")
        print(
            f"{'effect':>7} {'method':>9} {'better':>7} {'worse':>7} {'equiv':>7} "
            f"{'inconcl':>7} {'wrong':>6} {'median s':>9} {'req/arm':>8}"
        )
        for effect in effects:
            counts = {m: dict.fromkeys(evidence.OUTCOMES, 0) for m in methods}
            times: dict[str, list[float]] = {m: [] for m in methods}
            sizes: list[int] = []
            rng = random.Random(f"{a.seed}-{mode}-{effect}")
            for _ in range(a.trials):
                if mode == "open":
                    reqs = open_arrivals(draw, effect, a.rate, a.limit, rng)
                else:
                    reqs = closed_loop(draw, effect, a.clients, a.seats, a.limit, rng)
                sizes.append(sum(1 for r in reqs if r.arm == 0 and r.end <= a.limit))
                for m in methods:
                    if m == "current":
                        out = run_current(reqs, opts)
                    else:
                        out = run_evidence(reqs, opts, m)
                    counts[m][out.word] += 1
                    if out.word != evidence.INCONCLUSIVE:
                        times[m].append(out.seconds)
            inside = abs(math.log(effect)) < math.log(1 + a.margin) - 1e-9
            for m in methods:
                c = counts[m]
                wrong = (
                    c["better"] + c["worse"] if inside else c["worse" if effect < 1 else "better"]
                )
                med = f"{statistics.median(times[m]):.0f}" if times[m] else "-"
                share = [100 * c[w] / a.trials for w in evidence.OUTCOMES]
                print(
                    f"{effect:>7g} {m:>9} "
                    + " ".join(f"{s:>6.0f}%" for s in share)
                    + f" {100 * wrong / a.trials:>5.0f}% {med:>9} {statistics.median(sizes):>8.0f}"
                )


if __name__ == "__main__":
    main()
