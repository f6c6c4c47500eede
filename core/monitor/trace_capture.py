"""Profile N engine steps of a running vLLM server: the one capture ``quantdeck trace`` and the
Monitor's Profile button share.

The server must run with vLLM's torch profiler (``server.profiler``: ``--profiler-config`` with
a ``profiles/`` folder in the server's run folder, named by its ``profiler_dir`` fact). The
capture POSTs ``/start_profile`` with a trace-name prefix of its own and ``max_iterations`` N
(vLLM stops recording by itself after N steps), sends a few short completions so there are
steps to record, POSTs ``/stop_profile``, then waits for the trace files with its prefix in the
server's trace folder (vLLM before 0.28 ignores the body: its traces are named by rank
only, so the files that appeared since the start are taken, and the steps are those until
the stop) and sums up the engine's (:func:`~quantdeck.core.monitor.profile.
summarize_trace`). Blocking (HTTP, file waits): the GUI runs it in a worker.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantdeck.core.errors import ConfigError, ServerError
from quantdeck.core.monitor.profile import TraceSummary, summarize_trace

PROMPT = "The engine profiler records every operator of a step, so"
FRONTEND = ".async_llm."  # vLLM's API-process trace (Python frames only): copied, not summed


@dataclass(frozen=True)
class TraceCapture:
    """What one capture wrote: every trace file with its prefix (the engine's and the API
    process's), and the summaries of the engine's."""

    prefix: str
    files: list[Path]
    summaries: list[TraceSummary]

    @property
    def engine_files(self) -> list[Path]:
        return engine_traces(self.files)


def engine_traces(files: list[Path]) -> list[Path]:
    """The engine's trace files among ``files`` (all of them when none looks like one)."""
    return [p for p in files if FRONTEND not in p.name] or files


def _post(client: Any, url: str, path: str, body: dict[str, Any] | None = None) -> None:
    r = client.post(url + path, json=body)
    if r.status_code == 404:
        raise ServerError(
            f"{url}: no {path} endpoint: the server runs without vLLM's profiler "
            "(start it with quantdeck serve --profiler)"
        )
    if r.status_code >= 400:
        raise ServerError(f"{url}{path}: HTTP {r.status_code}: {r.text.strip()[:200]}")


def _traces(folder: Path, prefix: str, before: set[Path] | None = None) -> list[Path]:
    files = sorted(p for p in folder.glob("*") if ".pt.trace.json" in p.name)
    named = [p for p in files if p.name.startswith(prefix + "_")]
    if named or before is None:
        return named
    return [p for p in files if p not in before]  # a vLLM that names traces by rank only


def trace_files(folder: Path) -> set[Path]:
    """The trace files in ``folder`` now: what a capture that finds no file with its prefix
    (an older vLLM) tells its own from."""
    return {p for p in folder.glob("*") if ".pt.trace.json" in p.name}


def settled_traces(
    folder: Path,
    prefix: str,
    timeout: float,
    *,
    poll_s: float = 0.5,
    before: set[Path] | None = None,
) -> list[Path]:
    """The prefix's trace files (or, given ``before``, with none named so, the trace files not
    in it) once the engine's is there and no file grows any more."""
    deadline = time.monotonic() + timeout
    sizes: dict[Path, int] = {}
    while True:
        files = _traces(folder, prefix, before)
        now = {p: p.stat().st_size for p in files}
        if any(FRONTEND not in p.name for p in files) and now == sizes:
            return files
        if time.monotonic() > deadline:
            if files:
                return files
            raise ServerError(f"{folder}: no trace named {prefix}_* appeared in {timeout:g} s")
        sizes = now
        time.sleep(poll_s)


def new_prefix() -> str:
    """A trace-name prefix no other capture uses (time and process id)."""
    return f"quantdeck-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"


def capture_trace(
    url: str,
    folder: str | Path,
    *,
    steps: int = 4,
    model: str | None = None,
    requests: int = 3,
    max_tokens: int = 8,
    wait_s: float = 0.0,
    timeout_s: float = 60.0,
    api_key: str | None = None,
    model_of: Callable[[], str] | None = None,
) -> list[Path]:
    """Start the profiler for ``steps`` engine steps, send ``requests`` short completions (to
    ``model``, or the one ``model_of()`` names), stop it; the trace files it wrote in
    ``folder`` (the server's ``torch_profiler_dir``). One-line :class:`ConfigError` /
    :class:`ServerError` for what a user can fix."""
    import httpx

    from quantdeck.core.http import auth_headers, tls_verify

    if steps < 1:
        raise ConfigError(f"steps must be at least 1, not {steps}")
    url = url.rstrip("/")
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        raise ConfigError(f"{folder}: no such folder")
    prefix = new_prefix()
    before = trace_files(folder)
    with httpx.Client(headers=auth_headers(api_key), verify=tls_verify(url), timeout=120) as client:
        if requests and model is None and model_of is not None:
            model = model_of()
        try:
            _post(
                client, url, "/start_profile", {"profile_prefix": prefix, "max_iterations": steps}
            )
            try:
                for _ in range(requests):
                    r = client.post(
                        url + "/v1/completions",
                        json={"model": model, "prompt": PROMPT, "max_tokens": max_tokens},
                    )
                    if r.status_code >= 400:
                        raise ServerError(f"{url}/v1/completions: HTTP {r.status_code}")
                if wait_s:
                    time.sleep(wait_s)
            finally:
                _post(client, url, "/stop_profile")
        except httpx.HTTPError as e:
            raise ServerError(f"{url}: {e}") from None
    return settled_traces(folder, prefix, timeout_s, before=before)


def profile_server(url: str, folder: str | Path, **kw: Any) -> TraceCapture:
    """:func:`capture_trace`, then the engine's traces summed up: what the Profile button
    shows (``kw``: :func:`capture_trace`'s options)."""
    files = capture_trace(url, folder, **kw)
    prefix = files[0].name.split("_", 1)[0] if files else ""  # dp0 where vLLM names by rank
    return TraceCapture(prefix, files, [summarize_trace(p) for p in engine_traces(files)])
