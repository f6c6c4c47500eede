"""Ray for a model spread over nodes: the address knob reaches vLLM as RAY_ADDRESS (never argv),
the probe answers in a real subprocess (Ray is not installed here; a port with nothing behind
it is one line, fast), and the advisor's Ray rules follow the facts it is given."""

from __future__ import annotations

import dataclasses
import importlib.util
import socket
import sys
import time
from pathlib import Path

import pytest
from ckpt import TINY_LLAMA, write_checkpoint

from quantdeck.core.errors import ConfigError
from quantdeck.core.launch import (
    DeviceFacts,
    LaunchConfig,
    RayFacts,
    advise,
    cpu_device,
    cuda_device,
    errors,
    from_yaml,
    knobs,
    probe_ray,
    to_yaml,
    validate,
    vllm_args,
    vllm_env,
    with_ray,
)
from quantdeck.core.launch.advisor import CPU_RAY_REFUSAL
from quantdeck.core.launch.ray import split_address
from quantdeck.core.models import ModelInfo, inspect_model

RAY_HERE = importlib.util.find_spec("ray") is not None


@pytest.fixture
def info(tmp_path: Path) -> ModelInfo:
    return inspect_model(write_checkpoint(tmp_path / "m", TINY_LLAMA))


def _cfg(model: str = "/m", backend: str | None = "ray", address: str | None = None, tp: int = 1):
    cfg = LaunchConfig()
    cfg.model.model = model
    cfg.parallel.distributed_executor_backend = backend  # type: ignore[assignment]
    cfg.parallel.ray_address = address
    cfg.parallel.tensor_parallel_size = tp
    return cfg


def _free_port() -> int:
    """A port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _gpus(n: int, ray: RayFacts | None) -> DeviceFacts:
    return dataclasses.replace(cuda_device(80, count=n), ray=ray)


CLUSTER = "10.0.0.1:6379"


def _cluster(gpus: float, nodes: int = 2) -> RayFacts:
    return RayFacts(True, CLUSTER, "/py", reachable=True, nodes=nodes, gpus=gpus, cpus=64.0)


# -- the knob ------------------------------------------------------------------------------------


def test_ray_address_goes_to_the_environment_not_argv() -> None:
    cfg = validate(_cfg(address=CLUSTER))
    assert vllm_env(cfg)["RAY_ADDRESS"] == CLUSTER
    args = vllm_args(cfg)
    assert "--distributed-executor-backend=ray" in args
    assert not any(CLUSTER in a or "ray-address" in a for a in args), args
    assert knobs.command_line(cfg).startswith(f"RAY_ADDRESS={CLUSTER} vllm serve ")
    assert "ray-address" not in knobs.to_dict(cfg, for_vllm=True)  # vLLM would refuse the key
    assert "RAY_ADDRESS" not in vllm_env(_cfg())  # unset: the user's own RAY_ADDRESS applies


@pytest.mark.parametrize("address", ["auto", CLUSTER, "ray://head.example:10001", "[::1]:6379"])
def test_profile_yaml_round_trips_the_address(address: str) -> None:
    cfg = validate(_cfg(address=address, tp=2))
    text = to_yaml(cfg)
    assert f"ray-address: {address}" in text.replace("'", "")
    back = from_yaml(text)
    assert back.parallel.ray_address == address
    assert back.parallel.distributed_executor_backend == "ray"
    assert to_yaml(back) == text


@pytest.mark.parametrize("address", ["bogus", "host:", "http//x:1", "ray://nohost", "h:70000", ""])
def test_a_bad_address_is_one_config_error(address: str) -> None:
    with pytest.raises(ConfigError, match=r"^parallel\.ray_address: "):
        validate(_cfg(address=address))


@pytest.mark.parametrize(
    "address, split",
    [
        ("127.0.0.1:6379", ("127.0.0.1", 6379)),
        ("ray://head:10001", ("head", 10001)),
        ("[::1]:6379", ("::1", 6379)),
        ("auto", None),
        ("head", None),
    ],
)
def test_split_address(address: str, split: tuple[str, int] | None) -> None:
    assert split_address(address) == split


# -- the probe (a real subprocess) ---------------------------------------------------------------


@pytest.mark.skipif(RAY_HERE, reason="Ray is installed in this interpreter")
def test_probe_says_ray_is_not_installed_here(info: ModelInfo) -> None:
    facts = probe_ray("")
    assert facts == RayFacts(False, "", sys.executable)
    finding = errors(advise(_cfg(), info, _gpus(1, facts)))
    assert [f.message for f in finding] == [
        f"the ray backend needs Ray, which is not installed for {sys.executable} "
        "(pip install ray, on every node)"
    ]


@pytest.mark.parametrize("form", ["127.0.0.1:{}", "ray://127.0.0.1:{}"])
def test_an_address_with_nothing_behind_it_is_one_line_fast(form: str) -> None:
    port = _free_port()
    t0 = time.monotonic()
    facts = probe_ray(form.format(port))
    assert time.monotonic() - t0 < 5
    assert not facts.reachable
    refused = f"the Ray cluster at 127.0.0.1:{port} does not answer (Connection refused)"
    assert facts.error == refused


def test_with_ray_probes_only_for_the_ray_backend() -> None:
    dev = cuda_device(80)
    assert with_ray(dev, _cfg(backend="mp")) is dev
    port = _free_port()
    probed = with_ray(dev, _cfg(address=f"127.0.0.1:{port}"))
    assert probed.ray is not None and probed.ray.address == f"127.0.0.1:{port}"
    assert dataclasses.replace(probed, ray=None) == dev


# -- the advisor ---------------------------------------------------------------------------------


def _messages(cfg: LaunchConfig, info: ModelInfo, dev: DeviceFacts, level: str) -> list[str]:
    return [f.message for f in advise(cfg, info, dev) if f.level == level]


def test_the_cluster_gpus_count_not_the_local_ones(info: ModelInfo) -> None:
    # TP 4 on a one-GPU machine is fine when the cluster has 4 GPUs ...
    assert _messages(_cfg(address=CLUSTER, tp=4), info, _gpus(1, _cluster(4)), "error") == []
    assert _messages(_cfg(address=CLUSTER, tp=4), info, _gpus(1, _cluster(4)), "warning") == []
    # ... and an error when it has fewer, whatever this machine has
    assert _messages(_cfg(address=CLUSTER, tp=4), info, _gpus(8, _cluster(2)), "error") == [
        f"tensor x pipeline parallel needs 4 GPUs; the Ray cluster at {CLUSTER} has 2"
    ]
    # ... and a warning when GPUs would idle
    assert _messages(_cfg(address=CLUSTER, tp=2), info, _gpus(1, _cluster(8)), "warning") == [
        "tensor x pipeline parallel uses 2 of the Ray cluster's 8 GPUs: the others stay idle"
    ]


def test_no_address_means_ray_on_this_machine(info: ModelInfo) -> None:
    local = RayFacts(True, "", "/py")  # installed, no cluster named: vLLM's Ray starts here
    assert _messages(_cfg(tp=2), info, _gpus(2, local), "error") == []
    assert _messages(_cfg(tp=4), info, _gpus(2, local), "error") == [
        "tensor x pipeline parallel needs 4 GPUs; 2 present"
    ]


def test_ray_on_the_cpu_backend_quotes_vllm(info: ModelInfo) -> None:
    msgs = _messages(_cfg(address=CLUSTER), info, cpu_device(), "error")
    assert len(msgs) == 1 and f"'{CPU_RAY_REFUSAL}'" in msgs[0] and "no Ray executor" in msgs[0]
    # the quote is vLLM's own: its CPU platform has no ray_device_key
    assert CPU_RAY_REFUSAL == "current platform cpu does not support ray."


def test_an_unreachable_or_missing_ray_is_an_error(info: ModelInfo) -> None:
    down = RayFacts(True, CLUSTER, "/py", error=f"the Ray cluster at {CLUSTER} does not answer (x)")
    assert _messages(_cfg(address=CLUSTER), info, _gpus(1, down), "error") == [down.error]
    missing = dataclasses.replace(down, installed=False)
    msgs = _messages(_cfg(address=CLUSTER), info, _gpus(1, missing), "error")
    assert len(msgs) == 2 and "not installed for /py" in msgs[0] and msgs[1] == down.error


def test_an_address_without_the_ray_backend_names_the_fix(info: ModelInfo) -> None:
    for backend in (None, "mp"):
        msgs = _messages(_cfg(backend=backend, address=CLUSTER), info, cuda_device(80), "error")
        assert len(msgs) == 1 and "set distributed_executor_backend to ray" in msgs[0], msgs


def test_an_unprobed_cluster_is_a_warning_only(info: ModelInfo) -> None:
    findings = advise(_cfg(address=CLUSTER, tp=4), info, cuda_device(80))
    assert errors(findings) == []
    assert any(f"Ray cluster at {CLUSTER} was not checked" in f.message for f in findings)
