"""The paired probe's judgement: the Wilcoxon signed-rank test against a direct computation,
McNemar's test, and the verdicts judge_paired gives on pairs of known difference."""

from __future__ import annotations

import itertools
import math
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import pytest

from quantdeck.core.fleet.live import ProbeLoad
from quantdeck.core.fleet.trial import (
    LOOKS,
    ProbePair,
    ProbeRecord,
    TrialOptions,
    judge_paired,
    mcnemar,
    probe_figures,
    wilcoxon_signed_rank,
)


def exact_signed_rank(d: list[float]) -> tuple[float, float]:
    """Both one-sided p-values by enumerating every sign assignment (small n, no ties)."""
    d = [x for x in d if x != 0]
    ranks = {abs(x): r + 1 for r, x in enumerate(sorted(d, key=abs))}
    w = sum(ranks[abs(x)] for x in d if x > 0)
    all_w = [
        sum(r for r, s in zip(ranks.values(), signs, strict=True) if s)
        for signs in itertools.product((0, 1), repeat=len(d))
    ]
    return (
        sum(1 for x in all_w if x <= w) / len(all_w),
        sum(1 for x in all_w if x >= w) / len(all_w),
    )


@pytest.mark.parametrize("seed", range(8))
def test_wilcoxon_tracks_the_exact_distribution(seed: int) -> None:
    """The normal approximation against the exact null distribution (n = 14, no ties): the
    same answer to within a few hundredths, and the two sides summing to one."""
    rng = np.random.default_rng(seed)
    d = list(rng.normal(loc=float(rng.uniform(-0.5, 0.5)), size=14))
    lower, upper = wilcoxon_signed_rank(d)
    exact_lower, exact_upper = exact_signed_rank(d)
    assert lower == pytest.approx(exact_lower, abs=0.03)
    assert upper == pytest.approx(exact_upper, abs=0.03)
    assert lower + upper == pytest.approx(1.0)


def test_wilcoxon_by_hand_with_ties_and_zeros() -> None:
    # zeros dropped: |d| = 1, 2, 2, 3 -> ranks 1, 2.5, 2.5, 4; W+ = 2.5 + 4 = 6.5 (of 10)
    # mean 5, var 4*5*9/24 - (2^3 - 2)/48 = 7.5 - 0.125
    lower, upper = wilcoxon_signed_rank([0.0, -1.0, 2.0, -2.0, 3.0, 0.0])
    z = (6.5 - 5) / math.sqrt(7.5 - 0.125)
    assert upper == pytest.approx(0.5 * math.erfc(z / math.sqrt(2)), rel=1e-12)
    assert lower == pytest.approx(1 - upper, rel=1e-12)
    assert wilcoxon_signed_rank([]) == (1.0, 1.0)
    assert wilcoxon_signed_rank([0.0, 0.0]) == (1.0, 1.0)


def test_wilcoxon_is_honest_on_pairs_of_the_same_arm() -> None:
    ps = []
    for seed in range(1000):
        rng = np.random.default_rng(5000 + seed)
        a, b = rng.lognormal(-3, 0.5, 40), rng.lognormal(-3, 0.5, 40)
        ps.append(wilcoxon_signed_rank(list(b - a))[0])
    assert sum(p < 0.05 for p in ps) <= 70  # 50 expected
    assert sum(p < 0.05 / LOOKS for p in ps) <= 15  # 6 expected


def test_mcnemar_reads_the_discordant_pairs() -> None:
    assert mcnemar(0, 0) == 1.0
    assert mcnemar(5, 5) == pytest.approx(0.5)
    assert mcnemar(16, 4) == pytest.approx(0.5 * math.erfc((12 / math.sqrt(20)) / math.sqrt(2)))


def pairs(incumbent_ms: list[float], candidate_ms: list[float]) -> list[ProbePair]:
    """Pairs of the TTFTs given (ms), each with a 5 ms gap and 200 ms of decoding."""
    return [
        ProbePair(
            ProbeRecord(i / 1000, 0.005, i / 1000 + 0.2),
            ProbeRecord(c / 1000, 0.005, c / 1000 + 0.2),
        )
        for i, c in zip(incumbent_ms, candidate_ms, strict=True)
    ]


def test_a_clearly_faster_candidate_on_every_pair_is_better() -> None:
    rng = np.random.default_rng(1)
    base = list(rng.uniform(80, 120, 40))
    opts = TrialOptions(goal="ttft_p99", min_requests=30)
    v = judge_paired(pairs(base, [b * 0.6 for b in base]), opts)
    assert v.outcome == "better" and v.test == "Wilcoxon signed-rank (paired probe)"
    assert v.effect == pytest.approx(0.6, abs=0.01) and v.p_value is not None
    assert v.p_value < 0.05 / LOOKS and v.n_incumbent == v.n_candidate == 40
    w = judge_paired(pairs([b * 0.6 for b in base], base), opts)
    assert w.outcome == "worse"


def test_the_same_arm_twice_is_no_difference_at_the_last_look() -> None:
    rng = np.random.default_rng(2)
    a, b = list(rng.uniform(80, 120, 40)), list(rng.uniform(80, 120, 40))
    opts = TrialOptions(goal="ttft_p99", min_requests=30)
    assert judge_paired(pairs(a, b), opts).outcome == "undecided"
    assert judge_paired(pairs(a, b), opts, final=True).outcome == "no difference"


def test_failed_pairs_are_left_out_and_too_few_are_undecided() -> None:
    opts = TrialOptions(goal="ttft_p99", min_requests=30)
    ok = pairs([100.0] * 29, [50.0] * 29)
    failed = [ProbePair(ProbeRecord(error="HTTP 500"), ProbeRecord(0.05, 0.005, 0.2))] * 5
    v = judge_paired(ok + failed, opts, final=True)
    assert v.outcome == "undecided" and v.reason == "29 probe pairs measured; 30 are needed"
    assert probe_figures(ok + failed).pairs == 29 and probe_figures(ok + failed).failed == 5


def test_goodput_on_pairs_is_mcnemars() -> None:
    opts = TrialOptions(goal="goodput", slo={"ttft_p99": 100.0}, min_requests=30)
    # the candidate keeps 100 ms on all 40, the incumbent on 10 of them
    v = judge_paired(pairs([150.0] * 30 + [90.0] * 10, [80.0] * 40), opts)
    assert v.test == "McNemar (paired probe)" and v.outcome == "better"
    assert (v.incumbent, v.candidate, v.effect) == (25.0, 100.0, 75.0)


class _Arm(BaseHTTPRequestHandler):
    """An arm that streams 3 server-sent events over 60 ms and logs when each request began
    and ended (on the class: one log per arm). It checks the probe's schedule, not vLLM."""

    log: list[tuple[str, float, float]]
    name = ""

    def do_POST(self) -> None:
        t0 = time.monotonic()
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for _ in range(3):
            time.sleep(0.02)
            self.wfile.write(b'data: {"choices": [{"text": "x"}]}\n\n')
            self.wfile.flush()
        self.wfile.write(b"data: [DONE]\n\n")
        self.log.append((self.name, t0, time.monotonic()))

    def log_message(self, *args: object) -> None:
        pass


def test_the_probe_sends_to_one_arm_then_the_other_first_arm_alternating() -> None:
    """Never both arms at once (arms on shared cores or one GPU would slow each other's
    request of the pair), and the arm that goes first alternates pair by pair."""
    log: list[tuple[str, float, float]] = []
    servers = []
    for name in ("incumbent", "candidate"):
        handler = type(name, (_Arm,), {"log": log, "name": name})
        server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
    inc, cand = (f"http://127.0.0.1:{s.server_address[1]}" for s in servers)
    probe = ProbeLoad((inc, None), (cand, None), "m")
    try:
        deadline = time.monotonic() + 20
        while len(probe.pairs()) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        probe.close()
        for s in servers:
            s.shutdown()
    pairs = probe.pairs()
    assert len(pairs) >= 4 and all(p.ok for p in pairs), pairs
    assert all(p.incumbent.ttft_s >= 0.02 and p.candidate.ttft_s >= 0.02 for p in pairs)
    spans = sorted(log, key=lambda r: r[1])
    for (_, _, end), (_, start, _) in itertools.pairwise(spans):
        assert start >= end - 0.005, spans  # the next request began once the last one ended
    firsts = [spans[2 * k][0] for k in range(4)]
    assert firsts == ["incumbent", "candidate", "incumbent", "candidate"], spans
