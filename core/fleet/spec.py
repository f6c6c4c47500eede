"""The fleet file: several vLLM instances behind vLLM's router, and its checks.

A fleet file is YAML::

    router: {port: 8080, policy: round_robin, retries: 3, api_key: env:FLEET_KEY}
    instances:
      - {name: a, profile: a.yaml, port: 8001, gpus: [0]}
      - {name: b, profile: {model: /models/m, max-num-seqs: 8}, port: 8002, gpus: [0]}
      - {name: far, url: "http://10.0.0.5:8000"}

:func:`load_fleet` reads it (size-bounded, every key known, types and ranges checked);
:func:`check_fleet` refuses, before anything starts, what cannot run: two listeners on one
port, GPUs shared beyond their memory, an advisor error, an unreachable remote instance. Each
refusal is one :class:`ConfigError` line naming the instance.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import yaml

from quantdeck.core.engines import resolve_engine
from quantdeck.core.errors import ConfigError, QuantdeckError
from quantdeck.core.http import is_loopback
from quantdeck.core.launch import (
    DeviceFacts,
    GiB,
    LaunchConfig,
    advise,
    cpu_device,
    detect_device,
    errors,
    local_vllm_version,
    plan,
    validate,
    with_cpu_default_kv,
)
from quantdeck.core.launch.knobs import from_dict, to_dict
from quantdeck.core.launch.profiles import load_file, remembered_key
from quantdeck.core.models import inspect_model
from quantdeck.core.paths import write_atomic
from quantdeck.core.runtime import AttachedServer, EngineEnv
from quantdeck.core.runtime.server import base_url, free_port, url_host
from quantdeck.core.schema import MAX_YAML_VALUES, Fields, load_yaml, read_bounded, shown

MAX_BYTES = 2**20  # a fleet file is a few hundred bytes
MAX_INSTANCES = 64
MAX_VALUES = MAX_YAML_VALUES  # values in a fleet file, its YAML aliases expanded
POLICIES = (
    "random",
    "round_robin",
    "cache_aware",
    "kv_aware",
    "power_of_two",
    "consistent_hash",
    "sticky_least_loaded",
)
ROLES = ("primary", "backup")
RESTARTS = ("no", "on-failure")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")
_CPUS = re.compile(r"\d{1,5}(-\d{1,5})?(,\d{1,5}(-\d{1,5})?)*")  # VLLM_CPU_OMP_THREADS_BIND's
MAX_CPUS = 4096  # CPU numbers are under this (Linux's largest NR_CPUS is 8192; x86-64's 4096)
CPU_BIND_ENV = "VLLM_CPU_OMP_THREADS_BIND"  # vLLM's CPU engine: the cores its threads use
# router key: (flag of vllm-router, lower bound); None as a value leaves the router's default
_ROUTER_INTS = {
    "retries": ("--retry-max-retries", 0),
    "request_timeout_s": ("--request-timeout-secs", 1),
}
_CB_INTS = {
    "failure_threshold": ("--cb-failure-threshold", 1),
    "success_threshold": ("--cb-success-threshold", 1),
    "timeout_s": ("--cb-timeout-duration-secs", 1),
    "window_s": ("--cb-window-duration-secs", 1),
}
_HEALTH_INTS = {
    "failure_threshold": ("--health-failure-threshold", 1),
    "success_threshold": ("--health-success-threshold", 1),
    "timeout_s": ("--health-check-timeout-secs", 1),
    "interval_s": ("--health-check-interval-secs", 1),
}
_ROUTER_KEYS = {
    "allow_open",
    "host",
    "port",
    "metrics_port",
    "policy",
    "api_key",
    "circuit_breaker",
    "health_check",
}
# what the fallback rule may watch: the primaries' windowed quantiles, as the Monitor shows them
FALLBACK_METRICS = ("ttft_p99_ms", "ttft_p90_ms", "itl_p99_ms", "e2e_p99_ms", "queue_p99_ms")
_FALLBACK_KEYS = {"metric", "above_ms", "for_s", "recover_s", "window_s"}
_INSTANCE_KEYS = {
    "name",
    "profile",
    "url",
    "port",
    "gpus",
    "cpus",
    "role",
    "restart",
    "api_key",
    "engine",
}


@dataclass
class RouterSpec:
    """vLLM's router in front of the fleet: where it listens and how it routes."""

    host: str = "127.0.0.1"
    port: int = 8080
    metrics_port: int | None = None  # its Prometheus port on loopback (None: a free one)
    policy: str = "round_robin"
    flags: list[str] = field(default_factory=list)  # retries, circuit breaker, health checks
    api_key: str | None = field(default=None, repr=False)  # from env or keyring, never shown

    @property
    def url(self) -> str:
        return f"http://{url_host(self.host)}:{self.port}"


@dataclass
class InstanceSpec:
    """One instance: a launch profile Quantdeck starts, or a server at ``url`` it attaches."""

    name: str
    cfg: LaunchConfig | None = None
    url_: str | None = None
    gpus: list[int] | None = None
    cpus: str | None = None
    role: str = "primary"
    restart: str = "no"
    api_key: str | None = field(default=None, repr=False)
    engine: str | None = None  # the interpreter that serves it (None: Quantdeck's own)
    profile_file: Path | None = None  # where its profile was read (None: inline, or a url)

    @property
    def url(self) -> str:
        if self.cfg is not None:
            return base_url(self.cfg)
        assert self.url_ is not None  # an instance has a profile or a url (load_fleet)
        return self.url_.rstrip("/")

    def env(self) -> dict[str, str]:
        """The placement as the engine reads it: GPUs, or the CPU cores its threads bind to."""
        env = {}
        if self.gpus is not None:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, self.gpus))
        if self.cpus is not None:
            env[CPU_BIND_ENV] = self.cpus
        return env


@dataclass(frozen=True)
class FallbackRule:
    """Route to the backups while the primaries are slow: when the worst primary's
    ``metric`` (over the last ``window_s``) stays above ``above_ms`` for ``for_s`` seconds, the
    backups join the router; once it has stayed at or under for ``recover_s``, they leave."""

    metric: str = "ttft_p99_ms"
    above_ms: float = 1000.0
    for_s: float = 5.0
    recover_s: float = 30.0
    window_s: float = 10.0


@dataclass
class FleetSpec:
    path: Path
    router: RouterSpec
    instances: list[InstanceSpec]
    fallback: FallbackRule | None = None

    @property
    def local(self) -> list[InstanceSpec]:
        """The instances Quantdeck starts."""
        return [i for i in self.instances if i.cfg is not None]


# -- reading -----------------------------------------------------------------------------------
def load_fleet(path: str | os.PathLike[str]) -> FleetSpec:
    """Read a fleet file; any damage is one ConfigError line naming the file and the key."""
    p = Path(path)
    where = str(p)
    top = Fields(read_yaml(p), where)
    _known(top, {"router", "instances", "fallback"})
    items = top.items("instances", max_len=MAX_INSTANCES, required=True) or []
    instances = [_instance(Fields(x, f"{where}: instance {n + 1}"), p) for n, x in enumerate(items)]
    if not instances:
        top.fail("'instances' is empty: a fleet needs at least one")
    names = [i.name for i in instances]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup is not None:
        top.fail(f"two instances are named '{dup}'")
    router = _router(top.sub("router") or Fields({}, f"{where}: 'router'"))
    rule = top.sub("fallback")
    fallback = _fallback(rule) if rule is not None else None
    if fallback is not None and not any(i.role == "backup" for i in instances):
        top.fail("'fallback' needs an instance with role: backup")
    return FleetSpec(p, router, instances, fallback)


def _fallback(f: Fields) -> FallbackRule:
    _known(f, _FALLBACK_KEYS)
    metric = f.text("metric", max_len=40) or FallbackRule.metric
    if metric not in FALLBACK_METRICS:
        f.fail(f"'metric' must be one of {', '.join(FALLBACK_METRICS)}, got {shown(metric)}")
    return FallbackRule(
        metric=metric,
        above_ms=_seconds(f, "above_ms", FallbackRule.above_ms, 1e-3, 1e7),
        for_s=_seconds(f, "for_s", FallbackRule.for_s, 0, 86400),
        recover_s=_seconds(f, "recover_s", FallbackRule.recover_s, 0, 86400),
        window_s=_seconds(f, "window_s", FallbackRule.window_s, 1, 3600),
    )


def _seconds(f: Fields, key: str, default: float, lo: float, hi: float) -> float:
    value = f.number(key, lo=lo, hi=hi)
    return default if value is None else float(value)


def read_yaml(p: Path) -> Any:
    """The fleet file's YAML, size-bounded; ConfigError (one line) when it is not YAML, its
    aliases expand too far, or it gives a key twice (the schema's strict loader, as every YAML
    file Quantdeck reads: quantdeck.core.schema.load_yaml)."""
    return load_yaml(read_bounded(p, MAX_BYTES, "fleet"), str(p), "fleet file")


def _known(f: Fields, keys: set[str]) -> None:
    unknown = sorted(str(k) for k in f.data if str(k) not in keys)
    if unknown:
        f.fail(f"unknown key {shown(unknown[0])} (known: {', '.join(sorted(keys))})")


def _secret(f: Fields, key: str) -> str | None:
    """A key named by where it is kept (``env:VAR`` or ``keyring:PROFILE``): a key written in
    the file would be shown and copied with it. The value is never part of an error."""
    ref = f.data.get(key)
    if ref is None:
        return None
    kind, _, name = ref.partition(":") if isinstance(ref, str) else ("", "", "")
    if kind == "env" and name:
        if not os.environ.get(name):
            f.fail(f"'{key}': the environment variable {name} is not set")
        return os.environ[name]
    if kind == "keyring" and name:
        value = remembered_key(name)
        if value is None:
            f.fail(f"'{key}': no key for profile '{name}' in the keyring")
        return value
    f.fail(
        f"'{key}' must be env:VARIABLE or keyring:PROFILE (a key written in the file is refused)"
    )


def _flags(f: Fields | None, table: dict[str, tuple[str, int]]) -> list[str]:
    """The router's flags for the integer settings of ``table`` that ``f`` gives."""
    if f is None:
        return []
    out = []
    for key, (flag, lo) in table.items():
        value = f.integer(key, lo=lo, hi=10**6)
        if value is not None:
            out.append(f"{flag}={value}")
    return out


def _router(f: Fields) -> RouterSpec:
    _known(f, _ROUTER_KEYS | set(_ROUTER_INTS))
    policy = f.text("policy", max_len=40) or "round_robin"
    if policy not in POLICIES:
        f.fail(f"'policy' must be one of {', '.join(POLICIES)}, got {shown(policy)}")
    flags = _flags(f, _ROUTER_INTS)
    for key, table in (("circuit_breaker", _CB_INTS), ("health_check", _HEALTH_INTS)):
        sub = f.sub(key)
        if sub is not None:
            _known(sub, set(table))
            flags += _flags(sub, table)
    host = f.text("host", max_len=255) or "127.0.0.1"
    api_key = _secret(f, "api_key")
    if not is_loopback(host) and not api_key and f.boolean("allow_open") is not True:
        f.fail(
            f"'host' {shown(host)} opens the router to the network without an api_key: anyone "
            "who reaches it may use it, with its workers' key, and add or remove its workers "
            "(/add_worker); set api_key (every route of the router then wants it, /health "
            "included), keep it on loopback, or put your own gateway in front and set "
            "allow_open: true"
        )
    return RouterSpec(
        host=host,
        port=f.integer("port", lo=1, hi=65535) or 8080,
        metrics_port=f.integer("metrics_port", lo=1, hi=65535),
        policy=policy,
        flags=flags,
        api_key=api_key,
    )


def _instance(f: Fields, fleet_file: Path) -> InstanceSpec:
    _known(f, _INSTANCE_KEYS)
    name = f.text("name", max_len=63, required=True) or ""
    if not _NAME.fullmatch(name) or name == "router":
        f.fail(f"'name' {shown(name)}: letters, digits, '.', '_' or '-' (and not 'router')")
    f.where = f"{fleet_file}: instance '{name}'"
    role = f.text("role", max_len=20) or "primary"
    restart = "no" if f.data.get("restart") is False else f.text("restart", max_len=20) or "no"
    if role not in ROLES or restart not in RESTARTS:
        f.fail("'role' must be primary or backup, 'restart' no or on-failure")
    spec = InstanceSpec(name, role=role, restart=restart, api_key=_secret(f, "api_key"))
    url, profile = f.data.get("url"), f.data.get("profile")
    if (url is None) == (profile is None):
        f.fail("give either 'profile' (an instance to start) or 'url' (one running elsewhere)")
    if url is not None:
        url = f.text("url", max_len=2048) or ""
        if not re.fullmatch(r"https?://[^\s/]+(/\S*)?", url):
            f.fail(f"'url' must be an http(s) URL, got {shown(url)}")
        for key in ("port", "gpus", "cpus", "restart", "engine"):
            if key in f.data:
                f.fail(f"'{key}' is for an instance Quantdeck starts, not one at a url")
        spec.url_ = url
        return spec
    spec.cfg, spec.profile_file = _profile(f, fleet_file)
    port = f.integer("port", lo=1, hi=65535)
    if port is not None:
        spec.cfg.server.port = port
    if spec.api_key is not None:
        spec.cfg.server.api_key = spec.api_key
    gpus = f.items("gpus", max_len=64)
    if gpus is not None:
        if not gpus or not all(type(g) is int and 0 <= g < 1024 for g in gpus):
            f.fail(f"'gpus' must be a list of GPU numbers, got {shown(gpus)}")
        if len(set(gpus)) != len(gpus):
            f.fail(f"'gpus' names a GPU twice: {shown(gpus)}")
        spec.gpus = gpus
    if f.data.get("cpus") is not None:
        spec.cpus = _cpus(f)
    if spec.gpus is not None and spec.cpus is not None:
        f.fail("give 'gpus' or 'cpus', not both")
    engine = f.text("engine", max_len=4096)
    if engine is not None:
        try:  # a registered engine's name, or an interpreter (quantdeck engines)
            spec.engine = resolve_engine(engine)
        except ConfigError as e:
            f.fail(f"'engine': {e}")
    return spec


def _cpus(f: Fields) -> str:
    """The instance's ``cpus`` as VLLM_CPU_OMP_THREADS_BIND reads them (``0-3,8``), from that
    text or a list (``[0, 1, "4-7"]``); each range low to high, each CPU once. Whether this
    machine has them is :func:`check_fleet`'s to say."""
    cpus = f.data["cpus"]
    bad = f"'cpus' must be CPU numbers like 0-3,8 or [0, 1], got {shown(cpus)}"
    if isinstance(cpus, list):
        if len(cpus) > MAX_CPUS or not all(type(c) in (int, str) for c in cpus):
            f.fail(bad)
        text = ",".join(map(str, cpus))
    elif type(cpus) in (int, str):
        text = str(cpus)
    else:
        f.fail(bad)
    if len(text) > 10 * MAX_CPUS or not _CPUS.fullmatch(text):
        f.fail(bad)
    seen: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        first, last = int(lo), int(hi or lo)
        if first > last:
            f.fail(f"'cpus' range {part} runs backwards (write {last}-{first})")
        if last >= MAX_CPUS:
            f.fail(f"'cpus' {part}: CPU numbers go from 0 to {MAX_CPUS - 1}")
        twice = seen.intersection(range(first, last + 1))
        if twice:
            f.fail(f"'cpus' names CPU {min(twice)} twice")
        seen.update(range(first, last + 1))
    return text


def cpu_numbers(cpus: str) -> list[int]:
    """The CPUs of a checked ``cpus`` text (``0-2,8`` -> 0, 1, 2, 8)."""
    out: list[int] = []
    for part in cpus.split(","):
        lo, _, hi = part.partition("-")
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out


def machine_cpus() -> set[int]:
    """The CPUs this process may run on (its affinity; else every CPU the machine counts)."""
    if hasattr(os, "sched_getaffinity"):
        return set(os.sched_getaffinity(0))
    return set(range(os.cpu_count() or 1))


def spare_cpus(pid: int | None, have: set[int] | None = None) -> str | None:
    """The CPUs of ``have`` (this machine's) that no process under ``pid`` is bound to, as
    ``VLLM_CPU_OMP_THREADS_BIND`` reads them: vLLM's CPU engine binds its worker's threads to
    cores of its own choosing ("auto": the first of them), the same for every server started
    alike, so a trial's candidate beside a busy incumbent got the incumbent's core and waited
    there (a start of over 10 minutes here, the incumbent's worker taking the core). None
    where nothing under ``pid`` is bound (a GPU engine) or no core is spare."""
    have = machine_cpus() if have is None else have
    try:
        procs = psutil.Process(pid).children(recursive=True) if pid else []
    except psutil.Error:
        return None
    bound: set[int] = set()
    for proc in procs:
        try:
            cores = set(proc.cpu_affinity())
        except (psutil.Error, AttributeError):
            continue
        if cores and cores < have:  # bound to some cores, not free to run anywhere
            bound |= cores
    spare = have - bound
    return _ranges(spare) if bound and spare else None


def _ranges(numbers: set[int]) -> str:
    """``{0, 1, 2, 5}`` as ``0-2,5``."""
    out: list[str] = []
    for n in sorted(numbers):
        if out and n - 1 in numbers:
            out[-1] = f"{out[-1].split('-')[0]}-{n}"
        else:
            out.append(str(n))
    return ",".join(out)


def _profile(f: Fields, fleet_file: Path) -> tuple[LaunchConfig, Path | None]:
    """The instance's launch settings: a profile file (relative to the fleet file; its path
    returned too) or inline."""
    value = f.data["profile"]
    if isinstance(value, dict):
        where = f"{f.where}: 'profile'"
        return _valid(from_dict(value, where=where), where), None
    path = f.text("profile", max_len=4096) or ""
    p = Path(path).expanduser()
    p = p if p.is_absolute() else fleet_file.parent / p
    if not p.exists():
        f.fail(f"'profile': no such file {p}")
    return _valid(load_file(p), f"{f.where}: 'profile' {p}"), p


def _valid(cfg: LaunchConfig, where: str) -> LaunchConfig:
    """``cfg`` validated, a refusal naming the instance and its profile."""
    try:
        return validate(cfg)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None


# -- checks before anything starts ------------------------------------------------------------
def check_fleet(
    spec: FleetSpec, *, device: DeviceFacts | None = None, url_timeout: float = 3.0
) -> list[str]:
    """Refuse, with one ConfigError line, a fleet that cannot run as written: two listeners on
    a port, an advisor error, GPUs shared beyond their memory, a remote instance unreachable.
    ``device``: the GPUs to plan for (default: this machine's). Returns the warnings about a
    fleet that runs but slower than it could (:func:`cpu_sharing`), one line each."""
    _check_ports(spec)
    _check_cpus(spec)
    gpu = cpu = None
    if any(i.gpus is not None for i in spec.local):
        gpu = device or detect_device()
        if not gpu.is_cuda:
            raise ConfigError(f"{spec.path}: instances name GPUs, but no NVIDIA GPU is here")
    if any(i.gpus is None for i in spec.local):
        cpu = cpu_device()
    shares: dict[int, list[tuple[str, int]]] = defaultdict(list)
    for inst in spec.local:
        used = _advise(inst, gpu if inst.gpus is not None else cpu)
        for g in inst.gpus or []:
            shares[g].append((inst.name, used))
    if gpu is not None:
        _check_gpus(spec, gpu, shares)
    for inst in spec.instances:
        if inst.url_ is not None:
            try:
                AttachedServer(inst.url, api_key=inst.api_key).check(timeout=url_timeout)
            except QuantdeckError as e:
                raise ConfigError(f"{spec.path}: instance '{inst.name}': {e}") from None
    return cpu_sharing(spec)


def _check_ports(spec: FleetSpec) -> None:
    taken = {spec.router.port: "the router"}
    if spec.router.metrics_port is not None:
        if spec.router.metrics_port in taken:
            raise ConfigError(f"{spec.path}: the router's port and metrics_port are alike")
        taken[spec.router.metrics_port] = "the router's metrics"
    for inst in spec.local:
        assert inst.cfg is not None  # local instances have a profile
        port = inst.cfg.server.port
        if port in taken:
            raise ConfigError(
                f"{spec.path}: instance '{inst.name}' and {taken[port]} both use port {port}"
            )
        taken[port] = f"instance '{inst.name}'"


def _check_cpus(spec: FleetSpec) -> None:
    """Each instance's ``cpus`` are CPUs this machine lets Quantdeck run on: vLLM would bind
    its threads to the rest silently, or fail late."""
    have = machine_cpus()
    for inst in spec.local:
        if inst.cpus is None:
            continue
        lacking = [c for c in cpu_numbers(inst.cpus) if c not in have]
        if lacking:
            raise ConfigError(
                f"{spec.path}: instance '{inst.name}': 'cpus' {inst.cpus} names CPU "
                f"{lacking[0]}, which this machine lacks (it has {_ranges(have)})"
            )


def cpu_sharing(spec: FleetSpec, have: set[int] | None = None) -> list[str]:
    """Where instances on the CPU would compute on the same cores and take turns there: two or
    more local CPU instances without ``cpus`` (vLLM binds each one's threads alike: by
    ``VLLM_CPU_OMP_THREADS_BIND``, inherited, whose default "auto" picks the cores of the first
    NUMA node for every instance; measured here, two instances' engines both on CPU 0), and
    instances whose ``cpus`` overlap. One line each; the first names a split of the CPUs free
    (``have``: this machine's, less those other instances name) that gives each its own."""
    have = machine_cpus() if have is None else have
    on_cpu = [i for i in spec.local if i.gpus is None]
    bound = [(i, set(cpu_numbers(i.cpus))) for i in on_cpu if i.cpus is not None]
    out = []
    loose = [i for i in on_cpu if i.cpus is None]
    if len(loose) > 1 and os.environ.get(CPU_BIND_ENV, "auto") != "nobind":
        names = ", ".join(f"'{i.name}'" for i in loose)
        free = sorted(have.difference(*(c for _, c in bound)))
        if len(free) >= len(loose):
            size = len(free) // len(loose)
            parts = [free[k * size : (k + 1) * size] for k in range(len(loose) - 1)]
            parts.append(free[(len(loose) - 1) * size :])  # the rest to the last
            split = ", ".join(
                f"'cpus: {_ranges(set(p))}' for '{i.name}'"
                for i, p in zip(loose, parts, strict=True)
            )
            fix = f"give each its own 'cpus', e.g. {split}"
        else:
            fix = f"this machine has {len(free)} CPUs free for {len(loose)} instances"
        out.append(
            f"instances {names} run on the CPU without 'cpus': vLLM binds each one's threads "
            f"to the same cores, where they take turns; {fix}"
        )
    for k, (a, ca) in enumerate(bound):
        for b, cb in bound[k + 1 :]:
            if ca & cb:
                out.append(
                    f"instances '{a.name}' and '{b.name}' both name CPU {_ranges(ca & cb)} in "
                    "'cpus': their threads take turns there"
                )
    return out


def _advise(inst: InstanceSpec, device: DeviceFacts | None) -> int:
    """The advisor's verdict on one instance; returns the bytes it takes on each of its GPUs."""
    assert inst.cfg is not None and device is not None  # a local instance, its device found
    if device.is_cuda:
        count = len(inst.gpus or [0])
        device = dataclasses.replace(device, count=count)
    cfg = with_cpu_default_kv(inst.cfg, device)  # a copy, as its launch plan gives it
    try:
        info = inspect_model(cfg.model.model)
        version = EngineEnv(inst.engine).version()[1] if inst.engine else local_vllm_version()
        kv = plan(cfg, info, device, vllm_version=version)
        errs = errors(advise(cfg, info, device, kv))
    except QuantdeckError as e:
        raise ConfigError(f"instance '{inst.name}': {e}") from None
    if errs:
        raise ConfigError(f"instance '{inst.name}': {errs[0].message}")
    if kv.kv_source == "utilization":
        return kv.budget_bytes
    return kv.total_bytes - kv.free_bytes


RAM_HEADROOM_BYTES = GiB  # left free beside a trial's candidate on a CPU host


def admit_candidate(
    spec: FleetSpec,
    inst: InstanceSpec,
    cfg: LaunchConfig,
    *,
    device: DeviceFacts | None = None,
    ram_available: int | None = None,
    asleep: dict[int, list[tuple[str, int]]] | None = None,
) -> str:
    """Whether ``cfg`` (a live trial's candidate for ``inst``) fits beside the running fleet,
    before anything starts: the advisor's verdict on it, then on a GPU every instance sharing
    one of ``inst``'s GPUs, what sleeping retired incumbents still hold there (``asleep``: GPU
    -> [(name, bytes)], NVML's figures) plus the candidate within its memory; on a CPU host
    the candidate's weights, activations and KV cache within the RAM available now (the
    incumbent already counted there) less :data:`RAM_HEADROOM_BYTES`. Returns the planner's
    figures in one line; ConfigError (one line, the same figures) when it does not fit."""
    probe = dataclasses.replace(inst, cfg=cfg, name=f"{inst.name} (candidate)")
    if inst.gpus is not None:
        gpu = device or detect_device()
        if not gpu.is_cuda:
            raise ConfigError(f"instance '{inst.name}' names GPUs, but no NVIDIA GPU is here")
        need = _advise(probe, gpu)
        total = gpu.memory_total_bytes
        parts = []
        for g in inst.gpus:
            users = [(i.name, _advise(i, gpu)) for i in spec.local if g in (i.gpus or [])]
            users.append((f"{inst.name} (candidate)", need))
            users = beyond_share(users) + (asleep or {}).get(g, [])
            used = sum(b for _, b in users)
            text = " + ".join(f"{n} {b / GiB:.1f} GiB" for n, b in users)
            if used > total:
                raise ConfigError(
                    f"the candidate does not fit beside the fleet on GPU {g}: {text} = "
                    f"{used / GiB:.1f} GiB > {total / GiB:.1f} GiB{_BEYOND_NOTE}"
                )
            parts.append(f"GPU {g}: {text} = {used / GiB:.1f} of {total / GiB:.1f} GiB")
        return "; ".join(parts) + _BEYOND_NOTE
    need = _advise(probe, device or cpu_device())
    available = psutil.virtual_memory().available if ram_available is None else ram_available
    room = available - RAM_HEADROOM_BYTES
    figures = (
        f"the candidate needs {need / GiB:.2f} GiB of RAM (weights, activations, KV cache); "
        f"{available / GiB:.1f} GiB is available beside the fleet, "
        f"{RAM_HEADROOM_BYTES / GiB:.0f} GiB kept free"
    )
    if need > room:
        raise ConfigError(f"the candidate does not fit: {figures}")
    return figures


# What a vLLM process holds on its GPU beyond its share (gpu-memory-utilization x the GPU's
# memory, or its weights and explicit KV cache), by NVML: the CUDA context, cuBLAS and NCCL
# workspaces, the allocator's slack, CUDA graphs' pool. Measured with vLLM 0.26: +2.7 GiB (1B,
# eager, H100), +3.5 GiB (1B, CUDA graphs, H100), +2.8 GiB (8B, graphs, H100, per process),
# three 8B eager instances at 0.28 of an H200 holding 129.5 GiB together, +3.9 GiB each
# (docs/gpu-validation.md). It counts where instances share a GPU; one alone is vLLM's to size.
BEYOND_SHARE_BYTES = 4 * GiB
_BEYOND_NOTE = f" (each instance counted with {BEYOND_SHARE_BYTES / GiB:.0f} GiB beyond its share)"


def beyond_share(users: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """Instances' shares of one GPU, each with what it holds beyond it where they share it."""
    if len(users) < 2:
        return users
    return [(name, used + BEYOND_SHARE_BYTES) for name, used in users]


def _check_gpus(
    spec: FleetSpec, device: DeviceFacts, shares: dict[int, list[tuple[str, int]]]
) -> None:
    """Instances sharing a GPU must fit on it together (each one's utilisation share, or its
    weights and explicit KV cache, summed against the GPU's memory)."""
    for gpu, users in sorted(shares.items()):
        if gpu >= device.count:
            raise ConfigError(
                f"{spec.path}: instance '{users[0][0]}' names GPU {gpu}, "
                f"but this machine has {device.count}"
            )
        users = beyond_share(users)
        total = sum(b for _, b in users)
        if total > device.memory_total_bytes:
            parts = " + ".join(f"{n} {b / GiB:.1f} GiB" for n, b in users)
            raise ConfigError(
                f"{spec.path}: GPU {gpu} is overfull: {parts} > "
                f"{device.memory_total_bytes / GiB:.1f} GiB{_BEYOND_NOTE}"
            )


# -- a fleet of one: `serve --behind-router` -------------------------------------------------
SERVE_KEY_ENV = "QUANTDECK_SERVE_API_KEY"  # the key of a fleet of one, named in its file


def fleet_of_one(
    cfg: LaunchConfig, folder: Path, *, name: str = "serve", engine: str | None = None
) -> Path:
    """A fleet file of one instance of ``cfg`` behind vLLM's router, the router on ``cfg``'s
    host and port (the URL clients use, which then stays across live trials and promotions)
    and the instance on a free loopback port; written (0600) in ``folder``, its path returned.
    An API key is named, never written: ``env:`` :data:`SERVE_KEY_ENV`, set in this process's
    environment (its children, the router and the instance, inherit it)."""
    profile = to_dict(cfg)  # secrets are never in it
    for key in ("host", "port"):
        profile.pop(key, None)
    inst: dict[str, Any] = {"name": name, "port": free_port(), "profile": profile}
    if engine is not None:
        inst["engine"] = engine
    router: dict[str, Any] = {"host": cfg.server.host, "port": cfg.server.port}
    if cfg.server.api_key:
        os.environ[SERVE_KEY_ENV] = cfg.server.api_key
        router["api_key"] = inst["api_key"] = f"env:{SERVE_KEY_ENV}"
    path = folder / f"serve-{cfg.server.port}.yaml"
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    doc = {"router": router, "instances": [inst]}
    header = f"{FLEET_OF_ONE}: the router on the serve's port, the instance beside it\n"
    write_atomic(path, header + yaml.safe_dump(doc, sort_keys=False), private=True)
    return path


FLEET_OF_ONE = "# a fleet of one, written by `quantdeck serve --behind-router`"


def is_fleet_of_one(path: Path) -> bool:
    """The fleet file at ``path`` is one :func:`fleet_of_one` wrote (Quantdeck's, made from a
    launch: a promotion keeps no file of it; the operator never named one)."""
    try:
        with path.open(encoding="utf-8") as f:
            return f.readline().startswith(FLEET_OF_ONE)
    except OSError:
        return False
