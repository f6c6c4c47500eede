"""The server's state from its log: startup lines move it forward until the health check says
ready; a line read after that (the log reader lags on a busy machine) moves nothing."""

from __future__ import annotations

from pathlib import Path

from quantdeck.core.events import Event, FactEvent, StateEvent
from quantdeck.core.launch.config import LaunchConfig
from quantdeck.core.runtime import server_log as sl
from quantdeck.core.runtime.server import ServerProcess

PROFILING_LINE = "INFO 12-06 23:31:27 [gpu_worker.py:1] Memory profiling takes 0.52 seconds"
KV_LINE = "INFO 12-06 23:31:27 [kv_cache_utils.py:1] CPU KV cache size: 32,768 tokens"


def test_a_startup_line_read_after_ready_leaves_the_server_ready(tmp_path: Path) -> None:
    server = ServerProcess(LaunchConfig(), run_dir=tmp_path / "run")
    seen: list[Event] = []
    server.subscribe(seen.append)
    parser = sl.StartupLogParser()
    server._set_state(sl.STARTING)
    server._on_log_line(PROFILING_LINE, parser)  # before ready: the line moves the state
    assert server.state == sl.PROFILING
    server._set_state(sl.READY)
    server._on_log_line(PROFILING_LINE, sl.StartupLogParser())
    server._on_log_line(KV_LINE, parser)  # its facts still count
    assert server.state == sl.READY
    states = [e.state for e in seen if isinstance(e, StateEvent)]
    assert states == [sl.STARTING, sl.PROFILING, sl.READY]
    assert any(isinstance(e, FactEvent) and e.name == "kv_cache_tokens" for e in seen)
