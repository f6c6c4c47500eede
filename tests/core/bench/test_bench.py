"""Load generator: aggregates as `vllm bench serve` computes them, against the real server."""

from __future__ import annotations

import asyncio
import json
import math
import random
import subprocess
import sys
import threading
import time

import httpx
import numpy as np
import pytest
from run_files import assert_round_trip

from quantdeck.cli.main import main as cli_main
from quantdeck.core.bench import compare, save_run
from quantdeck.core.bench.client import Bench
from quantdeck.core.bench.datasets import _Tokenizer, build_requests, tokenizer_vocab
from quantdeck.core.bench.load import LoadSpec, RequestRecord, parse_slo
from quantdeck.core.bench.results import BenchResult
from quantdeck.core.bench.stats import compute_metrics, records_from, summary_lines
from quantdeck.core.errors import ConfigError, ServerError


def _random_records(n: int, seed: int) -> list[RequestRecord]:
    rng = random.Random(seed)
    recs = []
    for i in range(n):
        ok = rng.random() > 0.15
        out = rng.choice([1, 2, 5, 17])
        itl = [rng.uniform(0.001, 0.05) for _ in range(out - 1)] if ok else []
        ttft = rng.uniform(0.01, 0.8)
        recs.append(
            RequestRecord(
                i,
                rng.randint(5, 300),
                out,
                success=ok,
                error="" if ok else "HTTP 500",
                start_time=rng.uniform(0, 3),
                ttft=ttft if ok else 0.0,
                itl=itl,
                latency=ttft + sum(itl) if ok else 0.0,
                output_tokens=out if ok else 0,
            )
        )
    return recs


@pytest.mark.slow  # imports vLLM in this process (about 20 s here)
@pytest.mark.parametrize("seed", range(5))
def test_metrics_equal_vllm_bench_serve_calculation(seed: int) -> None:
    """The same records through vLLM's own calculate_metrics give the same aggregates."""
    from vllm.benchmarks.datasets import SampleRequest
    from vllm.benchmarks.lib.endpoint_request_func import RequestFuncOutput
    from vllm.benchmarks.serve import calculate_metrics

    recs = _random_records(40, seed)
    slo = {"ttft": 400.0, "tpot": 30.0, "e2el": 900.0}
    ours = compute_metrics(recs, 3.7, slo, (50.0, 90.0, 99.0))
    outs = [
        RequestFuncOutput(
            success=r.success,
            latency=r.latency,
            output_tokens=r.output_tokens,
            ttft=r.ttft,
            itl=list(r.itl),
            prompt_len=r.prompt_len,
            start_time=r.start_time,
        )
        for r in recs
    ]
    reqs = [
        SampleRequest(prompt="x", prompt_len=r.prompt_len, expected_output_len=r.output_len)
        for r in recs
    ]
    theirs, _ = calculate_metrics(reqs, outs, 3.7, None, [50.0, 90.0, 99.0], slo)
    assert ours["completed"] == theirs.completed
    assert ours["failed"] == theirs.failed
    assert ours["total_input_tokens"] == theirs.total_input
    assert ours["total_output_tokens"] == theirs.total_output
    for key in (
        "request_throughput",
        "request_goodput",
        "output_throughput",
        "total_token_throughput",
    ):
        assert ours[key] == pytest.approx(getattr(theirs, key)), key
    for name in ("ttft", "tpot", "itl", "e2el"):
        for stat in ("mean", "median", "std"):
            assert ours[f"{stat}_{name}_ms"] == pytest.approx(
                getattr(theirs, f"{stat}_{name}_ms")
            ), (stat, name)
        for p, v in getattr(theirs, f"percentiles_{name}_ms"):
            assert ours[f"p{p:g}_{name}_ms"] == pytest.approx(v), (p, name)


def test_slo_and_load_errors() -> None:
    assert parse_slo(["ttft:500", "tpot:50"]) == {"ttft": 500.0, "tpot": 50.0}
    assert parse_slo(None, e2el=2000) == {"e2el": 2000.0}
    assert parse_slo(None) == {}
    for bad in ([], ["ttft"], ["speed:5"], ["ttft:fast"], ["ttft:0"]):
        with pytest.raises(ConfigError):
            parse_slo(bad)
    for spec in (
        LoadSpec(num_prompts=0),
        LoadSpec(concurrency=0),
        LoadSpec(request_rate=0),
        LoadSpec(burstiness=-1),
        LoadSpec(prompts_file="/nonexistent.jsonl"),
        LoadSpec(prompts_file="a", sharegpt="b"),
        LoadSpec(dataset="sharegpt"),
        LoadSpec(dataset="random", sharegpt=__file__),
    ):
        with pytest.raises(ConfigError):
            spec.check()


# -- against the real server ------------------------------------------------------------------


def _bench(server, spec: LoadSpec, **kw) -> dict:
    return Bench(server.url, server.served_name, spec, **kw).run()


@pytest.mark.server
@pytest.mark.solo  # one SSE message a token: a server starved of its core coalesces them
def test_bench_exact_lengths_and_recomputed_aggregates(demo_server, tmp_path) -> None:
    seen = []
    spec = LoadSpec(num_prompts=12, input_len=48, output_len=16, concurrency=3, seed=7)
    res = Bench(
        demo_server.url,
        demo_server.served_name,
        spec,
        slo={"ttft": 1e9, "tpot": 1e9},
        on_record=lambda rec, done, total: seen.append((done, total)),
    ).run()
    assert res.completed == 12 and res.failed == 0
    # exact prompt lengths as the server counts them, and exactly max_tokens out (ignore_eos)
    assert {r["prompt_len"] for r in res.requests} == {48}
    assert {r["output_tokens"] for r in res.requests} == {16}
    assert all(len(r["itl"]) == 15 for r in res.requests)
    # the streamed text is kept, all of it: read back through the server's tokenizer it is
    # about the 16 tokens sent (decoding then re-encoding may merge or split a few)
    with httpx.Client(base_url=demo_server.url) as c:
        for r in res.requests:
            n = c.post(
                "/tokenize",
                json={
                    "model": demo_server.served_name,
                    "prompt": r["generated_text"],
                    "add_special_tokens": False,
                },
            ).json()["count"]
            assert 8 <= n <= 32, (n, r["generated_text"])
    assert res.total_input_tokens == 12 * 48 and res.total_output_tokens == 12 * 16
    assert seen[-1] == (12, 12) and len(seen) == 12
    # the client's own CPU during the run: one thread, so never more than the run's wall time
    assert 0 < res.client_cpu_s <= res.duration
    # the first send's wall time: requests' start_time counts from it, after the prompts
    first_send = min(r["start_time"] for r in res.requests)
    assert 0 <= first_send < 0.5 and time.time() - res.duration - 5 < res.started_at
    # a loose SLO: every request is good
    assert res.good_completed == 12
    assert res.request_goodput == pytest.approx(res.request_throughput)
    # every aggregate recomputes from the saved per-request records
    path = save_run(res, "recompute", folder=tmp_path)
    saved = assert_round_trip(path)  # the file reads back, byte for byte
    assert isinstance(saved, BenchResult)
    again = compute_metrics(records_from(saved), saved.duration, saved.slo_ms.to_json())
    for key, value in again.items():
        assert saved.figure(key) == pytest.approx(value), key
    # and independently of compute_metrics: medians straight from the records
    ttfts = [r["ttft"] * 1000 for r in saved.requests]
    assert saved.median_ttft_ms == pytest.approx(float(np.median(ttfts)))
    assert saved.output_throughput == pytest.approx(12 * 16 / saved.duration)
    assert res.server_version
    assert "Successful requests:" in "\n".join(summary_lines(res))


_VLLM_RANDOM = """
import json, sys
from vllm.benchmarks.datasets import RandomDataset
from vllm.tokenizers import get_tokenizer
reqs = RandomDataset(random_seed=int(sys.argv[2])).sample(
    get_tokenizer(sys.argv[1]), int(sys.argv[3]), input_len=int(sys.argv[4]), output_len=4)
print(json.dumps([r.prompt for r in reqs]))
"""


@pytest.mark.server
def test_random_dataset_is_vllm_bench_serves(demo_server, demo_model, tmp_path) -> None:
    """Same seed, same prompts as ``vllm bench serve --dataset-name random`` (vLLM's own
    RandomDataset, run in a subprocess); the warm-ups come after them; a tokenizer folder
    without tokenizer.json is a one-line error."""
    size, allowed = tokenizer_vocab(demo_model)
    special = {
        t["id"]
        for t in json.loads((demo_model / "tokenizer.json").read_text())["added_tokens"]
        if t["special"]
    }
    assert size == 2048 and special and not special & set(allowed)
    assert len(allowed) + len(special) == size
    out = subprocess.run(
        [sys.executable, "-c", _VLLM_RANDOM, str(demo_model), "3", "6", "40"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    theirs = json.loads(out.stdout.strip().splitlines()[-1])
    spec = LoadSpec(
        num_prompts=6, input_len=40, output_len=4, concurrency=3, dataset="random", seed=3
    )
    with httpx.Client(base_url=demo_server.url, timeout=30.0) as client:
        ours = build_requests(
            spec, _Tokenizer(client, demo_server.served_name), 7, 3, (size, allowed)
        )
    assert [r.prompt for r in ours[:6]] == theirs
    assert ours[6].prompt not in theirs  # the warm-up: a prompt of its own
    res = _bench(demo_server, spec)
    assert res.completed == 6 and res.load["dataset"] == "random"
    # as the server counts them: vLLM's 39 tokens and the BOS (re-tokenizing landed on them)
    assert {r["prompt_len"] for r in res.requests} == {40}
    with pytest.raises(ConfigError, match="tokenizer.json"):
        _bench(demo_server, LoadSpec(num_prompts=1, dataset="random", tokenizer=str(tmp_path)))


@pytest.mark.server
def test_goodput_tight_slo_counts_only_good_requests(demo_server) -> None:
    spec = LoadSpec(num_prompts=8, input_len=32, output_len=8, concurrency=4)
    res = _bench(demo_server, spec, slo={"ttft": 0.01})  # 10 µs: no request makes it
    assert res.completed == 8
    assert res.good_completed == 0 and res.request_goodput == 0.0
    # a limit between the fastest and the slowest TTFT splits them
    ttfts = sorted(r["ttft"] * 1000 for r in res.requests)
    mid = (ttfts[2] + ttfts[3]) / 2
    again = compute_metrics(records_from(res), res.duration, {"ttft": mid})
    assert again["good_completed"] == 3


@pytest.mark.server
def test_poisson_rate_and_prompt_file(demo_server, tmp_path) -> None:
    f = tmp_path / "prompts.jsonl"
    f.write_text(
        "\n".join(
            json.dumps({"prompt": p, "output_len": n})
            for p, n in (("The cat sat on", 4), ("Once upon a time", 6))
        )
        + "\n"
    )
    spec = LoadSpec(num_prompts=6, prompts_file=str(f), request_rate=4.0, seed=1, warmups=0)
    res = _bench(demo_server, spec)
    assert res.completed == 6 and res.request_rate == 4.0
    outs = [r["output_tokens"] for r in res.requests]
    assert outs == [4, 6, 4, 6, 4, 6]
    starts = sorted(r["start_time"] for r in res.requests)
    assert starts[-1] > 0.3  # arrivals spread out (mean gap 0.25 s), not all at t=0


@pytest.mark.server
def test_bench_cli_errors_and_json(demo_server, tmp_path, capsys) -> None:
    out = tmp_path / "r.json"
    rc = cli_main(
        [
            "bench",
            demo_server.url,
            "--num-prompts",
            "4",
            "--input-len",
            "16",
            "--output-len",
            "4",
            "--concurrency",
            "2",
            "--json",
            str(out),
            "--quiet",
            "--slo-ttft-ms",
            "100000",
            "--label",
            "cli",
        ]
    )
    assert rc == 0
    data = json.loads(out.read_text())
    for key in (
        "completed",
        "failed",
        "duration",
        "request_throughput",
        "output_throughput",
        "total_token_throughput",
        "mean_ttft_ms",
        "median_ttft_ms",
        "p99_ttft_ms",
        "mean_tpot_ms",
        "median_tpot_ms",
        "p99_tpot_ms",
        "mean_itl_ms",
        "median_itl_ms",
        "p99_itl_ms",
        "mean_e2el_ms",
        "median_e2el_ms",
        "p99_e2el_ms",
        "request_goodput",
    ):
        assert key in data, key
    assert data["env"]["vllm_version"] == data["server_version"]
    assert_round_trip(out)  # --json FILE reads back, byte for byte
    assert data["label"] == "cli"
    capsys.readouterr()
    assert cli_main(["bench", demo_server.url, "--model", "nope", "--num-prompts", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "not served" in err and len(err.splitlines()) == 1
    assert cli_main(["bench", "http://127.0.0.1:9", "--num-prompts", "1"]) == 2
    assert "unreachable" in capsys.readouterr().err
    assert cli_main(["bench", demo_server.url, "--goodput"]) == 2
    assert "needs limits" in capsys.readouterr().err
    # two runs compare
    rc = cli_main(["runs", str(out), str(out), "--json"])
    rows = json.loads(capsys.readouterr().out)
    assert rc == 0 and all(r["ratio"] in (None, 1.0) for r in rows)


@pytest.mark.server
def test_cancel_ends_with_what_was_measured(demo_server) -> None:
    spec = LoadSpec(num_prompts=40, input_len=32, output_len=64, concurrency=2, warmups=0)
    bench = Bench(demo_server.url, demo_server.served_name, spec)
    done = []
    bench.on_record = lambda rec, n, total: (done.append(n), n >= 3 and bench.cancel())
    res = bench.run()
    assert res.ended_early == "cancelled"
    assert res.completed >= 3
    assert res.completed + res.failed == 40  # nothing dropped
    assert len(res.requests) == 40
    errors = {r["error"].split(":")[0] for r in res.requests if not r["success"]}
    assert errors <= {"not sent", "cancelled in flight"}


@pytest.mark.server
@pytest.mark.stops_session_server
def test_server_gone_mid_run(demo_server) -> None:
    """The run ends with what it measured, says so, and counts every request."""
    spec = LoadSpec(num_prompts=60, input_len=32, output_len=48, concurrency=2, warmups=0)
    bench = Bench(demo_server.url, demo_server.served_name, spec)
    started = threading.Event()
    bench.on_record = lambda rec, n, total: started.set()
    results: list[BenchResult] = []
    t = threading.Thread(target=lambda: results.append(bench.run()))
    t.start()
    try:
        assert started.wait(120)
        demo_server.stop()
        t.join(120)
        assert not t.is_alive()
        (result,) = results
        assert result.ended_early.startswith("server gone")
        assert result.completed >= 1 and result.failed >= 1
        assert result.completed + result.failed == 60
    finally:
        t.join(60)  # the next test that needs the server starts it again
    with pytest.raises(ServerError):  # a new run against a dead URL fails up front
        Bench("http://127.0.0.1:9", "m", LoadSpec(num_prompts=1)).run()


def test_compare_marks_better_and_worse() -> None:
    a = BenchResult(output_throughput=100.0, median_ttft_ms=50.0, failed=0, completed=10)
    b = BenchResult(output_throughput=120.0, median_ttft_ms=60.0, failed=0, completed=10)
    rows = {r.metric: r for r in compare(a, b)}
    assert rows["output_throughput"].b_better is True
    assert rows["median_ttft_ms"].b_better is False
    assert math.isclose(rows["output_throughput"].ratio, 1.2)
    assert rows["completed"].b_better is None


def test_sse_messages_read_like_vllm_bench() -> None:
    from quantdeck.core.bench.client import sse_message

    tok = 'data: {"id":"cmpl-1","object":"text_completion","choices":[{"index":0,"text":"a"}]}'
    usage = 'data: {"id":"cmpl-1","choices":[],"usage":{"prompt_tokens":5,"completion_tokens":3}}'
    assert sse_message(tok) == ("token", json.loads(tok[6:]))
    assert sse_message(tok.replace('"a"', '""'))[0] == "token"  # empty text still counts
    assert sse_message(usage)[1]["usage"]["completion_tokens"] == 3
    assert sse_message(usage)[0] == "usage"
    assert sse_message("data: [DONE]") == (None, {})
    assert sse_message(": ping") == (None, {})
    assert sse_message('data:{"choices": [{"index": 0, "text": "x"}]}')[0] == "token"
    err = 'data: {"error": {"object": "error", "message": "engine dead", "code": 500}}'
    assert sse_message(err)[0] == "error"
    with pytest.raises(json.JSONDecodeError):
        sse_message('data: {"choices": [')


def test_sse_stream_split_anywhere_gives_the_same_messages() -> None:
    """Network reads cut messages, and multi-byte characters, at any byte."""
    from quantdeck.core.bench.client import _sse_messages

    body = (
        'data: {"choices":[{"text":"Grüße"}]}\n\n: ping\n\n'
        'data: {"choices":[{"text":"日本"}]}\n\ndata: [DONE]'
    ).encode()

    class Content:
        def __init__(self, cuts: list[int]) -> None:
            self.parts = [body[i:j] for i, j in zip([0, *cuts], [*cuts, len(body)], strict=True)]

        async def iter_any(self):
            for part in self.parts:
                yield part

    async def read(cuts: list[int]) -> list[str]:
        resp = type("Resp", (), {"content": Content(cuts)})()
        return [m async for _, m in _sse_messages(resp)]

    whole = asyncio.run(read([]))
    assert [m.strip() for m in whole] == [
        'data: {"choices":[{"text":"Grüße"}]}',
        ": ping",
        'data: {"choices":[{"text":"日本"}]}',
        "data: [DONE]",
    ]
    for cut in range(1, len(body)):
        assert asyncio.run(read([cut])) == whole, cut
    assert asyncio.run(read(list(range(1, len(body))))) == whole  # one byte per read


def test_requests_read_in_one_piece_are_counted_and_warned_of() -> None:
    """vLLM sends one event per token as it decodes; a request whose 64 tokens the client read
    within a millisecond was read late (benchmarks/stream_chunks.py: the kernel had them spread
    over 170 ms). Counted, and the summary says what that does to TTFT and ITL."""
    from quantdeck.core.bench.load import RequestRecord

    def rec(i: int, gap: float) -> RequestRecord:
        return RequestRecord(
            i,
            16,
            64,
            success=True,
            ttft=0.2,
            itl=[gap] * 63,
            latency=0.2 + 63 * gap,
            output_tokens=64,
        )

    streamed, late = rec(0, 0.004), rec(1, 0.00001)
    assert not streamed.read_in_one_piece and late.read_in_one_piece
    short = RequestRecord(2, 16, 4, success=True, itl=[0.0] * 3, latency=0.3, output_tokens=4)
    assert not short.read_in_one_piece  # too few tokens to tell
    res = BenchResult.from_json(compute_metrics([streamed, late, short], duration=1.0))
    assert res.read_in_one_piece == 1
    text = "\n".join(summary_lines(res))
    assert "warning: 1 of 3 requests were read in one piece" in text
    one = BenchResult.from_json(compute_metrics([streamed], 1.0))
    assert "warning" not in "\n".join(summary_lines(one))
