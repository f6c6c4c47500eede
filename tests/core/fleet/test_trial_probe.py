"""The paired probe's judgement: the verdicts judge_paired gives on the probe's per-request
figures of known difference (a percentile's interval narrows with the count: no bucket holds
it back), goodput as two shares, the failed pairs left out; and the probe's schedule."""

from __future__ import annotations

import itertools
import math
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np

from quantdeck.core.fleet.live import ProbeLoad
from quantdeck.core.fleet.trial import (
    ProbePair,
    ProbeRecord,
    TrialOptions,
    judge_paired,
    probe_figures,
)


def pairs(incumbent_ms: list[float], candidate_ms: list[float]) -> list[ProbePair]:
    """Pairs of the TTFTs given (ms), each with a 5 ms gap and 200 ms of decoding."""
    return [
        ProbePair(
            ProbeRecord(i / 1000, 0.005, i / 1000 + 0.2),
            ProbeRecord(c / 1000, 0.005, c / 1000 + 0.2),
        )
        for i, c in zip(incumbent_ms, candidate_ms, strict=True)
    ]


def test_a_clearly_faster_candidate_is_better_and_its_interval_holds_the_effect() -> None:
    rng = np.random.default_rng(1)
    base = list(rng.lognormal(math.log(100), 0.3, 2000))
    opts = TrialOptions(goal="ttft_p99", min_requests=30)
    v = judge_paired(pairs(base, [b * 0.6 for b in rng.permutation(base)]), opts)
    assert v.outcome == "better", v.describe()
    assert v.effect is not None and v.lo is not None and v.hi is not None
    assert v.lo <= 0.6 <= v.hi < 0.9 and v.n_incumbent == v.n_candidate == 2000
    assert "per-request" in v.source and v.describe().startswith("TTFT p99 ")
    w = judge_paired(pairs([b * 0.6 for b in base], base), opts)
    assert w.outcome == "worse"


def test_the_same_arm_twice_is_equivalent_once_the_interval_is_narrow() -> None:
    """The same distribution on both arms: inconclusive while the p99's interval is wide,
    equivalent (no difference larger than 10 %) once it lies inside the margin."""
    rng = np.random.default_rng(2)
    opts = TrialOptions(goal="ttft_p99", min_requests=30)
    few = judge_paired(pairs(list(rng.uniform(80, 120, 40)), list(rng.uniform(80, 120, 40))), opts)
    assert few.outcome == "inconclusive" and few.needed is not None
    many = pairs(list(rng.uniform(80, 120, 20_000)), list(rng.uniform(80, 120, 20_000)))
    v = judge_paired(many, opts)
    assert v.outcome == "equivalent", v.describe()
    assert "no difference larger than 10 %" in v.describe()


def test_failed_pairs_are_left_out_and_too_few_are_inconclusive() -> None:
    opts = TrialOptions(goal="ttft_p99", min_requests=30)
    ok = pairs([100.0] * 29, [50.0] * 29)
    failed = [ProbePair(ProbeRecord(error="HTTP 500"), ProbeRecord(0.05, 0.005, 0.2))] * 5
    v = judge_paired(ok + failed, opts)
    assert v.outcome == "inconclusive"
    assert v.reason == "29 and 29 probe pairs measured; 30 an arm before the first look"
    assert probe_figures(ok + failed).pairs == 29 and probe_figures(ok + failed).failed == 5


def test_goodput_on_pairs_is_the_difference_of_two_shares() -> None:
    opts = TrialOptions(goal="goodput", slo={"ttft_p99": 100.0}, min_requests=30)
    # the candidate keeps 100 ms on all 400, the incumbent on 100 of them
    v = judge_paired(pairs([150.0] * 300 + [90.0] * 100, [80.0] * 400), opts)
    assert v.outcome == "better" and v.kind == "points"
    assert (v.incumbent, v.candidate, v.effect) == (25.0, 100.0, 75.0)
    assert v.lo is not None and v.lo > 10


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
