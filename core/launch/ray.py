"""What a Ray cluster offers a launch that spreads one model over several nodes.

vLLM connects to the cluster with ``ray.init(address=None)`` (``initialize_ray_cluster`` in
``vllm/v1/executor/ray_utils.py``), which reads the address from ``RAY_ADDRESS``: the
``parallel.ray_address`` knob reaches the server that way. :func:`probe_ray` asks the cluster how
many nodes and GPUs it has, in a subprocess (``python -m quantdeck.core.workers.ray_probe``): Ray
is imported only there, and only in the interpreter that will run vLLM, where it has to be
installed. An address with a host and port is first tried over TCP, so that a cluster that does
not answer is one line within a couple of seconds, not Ray's own minute of retries.
"""

from __future__ import annotations

import os
import socket
import subprocess
from dataclasses import asdict, dataclass, replace
from typing import Any

from quantdeck.core.errors import ConfigError
from quantdeck.core.launch.config import LaunchConfig
from quantdeck.core.launch.device import DeviceFacts
from quantdeck.core.procs import own_python, worker_command
from quantdeck.core.schema import load_json

TCP_TIMEOUT_S = 2.0  # a host that does not answer a connect in this long is taken as down
PROBE_TIMEOUT_S = 60.0  # python start, `import ray` (~2 s) and ray.init on a live cluster


@dataclass(frozen=True)
class RayFacts:
    """What a probe found: whether Ray is installed in ``python`` (the engine's interpreter),
    and, when the cluster answered, its live nodes and total resources. ``error``: what is wrong
    with the cluster or its address (one line), else ""."""

    installed: bool
    address: str
    python: str = ""
    reachable: bool = False
    nodes: int = 0
    gpus: float = 0.0  # the cluster's total GPU resource (all nodes)
    cpus: float = 0.0
    version: str = ""  # Ray's version in the engine's interpreter
    error: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def split_address(address: str) -> tuple[str, int] | None:
    """``(host, port)`` of ``host:port``, ``ray://host:port`` or ``[v6]:port``; None for
    ``auto`` (a cluster started on this machine, found through Ray's own files) and for an
    address without a port."""
    a = address.strip()
    for scheme in ("ray://", "http://", "https://"):
        if a.lower().startswith(scheme):
            a = a[len(scheme) :]
    a = a.split("/", 1)[0]
    host, sep, port = a.rpartition(":")
    if not sep or not port.isdigit() or not host:
        return None
    return host.strip("[]"), int(port)


def check_address(address: str) -> str | None:
    """None when ``address`` is a form vLLM's ``ray.init`` takes, else the one-line problem."""
    a = address.strip()
    if a == "auto" or (a.startswith("ray://") and split_address(a) is not None):
        return None
    hp = split_address(a)
    if hp is None or "://" in a:
        return f"'{address}' is not a Ray address: use auto, HOST:PORT or ray://HOST:PORT"
    if not 0 < hp[1] < 65536:
        return f"'{address}': port {hp[1]} is out of range"
    return None


def tcp_answers(host: str, port: int, timeout: float = TCP_TIMEOUT_S) -> str | None:
    """None when something accepts a TCP connection at host:port, else why not (one line)."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except TimeoutError:
        return f"no answer within {timeout:g} s"
    except OSError as e:
        return e.strerror or type(e).__name__


def probe_ray(
    address: str, python: str | None = None, timeout: float = PROBE_TIMEOUT_S
) -> RayFacts:
    """Ask the Ray cluster at ``address`` what it has, from the interpreter ``python`` (default:
    this one) that will run vLLM. ``address`` "" checks only that Ray is installed. Never raises
    for a missing Ray, a bad address or a cluster that does not answer: those come back in the
    facts (``installed``, ``error``)."""
    py = python or own_python()
    problem = check_address(address) if address else None
    hp = split_address(address)
    down = None if problem or hp is None else tcp_answers(*hp)
    # No address (vLLM's Ray then starts an instance of its own on this machine), a bad one or
    # a cluster that does not answer: ask only whether Ray is installed.
    args = ["--installed-only"] if problem or down or not address else []
    try:
        done = subprocess.run(
            worker_command("ray_probe", *args, "--", address, python=py),
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
            errors="replace",
        )
    except subprocess.TimeoutExpired:
        return RayFacts(
            True,
            address,
            py,
            error=f"the Ray cluster at {address} did not answer within {timeout:g} s",
        )
    except OSError as e:
        return RayFacts(False, address, py, error=f"cannot run {py}: {e.strerror}")
    facts = _last_json(done.stdout)
    if facts is None:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return RayFacts(False, address, py, error=f"the Ray probe failed: {tail[:300]}")
    installed = bool(facts.get("installed"))
    version = str(facts.get("version") or "")
    if problem:
        return RayFacts(installed, address, py, version=version, error=problem)
    if down:
        assert hp is not None
        return RayFacts(
            installed,
            address,
            py,
            version=version,
            error=f"the Ray cluster at {hp[0]}:{hp[1]} does not answer ({down})",
        )
    if not installed or not address:
        return RayFacts(installed, address, py, version=version)
    if facts.get("error"):
        return RayFacts(True, address, py, version=version, error=str(facts["error"]))
    return RayFacts(
        installed=True,
        address=address,
        python=py,
        reachable=True,
        nodes=int(facts.get("nodes") or 0),
        gpus=float(facts.get("gpus") or 0.0),
        cpus=float(facts.get("cpus") or 0.0),
        version=version,
    )


def _last_json(text: str) -> dict[str, Any] | None:
    for line in reversed(text.splitlines()):
        try:
            obj = load_json(line, "the Ray probe")
        except ConfigError:
            continue
        if isinstance(obj, dict):
            return obj
    return None


def uses_ray(cfg: LaunchConfig) -> bool:
    """True when the launch asks for Ray's executor (then the cluster is worth probing)."""
    return cfg.parallel.distributed_executor_backend == "ray"


def with_ray(
    device: DeviceFacts,
    cfg: LaunchConfig,
    python: str | None = None,
    timeout: float = PROBE_TIMEOUT_S,
) -> DeviceFacts:
    """``device`` with the facts of the launch's Ray cluster, probed when the launch uses Ray.
    With no address (the knob unset, no RAY_ADDRESS here for the server to inherit), vLLM's
    ``ray.init`` starts a Ray instance on this machine: only the installation is checked.

    A GPU device that reaches its cluster counts the cluster's GPUs, each taken to be like this
    machine's (Ray reports a count, not the model or memory of each GPU): the planner then
    spreads the weights over them."""
    if not uses_ray(cfg):
        return device
    address = cfg.parallel.ray_address or os.environ.get("RAY_ADDRESS", "")
    facts = probe_ray(address, python=python, timeout=timeout)
    if device.is_cuda and facts.reachable and facts.gpus >= 1:
        return replace(device, ray=facts, count=int(facts.gpus))
    return replace(device, ray=facts)
