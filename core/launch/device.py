"""What the planner and advisor know about the device a model will run on.

Facts come from NVML (through :mod:`pynvml`, initialised lazily) or, with no NVIDIA driver,
describe the CPU. No driver is a normal state, not an error.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

import psutil

if TYPE_CHECKING:
    from quantdeck.core.launch.ray import RayFacts

GiB = 2**30


@dataclass(frozen=True)
class DeviceFacts:
    """One kind of device: ``cpu`` or ``cuda`` (``count`` GPUs of one model)."""

    kind: str  # "cpu" | "cuda"
    name: str
    memory_total_bytes: int  # per GPU; host RAM for cpu
    count: int = 1
    compute_capability: tuple[int, int] | None = None
    memory_bandwidth_bytes_per_s: float | None = None  # per GPU, peak
    cpu_flags: frozenset[str] = frozenset()
    ray: RayFacts | None = None  # the Ray cluster a launch uses, when probed (launch.ray)

    @property
    def is_cuda(self) -> bool:
        return self.kind == "cuda"

    @property
    def label(self) -> str:
        if self.is_cuda:
            cc = ".".join(map(str, self.compute_capability or ()))
            n = f"{self.count}x " if self.count > 1 else ""
            return f"{n}{self.name} ({self.memory_total_bytes / GiB:.0f} GiB, cc {cc})"
        return f"CPU {self.name} ({self.memory_total_bytes / GiB:.0f} GiB RAM)"


def _cpu_flags() -> frozenset[str]:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return os.uname().machine


@lru_cache(maxsize=1)
def cpu_device() -> DeviceFacts:
    return DeviceFacts(
        kind="cpu",
        name=_cpu_name(),
        memory_total_bytes=psutil.virtual_memory().total,
        count=os.cpu_count() or 1,
        cpu_flags=_cpu_flags(),
    )


def cuda_device(
    memory_gib: float,
    *,
    name: str = "GPU",
    count: int = 1,
    compute_capability: tuple[int, int] = (9, 0),
    bandwidth_bytes_per_s: float | None = None,
) -> DeviceFacts:
    """A GPU described by hand, for planning a launch on a machine that is not this one."""
    return DeviceFacts(
        kind="cuda",
        name=name,
        memory_total_bytes=int(memory_gib * GiB),
        count=count,
        compute_capability=compute_capability,
        memory_bandwidth_bytes_per_s=bandwidth_bytes_per_s,
    )


H200 = cuda_device(150754820096 / GiB, name="NVIDIA H200", bandwidth_bytes_per_s=4.81e12)


def detect_device() -> DeviceFacts:
    """The GPUs NVML sees on this machine, else the CPU."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:  # no library, no driver: a CPU machine
        return cpu_device()
    try:
        n = pynvml.nvmlDeviceGetCount()
        if n == 0:
            return cpu_device()
        h = pynvml.nvmlDeviceGetHandleByIndex(0)
        name = pynvml.nvmlDeviceGetName(h)
        name = name.decode() if isinstance(name, bytes) else str(name)
        mem = pynvml.nvmlDeviceGetMemoryInfo(h).total
        cc = tuple(pynvml.nvmlDeviceGetCudaComputeCapability(h))
        bw = None
        try:
            bus = pynvml.nvmlDeviceGetMemoryBusWidth(h)
            clk = pynvml.nvmlDeviceGetMaxClockInfo(h, pynvml.NVML_CLOCK_MEM)
            bw = bus / 8 * clk * 1e6 * 2
        except Exception:
            pass
        return DeviceFacts(
            kind="cuda",
            name=name,
            memory_total_bytes=int(mem),
            count=n,
            compute_capability=(int(cc[0]), int(cc[1])),
            memory_bandwidth_bytes_per_s=bw,
        )
    except Exception:
        return cpu_device()
