"""Every kind of run (bench, A/B, offline tune, live tune) is its typed result from the job to
the reader, and its saved file reads back into it and writes back the same, byte for byte
(issue 44). The runs are real: a bench client against a small streaming server on 127.0.0.1,
A/B and tuning over arms that return that run (no vLLM server), a live chain over a fleet that
answers from a table."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from run_files import assert_round_trip

from quantdeck.core.bench import LiveTuner, LoadSpec, TrialOutcome, save_run, write_result
from quantdeck.core.bench.ab import ABRun, Arm
from quantdeck.core.bench.client import Bench
from quantdeck.core.bench.results import (
    ABResult,
    ArmResult,
    BenchResult,
    LiveTuneResult,
    PointFigures,
    SloMs,
    TuneResult,
)
from quantdeck.core.bench.tune import Tuner
from quantdeck.core.launch import LaunchConfig, to_dict
from quantdeck.core.payloads import Verdict

TOKEN = b'data: {"choices":[{"index":0,"text":"a"}]}\n\n'
USAGE = b'data: {"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":3}}\n\n'


class Streamer(BaseHTTPRequestHandler):
    """Serves model ``m``: every completion streams three tokens and its usage."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args: object) -> None:
        pass

    def _json(self, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        self._json({"data": [{"id": "m"}]} if self.path == "/v1/models" else {"version": "0.0"})

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        if self.path == "/tokenize":
            self._json({"count": 4, "tokens": [1, 2, 3, 4]})
            return
        body = TOKEN * 3 + USAGE + b"data: [DONE]\n\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def bench_run(tmp_path: Path) -> Iterator[BenchResult]:
    """A real run of the load: 6 requests, with latency targets (goodput) and p90 asked."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), Streamer)
    server.daemon_threads = True
    t = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    t.start()
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"p{i}"}) + "\n" for i in range(6)))
    spec = LoadSpec(num_prompts=6, prompts_file=str(prompts), concurrency=2, warmups=0)
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        yield Bench(url, "m", spec, slo={"ttft": 5000.0, "tpot": 500.0}).run()
    finally:
        server.shutdown()
        server.server_close()
        t.join(5)


def _arms(monkeypatch: pytest.MonkeyPatch, run: BenchResult) -> None:
    """Every arm serves at once and measures ``run`` (its start-up facts, plan and roofline
    as a server's would be)."""

    def run_arm(self: ABRun, arm: Arm, index: int) -> ArmResult:
        out: dict[str, Any] = {"label": arm.label, "config": to_dict(arm.config)}
        out |= {"ready_s": 1.5, "warmup": {"requests": 2}, "result": run.to_json()}
        out |= {"facts": {"quantization_kernel": "MacheteLinearKernel", "kv_cache_tokens": 4096}}
        out |= {"plan": None, "roofline": {"weights_bytes": 10**9, "roofline_tok_s": 100.0}}
        return ArmResult.from_json(out)

    monkeypatch.setattr(ABRun, "preflight", lambda self: None)
    monkeypatch.setattr(ABRun, "run_arm", run_arm)


def _cfg(**scheduler: Any) -> LaunchConfig:
    cfg = LaunchConfig()
    cfg.model.model = "/models/demo"
    for k, v in scheduler.items():
        setattr(cfg.scheduler, k, v)
    return cfg


def test_a_bench_run_is_typed_and_its_file_reads_back_byte_for_byte(
    bench_run: BenchResult, tmp_path: Path
) -> None:
    run = bench_run
    assert run.completed == 6 and run.failed == 0 and run.good_completed == 6
    assert run.slo_ms == SloMs(ttft=5000.0, tpot=500.0)
    assert run.figure("p90_ttft_ms") == run.rest["p90_ttft_ms"]  # asked beyond p50 and p99
    run.env = {"host": "h", "device": "cpu"}
    path = save_run(run, folder=tmp_path)
    again = assert_round_trip(path)
    assert isinstance(again, BenchResult) and again.name == "m" and again.path == str(path)
    assert again.requests == run.requests and again.median_ttft_ms == run.median_ttft_ms
    # --json FILE is the same file
    write_result(tmp_path / "out.json", run)
    assert (tmp_path / "out.json").read_bytes() == path.read_bytes()


def test_an_ab_run_over_rounds_is_typed_and_reads_back_byte_for_byte(
    bench_run: BenchResult, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _arms(monkeypatch, bench_run)
    arms = [Arm("a", _cfg(max_num_seqs=2)), Arm("b", _cfg(max_num_seqs=8))]
    run = ABRun(arms, LoadSpec(num_prompts=6), slo={"ttft": 5000.0}, rounds=2).run()
    assert isinstance(run, ABResult) and [a.label for a in run.arms] == ["a#1", "b#1", "b#2", "a#2"]
    arm = run.arms[0]
    assert arm.result == BenchResult.from_json(bench_run.to_json())
    assert arm.kernel == "MacheteLinearKernel" and arm.roofline is not None
    tpot = bench_run.median_tpot_ms  # 0 where the tokens came at once: no decode rate
    fraction = 1000 / tpot / 100.0 if tpot else None
    assert arm.roofline.fraction_of_roofline == (pytest.approx(fraction) if tpot else None)
    assert run.summary is not None and run.summary["a"].rounds == 2
    spread = run.summary["a"].output_throughput
    assert spread is not None and spread.median == bench_run.output_throughput
    path = save_run(run, folder=tmp_path)
    again = assert_round_trip(path)
    assert isinstance(again, ABResult) and again.label == "run" and again.arms == run.arms


def test_a_tune_run_is_typed_and_reads_back_byte_for_byte(
    bench_run: BenchResult, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _arms(monkeypatch, bench_run)
    events: list[Any] = []
    tuner = Tuner(
        _cfg(max_num_seqs=4),
        LoadSpec(num_prompts=6),
        ttft_ms=5000,
        tpot_ms=500,
        space={"max_num_seqs": [2, 4, 8]},
        on_event=events.append,
    )
    run = tuner.run()
    assert isinstance(run, TuneResult) and run.best is not None
    assert run.best == PointFigures.from_json(run.best.to_json())
    assert run.best.goodput == bench_run.request_goodput and run.best.meets
    assert [p.values for p in run.points][0] == {"max_num_seqs": 4}
    path = save_run(run, "tuned", folder=tmp_path)
    again = assert_round_trip(path)
    assert isinstance(again, TuneResult) and again.points == run.points


def test_a_live_tune_chain_is_typed_and_reads_back_byte_for_byte(tmp_path: Path) -> None:
    running = [_cfg(max_num_seqs=1)]

    def trial(cfg: LaunchConfig) -> TrialOutcome:
        if cfg.scheduler.max_num_seqs == 8:
            running[0] = cfg.copy()
            return TrialOutcome("promoted", "ttft_p99: better", "promote", Verdict("better"))
        return TrialOutcome("rolled back", "worse: ttft_p99", "rollback", Verdict("worse"))

    run = LiveTuner({"max_num_seqs": [1, 8, 16]}).run(lambda: running[0].copy(), trial)
    assert isinstance(run, LiveTuneResult) and not run.failed
    assert [(t.step, t.result, t.ran) for t in run.trials] == [
        (1, "promoted", True),
        (2, "rolled back", True),
    ]
    assert run.best == {"max_num_seqs": 8} and run.changed == {"max_num_seqs": [1, 8]}
    path = save_run(run, "live", folder=tmp_path)
    again = assert_round_trip(path)
    assert isinstance(again, LiveTuneResult) and again.trials == run.trials


def test_a_file_of_unknown_keys_and_key_order_reads_back_as_it_was(tmp_path: Path) -> None:
    """Keys no reader names, and an order no writer uses, are kept as they were."""
    data = {
        "label": "x",
        "p75_itl_ms": 3.0,
        "completed": 2,
        "someone_elses": {"a": [1, 2]},
        "failed": 0,
        "slo_ms": {"e2el": 900.0},
        "requests": [],
    }
    path = tmp_path / "x.json"
    write_result(path, BenchResult.from_json(data))
    assert json.loads(path.read_text()) == data
    run = assert_round_trip(path)
    assert isinstance(run, BenchResult) and run.rest["someone_elses"] == {"a": [1, 2]}
    assert run.slo_ms == SloMs(e2el=900.0)
    # a run written without a label (bench --json FILE --no-save) is named by its file
    del data["label"]
    write_result(path, BenchResult.from_json(data))
    run = assert_round_trip(path)
    assert run.label is None and run.name == "x"
