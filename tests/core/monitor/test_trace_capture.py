"""The capture ``quantdeck trace`` and the Profile button share, where no server is needed: the
files it waits for, and the one-line refusals. On the real demo server it runs in
tests/cli/test_trace_server.py."""

from __future__ import annotations

import shutil
import socket
import threading
import time
from pathlib import Path

import pytest
from conftest import FIXTURES

from quantdeck.core.errors import ConfigError, ServerError
from quantdeck.core.monitor.trace_capture import (
    capture_trace,
    engine_traces,
    settled_traces,
    trace_files,
)

TRACE = FIXTURES / "vllm_cpu_demo_4_steps.pt.trace.json.gz"
PREFIX = "quantdeck-20270101-000000-1"
ENGINE = f"{PREFIX}_dp0_pp0_tp0_dcp0_ep0_rank0.123.pt.trace.json.gz"
FRONT = f"{PREFIX}_host_123.async_llm.1700000000.pt.trace.json.gz"


def test_waits_for_the_engine_trace_to_stop_growing(tmp_path: Path) -> None:
    (tmp_path / FRONT).write_bytes(b"x")
    (tmp_path / "someone-else_rank0.pt.trace.json.gz").write_bytes(b"x")

    def write_late() -> None:  # vLLM writes the engine's trace after stop_profile returns
        time.sleep(0.3)
        with (tmp_path / ENGINE).open("wb") as f:
            data = TRACE.read_bytes()
            f.write(data[:100])
            f.flush()
            time.sleep(0.2)
            f.write(data[100:])

    t = threading.Thread(target=write_late)
    t.start()
    files = settled_traces(tmp_path, PREFIX, timeout=10, poll_s=0.1)
    t.join()
    assert [p.name for p in files] == sorted([ENGINE, FRONT])
    assert (tmp_path / ENGINE).stat().st_size == TRACE.stat().st_size
    assert [p.name for p in engine_traces(files)] == [ENGINE]


def test_no_engine_trace_in_time(tmp_path: Path) -> None:
    with pytest.raises(ServerError, match=r"no trace named quantdeck-.*_\* appeared in 0.2 s"):
        settled_traces(tmp_path, PREFIX, timeout=0.2, poll_s=0.05)
    (tmp_path / FRONT).write_bytes(b"x")  # only the API process's: taken, as all there is
    files = settled_traces(tmp_path, PREFIX, timeout=0.2, poll_s=0.05)
    assert [p.name for p in files] == [FRONT] and engine_traces(files) == files


def test_a_vllm_that_names_traces_by_rank_only(tmp_path: Path) -> None:
    """vLLM 0.26 (the GPU host's) ignores the prefix in /start_profile's body: its engine
    trace is named by rank alone. The capture takes the trace files that appeared since it
    started, not an earlier capture's."""
    old = tmp_path / "dp0_pp0_tp0_dcp0_ep0_rank0.1700000000001.pt.trace.json.gz"
    old.write_bytes(b"earlier capture")
    (tmp_path / "notes.txt").write_text("not a trace")
    before = trace_files(tmp_path)
    assert before == {old}
    new = tmp_path / "dp0_pp0_tp0_dcp0_ep0_rank0.1700000000999.pt.trace.json.gz"
    shutil.copy(TRACE, new)
    files = settled_traces(tmp_path, PREFIX, timeout=5, poll_s=0.05, before=before)
    assert files == [new]
    # without ``before`` (or with files that carry the prefix) only the prefix's count
    with pytest.raises(ServerError, match="no trace named"):
        settled_traces(tmp_path, PREFIX, timeout=0.1, poll_s=0.05)
    shutil.copy(TRACE, tmp_path / ENGINE)
    assert settled_traces(tmp_path, PREFIX, timeout=5, poll_s=0.05, before=before) == [
        tmp_path / ENGINE
    ]


def test_refusals_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such folder"):
        capture_trace("http://127.0.0.1:9", tmp_path / "gone")
    with pytest.raises(ConfigError, match="at least 1"):
        capture_trace("http://127.0.0.1:9", tmp_path, steps=0)
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ServerError) as e:
        capture_trace(f"http://127.0.0.1:{port}/", tmp_path, model="m")
    assert str(e.value).startswith(f"http://127.0.0.1:{port}: ") and "\n" not in str(e.value)
    assert not list(tmp_path.iterdir())  # nothing written
    shutil.rmtree(tmp_path)
