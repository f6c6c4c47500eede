"""Time of one NVML snapshot per GPU (goal: <= 1 ms), through Quantdeck's wrapper.

    python benchmarks/nvml_snapshot.py

Prints "no NVIDIA driver" on a machine without one (nothing to time).
"""

from __future__ import annotations

import statistics
import time

from quantdeck.core.monitor.telemetry import gpu_count, nvml_available, read_gpu


def main() -> None:
    if not nvml_available() or gpu_count() == 0:
        print("no NVIDIA driver: nothing to time (telemetry reports host CPU/RAM only)")
        return
    for i in range(gpu_count()):
        read_gpu(i)
        xs = []
        for _ in range(200):
            t = time.perf_counter()
            g = read_gpu(i)
            xs.append((time.perf_counter() - t) * 1000)
        print(
            f"GPU {i} {g.name}: median {statistics.median(xs):.3f} ms, max {max(xs):.3f} ms "
            f"per snapshot (util {g.utilization_pct}%, {g.power_w} W) goal <= 1 ms"
        )


if __name__ == "__main__":
    main()
