"""``quantdeck trace URL --steps N --out DIR``: profile N engine steps of a running server.

The server must run with vLLM's torch profiler (``quantdeck serve --profiler``, which passes
``--profiler-config`` with a ``profiles/`` folder in the server's run folder). The command
POSTs ``/start_profile`` with a trace-name prefix of its own and ``max_iterations`` N (vLLM
stops recording by itself after N steps), sends a few short completions so there are steps to
record, POSTs ``/stop_profile``, then takes the trace files with its prefix from the server's
trace folder: ``--trace-dir``, or, for a server ``quantdeck serve`` started on this machine,
the folder its lease names (the run folder of the live server on the URL's port). The files
are copied into DIR (a new folder, or one Quantdeck made) with ``summary.json``; the summary
of the engine's trace is printed (``--json``: as JSON).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from functools import partial
from pathlib import Path
from urllib.parse import urlsplit

from quantdeck.cli._common import AddCommand, add_client_options, client_from, print_json
from quantdeck.core.errors import ConfigError

OUTPUT_KIND = "trace"


def _key(ns: argparse.Namespace) -> str | None:
    return ns.api_key or os.environ.get(ns.api_key_env) or None


def server_trace_dir(url: str) -> Path:
    """The profiler folder of the live vLLM server Quantdeck started on this machine on the
    URL's port (its lease names its run folder); one line when there is none."""
    from quantdeck.core.http import is_loopback
    from quantdeck.core.procs import lease_pids, read_leases
    from quantdeck.core.runtime.server import PROFILES_DIR

    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    if not is_loopback(parts.hostname or ""):
        raise ConfigError(f"{url}: not on this machine; give the server's --trace-dir")
    for lease in read_leases():
        if lease.kind == "vLLM server" and lease.port == port and lease.cwd and lease_pids(lease):
            folder = Path(lease.cwd) / PROFILES_DIR
            if folder.is_dir():
                return folder
            raise ConfigError(
                f"{url}: the server was started without --profiler (no {folder}); restart it so"
            )
    raise ConfigError(
        f"{url}: no server Quantdeck started on port {port} here; give its --trace-dir"
    )


def capture(ns: argparse.Namespace) -> list[Path]:
    """Start the profiler, run the requests, stop it; the trace files it wrote (the core's
    :func:`~quantdeck.core.monitor.trace_capture.capture_trace`, as the Profile button runs
    it)."""
    from quantdeck.cli._common import served_model
    from quantdeck.core.monitor.trace_capture import capture_trace

    url = ns.url.rstrip("/")
    folder = Path(ns.trace_dir).expanduser() if ns.trace_dir else server_trace_dir(url)
    key = _key(ns)
    return capture_trace(
        url,
        folder,
        steps=ns.steps,
        model=ns.model,
        requests=ns.requests,
        max_tokens=ns.max_tokens,
        wait_s=ns.wait,
        timeout_s=ns.timeout,
        api_key=key,
        model_of=lambda: served_model(url, key, ns.model),
    )


def cmd_trace(ns: argparse.Namespace) -> int:
    from quantdeck.core.monitor.profile import format_summary, summarize_trace
    from quantdeck.core.monitor.trace_capture import engine_traces
    from quantdeck.core.paths import atomic_dir, check_output_dir, write_json

    client_from(ns)
    out = Path(ns.out)
    check_output_dir(out.expanduser().absolute(), OUTPUT_KIND)  # refuse before profiling
    files = capture(ns)
    engine = engine_traces(files)
    summaries = [summarize_trace(p) for p in engine]
    with atomic_dir(out, OUTPUT_KIND) as tmp:
        for p in files:
            shutil.copy2(p, tmp / p.name)
        data = [
            {**s.to_json(), "path": str(out.expanduser().absolute() / Path(s.path).name)}
            for s in summaries
        ]
        write_json(
            tmp / "summary.json",
            {"url": ns.url, "steps": ns.steps, "traces": data},
            private=False,
        )
    if ns.json:
        print_json({"out": str(out), "traces": data})
        return 0
    for s, d in zip(summaries, data, strict=True):
        print(format_summary(s).replace(s.path, d["path"], 1))
    print(f"open in https://ui.perfetto.dev or chrome://tracing: {out}", file=sys.stderr)
    return 0


def _at_least(least: int, text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if n < least:
        raise argparse.ArgumentTypeError(f"must be at least {least}")
    return n


_positive = partial(_at_least, 1)


def register(add: AddCommand) -> None:
    p = add(
        "trace",
        cmd_trace,
        "profile N engine steps of a running server (vLLM's torch profiler): top operators, "
        "host vs device time, the Chrome/Perfetto trace files",
    )
    p.add_argument("url", help="the server, e.g. http://127.0.0.1:8000")
    p.add_argument("--steps", type=_positive, default=4, help="engine steps to record (4)")
    p.add_argument("--out", required=True, metavar="DIR", help="new folder for the traces")
    p.add_argument(
        "--trace-dir",
        metavar="DIR",
        help="the server's torch_profiler_dir (default: the profiles/ folder of the server "
        "quantdeck serve --profiler started here on the URL's port)",
    )
    p.add_argument(
        "--requests",
        type=partial(_at_least, 0),
        default=3,
        metavar="K",
        help="short completions to send while recording (3; 0: only the server's own traffic)",
    )
    p.add_argument("--max-tokens", type=_positive, default=8, help="tokens per completion (8)")
    p.add_argument("--model", help="the model to send them to (default: the one served)")
    p.add_argument(
        "--wait", type=float, default=0.0, metavar="S", help="seconds to record after them"
    )
    p.add_argument(
        "--timeout", type=float, default=60.0, metavar="S", help="wait for the trace file (60)"
    )
    p.add_argument(
        "--api-key-env",
        default="VLLM_API_KEY",
        metavar="NAME",
        help="environment variable holding the API key (VLLM_API_KEY)",
    )
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    add_client_options(p)
