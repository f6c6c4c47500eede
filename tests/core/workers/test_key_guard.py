"""The key guards, with no server: the engine's :class:`KeyGuard` (vLLM's ``--middleware``) as
a plain ASGI app around a stand-in app, and the router launcher's key checker.

The servers themselves, every route enumerated: tests/cli/test_key_guard_server.py."""

from __future__ import annotations

import ast
import asyncio
import importlib
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from quantdeck.core.launch import LaunchConfig, advise
from quantdeck.core.launch import command as launch_command
from quantdeck.core.launch.device import H200
from quantdeck.core.models import inspect_model
from quantdeck.core.procs import RUN_FILE, WORKERS_DIR, worker_command
from quantdeck.core.workers import engine
from quantdeck.core.workers import router as router_worker

KEY = "s3cret-KEY-42"
AUTH = {"Authorization": f"Bearer {KEY}"}


class Recorder:
    """The app behind the guard: answers 200 and notes every scope that reached it."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        self.seen.append(f"{scope['type']} {scope.get('path', '')}")
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})


def _get(guard: engine.KeyGuard, method: str, path: str, **headers: str) -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=guard)
        async with httpx.AsyncClient(transport=transport, base_url="http://guarded") as c:
            return await c.request(method, path, headers=headers)

    return asyncio.run(go())


def test_every_path_but_health_wants_the_key() -> None:
    app = Recorder()
    guard = engine.KeyGuard(app, keys=[KEY], open_paths_=engine.LIVENESS_PATHS)
    for path in (
        "/invocations",
        "/start_profile",
        "/scale_elastic_ep",
        "/metrics",
        "/v1/models",
        "/health/",
        "/healthz",
        "//health",
        "/HEALTH",
        "/nowhere",
        "/",
    ):
        for method in ("GET", "POST", "DELETE", "PUT", "HEAD"):
            r = _get(guard, method, path)
            assert r.status_code == 401, (method, path)
            if method != "HEAD":
                assert r.json() == {"error": "Unauthorized"}  # vLLM's own body
            assert r.headers["www-authenticate"] == "Bearer"
    assert app.seen == []  # nothing reached the app
    assert _get(guard, "GET", "/health").status_code == 200
    assert _get(guard, "POST", "/invocations", **AUTH).status_code == 200
    assert _get(guard, "GET", "/metrics", authorization=f"bearer {KEY}").status_code == 200
    assert app.seen == ["http /health", "http /invocations", "http /metrics"]


@pytest.mark.parametrize(
    "auth",
    [
        f"Bearer {KEY}x",
        f"Bearer {KEY[:-1]}",
        f"Basic {KEY}",
        KEY,
        "Bearer ",
        "Bearer",
        "",
        f"Token {KEY}",
        "Bearer s3cret-key-42",
    ],
)
def test_a_wrong_or_malformed_key_is_refused(auth: str) -> None:
    guard = engine.KeyGuard(Recorder(), keys=[KEY])
    assert _get(guard, "POST", "/invocations", authorization=auth).status_code == 401


def test_metrics_open_only_where_allowed(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM builds the guard with the app alone: the key and the word on /metrics come from
    the environment, as Quantdeck's server sets it from ``open_metrics``."""
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    cfg = LaunchConfig()
    for open_metrics, expected in ((True, 200), (False, 401)):
        cfg.server.open_metrics = open_metrics
        env = launch_command.base_env(cfg)
        monkeypatch.setenv(engine.OPEN_METRICS_ENV, env[launch_command.OPEN_METRICS_ENV])
        guard = engine.KeyGuard(Recorder())
        for path in ("/metrics", "/metrics/"):
            assert _get(guard, "GET", path).status_code == expected
        assert _get(guard, "GET", "/metrics-not").status_code == 401
        assert _get(guard, "GET", "/health").status_code == 200
        assert _get(guard, "GET", "/v1/models", **AUTH).status_code == 200
    monkeypatch.delenv(engine.OPEN_METRICS_ENV)
    assert engine.open_paths() == ("/health", "/tokenize", "/detokenize")  # /metrics guarded
    monkeypatch.setenv("VLLM_API_KEY", "")
    with pytest.raises(RuntimeError, match="no API key"):
        engine.KeyGuard(Recorder())


def test_root_path_cors_preflight_and_lifespan() -> None:
    app = Recorder()
    guard = engine.KeyGuard(app, keys=["other", KEY])
    # behind --root-path: the path the routes see
    scope = {"type": "http", "path": "/api/health", "root_path": "/api", "headers": []}
    assert guard.allows(scope) and not guard.allows({**scope, "path": "/api/invocations"})
    # a browser's CORS preflight carries no credentials; vLLM's CORS middleware answers it
    pre = {"origin": "https://a.example", "access-control-request-method": "POST"}
    assert _get(guard, "OPTIONS", "/v1/completions", **pre).status_code == 200
    assert _get(guard, "OPTIONS", "/v1/completions").status_code == 401
    assert _get(guard, "GET", "/v1/models", authorization="Bearer other").status_code == 200

    async def lifespan() -> None:
        await guard({"type": "lifespan"}, None, None)

    asyncio.run(lifespan())
    assert app.seen[-1] == "lifespan "


@pytest.mark.parametrize("denial", [True, False])
def test_a_websocket_without_the_key_is_refused_at_its_handshake(denial: bool) -> None:
    app = Recorder()
    guard = engine.KeyGuard(app, keys=[KEY])
    sent: list[dict[str, Any]] = []

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    scope: dict[str, Any] = {"type": "websocket", "path": "/v1/realtime", "headers": []}
    if denial:
        scope["extensions"] = {"websocket.http.response": {}}
    asyncio.run(guard(scope, None, send))
    if denial:
        assert [m["type"] for m in sent] == [
            "websocket.http.response.start",
            "websocket.http.response.body",
        ]
        assert sent[0]["status"] == 401
    else:
        assert sent == [{"type": "websocket.close", "code": 1008}]
    assert app.seen == []
    asyncio.run(
        guard({**scope, "headers": [(b"authorization", f"Bearer {KEY}".encode())]}, None, send)
    )
    assert app.seen == ["websocket /v1/realtime"]


def test_the_engine_hands_vllm_the_guard_when_a_key_is_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``--middleware MODULE.KeyGuard``, resolved as vLLM resolves it (import the module, take
    the name); no key, no guard; a key in argv is refused (vLLM would prefer it)."""
    monkeypatch.setenv("VLLM_API_KEY", "")
    assert engine.guard_args() == []
    monkeypatch.setenv("VLLM_API_KEY", KEY)
    flag, path = engine.guard_args()
    module, name = path.rsplit(".", 1)
    assert flag == "--middleware"
    assert getattr(importlib.import_module(module), name) is engine.KeyGuard
    monkeypatch.setattr(engine, "_alias_vllm_distribution", lambda: None)  # this process's
    monkeypatch.setattr(engine, "die_with_owner", lambda: None)  # importlib and group stay
    seen: list[list[str]] = []
    fake = type(sys)("vllm.entrypoints.cli.main")
    fake.main = lambda: seen.append(list(sys.argv))  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "vllm.entrypoints.cli.main", fake)
    monkeypatch.setattr(sys, "argv", ["engine"])
    engine.main(["/m", "--port=1"])
    assert seen == [["vllm", "serve", "/m", "--port=1", "--middleware", path]]
    for argv in (["/m", "--api-key", "k"], ["/m", "--api-key=k"]):
        with pytest.raises(SystemExit) as e:
            engine.main(argv)
        assert e.value.code == 2


def test_the_open_server_warning_lists_what_stays_open(tmp_path: Path) -> None:
    from ckpt import LLAMA3_8B, write_checkpoint

    llama = write_checkpoint(tmp_path / "l8b", LLAMA3_8B)
    cfg = LaunchConfig()
    cfg.model.model, cfg.server.host, cfg.server.api_key = str(llama), "0.0.0.0", KEY

    def host_finding() -> str:
        (f,) = [f for f in advise(cfg, inspect_model(llama), H200) if f.knob == "host"]
        return f.message

    assert host_finding().endswith(
        "only /health, /metrics, /tokenize and /detokenize answer without the key "
        "(--no-open-metrics guards /metrics)"
    )
    cfg.server.open_metrics = False
    assert host_finding().endswith("only /health, /tokenize and /detokenize answer without the key")
    assert "/v1 only" not in host_finding()


# -- the router's launcher ----------------------------------------------------------------------


def test_the_router_launcher_needs_no_quantdeck() -> None:
    """Standard library and vllm_router only (an engine's interpreter runs it by file), and
    the key's variable is the one the fleet sets."""
    from quantdeck.core.fleet.supervisor import ROUTER_KEY_ENV

    tree = ast.parse((WORKERS_DIR / "router.py").read_text())
    roots = {
        a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
    }
    roots |= {
        n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module
    }
    assert roots - {"vllm_router", "vllm_router_rs", "__future__"} <= sys.stdlib_module_names
    assert router_worker.KEY_ENV == ROUTER_KEY_ENV
    other = "/opt/engine/bin/python3"
    assert worker_command("router", "--port=1", python=other) == [
        other,
        "-c",
        RUN_FILE,
        str(WORKERS_DIR / "router.py"),
        "--port=1",
    ]
    r = subprocess.run(
        [sys.executable, "-c", RUN_FILE, str(WORKERS_DIR / "router.py"), "--api-key", "k"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "not --api-key" in r.stderr


@pytest.fixture
def checker() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), router_worker.checker_handler(KEY))
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()


def test_the_key_checker_answers_200_to_the_key_only(checker: str) -> None:
    """What the router asks about each new token (``api_key_validation_urls``)."""
    assert httpx.get(checker, headers=AUTH).status_code == 200
    assert httpx.get(checker, headers={"Authorization": f"bearer {KEY}"}).status_code == 200
    for auth in (f"Bearer {KEY}x", f"Basic {KEY}", "Bearer", KEY):
        assert httpx.get(checker, headers={"Authorization": auth}).status_code == 401
    assert httpx.get(checker).status_code == 401
    assert router_worker.key_matches(f"Bearer {KEY}", KEY)
    assert not router_worker.key_matches(None, KEY)


def test_a_keyed_router_is_probed_with_its_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fleet's probe of a keyed router (its /health wants the key too): with the key only
    200 counts; ``fleet status`` in another shell, without it, takes the 401 as an answer."""
    from quantdeck.core.fleet import router_keeper as supervisor  # (the probe's home)

    asked: list[dict[str, str]] = []

    def get(url: str, headers: dict[str, str], timeout: float) -> httpx.Response:
        assert url == "http://r:1/health"
        asked.append(headers)
        return httpx.Response(200 if headers == AUTH else 401)

    monkeypatch.setattr(supervisor.httpx, "get", get)
    assert supervisor.probe("http://r:1", api_key=KEY) == "ready"
    assert supervisor.probe("http://r:1") == "ready"
    assert supervisor.probe("http://r:1", api_key="wrong") == "down"
    assert asked == [AUTH, {}, {"Authorization": "Bearer wrong"}]
