"""Quantdeck's GPTQ / AWQ job against GPTQModel called directly (goal: ratio <= 1.05).

    python benchmarks/convert.py [--methods gptq,awq] [-n 1] [--samples 8] [--seq-len 128]
        [--src MODEL]

For each method and run, two fresh processes convert the same model (default: the demo model)
with the same calibration windows and GPTQModel settings:

- quantdeck: ``quantdeck.core.convert.run_job``, i.e. the ``quantdeck.core.workers.quantize``
  subprocess with its JSON progress events, then the inspector's verify step and the rename
  into place; timed from the call to its return (in a child process that has imported nothing
  heavy).
- direct: a plain script that imports GPTQModel, loads, quantizes and saves, timed from spawn
  to exit, as a user running that script would see it.

Both pay the same imports (GPTQModel alone takes ~12 s here), so the ratio shows what the job
adds: progress events, copying the source's side files, verification and process handling.
The order alternates between runs; medians are reported. On a shared machine the wall times
move with the neighbours' load, so the CPU time (user + system, all child processes) of each
side is reported too.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

DIRECT = r"""
import sys, time
t0 = time.monotonic()
from pathlib import Path
from quantdeck.core.workers.quantize.common import (
    DEFAULT_CALIB,
    calibration_batches,
    read_calibration,
)
from quantdeck.core.workers.quantize.gptqmodel import (
    gptqmodel_calibration,
    gptqmodel_config,
    gptqmodel_environment,
)
gptqmodel_environment()  # the same GPTQModel environment the job sets
from gptqmodel import GPTQModel
src, out, method, samples, seq_len = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], \
    int(sys.argv[4]), int(sys.argv[5])
t_import = time.monotonic()
qconfig, backend = gptqmodel_config(method, out / ".gptqmodel" / "offload")
model = GPTQModel.load(str(src), qconfig, device="cpu")
t_load = time.monotonic()
rows = gptqmodel_calibration(calibration_batches(src, read_calibration(DEFAULT_CALIB), samples,
                                                 seq_len))
model.quantize(rows, batch_size=1, backend=backend)
t_quant = time.monotonic()
model.save(str(out))
t_save = time.monotonic()
import resource
print("TIMES", t_import - t0, t_load - t_import, t_quant - t_load, t_save - t_quant,
      resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, file=sys.stderr, flush=True)
"""

JOB = r"""
import json, sys, time
t0 = time.monotonic()
from quantdeck.core.convert import QuantSpec, run_job
result = run_job(QuantSpec(sys.argv[1], sys.argv[3], sys.argv[2], samples=int(sys.argv[4]),
                           seq_len=int(sys.argv[5])))
print("RESULT", json.dumps({**result.to_json(), "seconds": time.monotonic() - t0}), flush=True)
"""


def children_cpu() -> float:
    """CPU seconds (user + system) of the finished child processes, grandchildren included."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run_direct(
    src: Path, out: Path, method: str, samples: int, seq_len: int, env: dict[str, str]
) -> tuple[float, float, list[float]]:
    """Wall and CPU time of the plain GPTQModel script, spawn to exit; its phase times and
    peak RSS (bytes, last)."""
    out.mkdir(parents=True)
    cpu0, t0 = children_cpu(), time.monotonic()
    # in OUT, like the job: GPTQModel writes its per-module logs to ./logs
    r = subprocess.run(
        [sys.executable, "-c", DIRECT, str(src), str(out), method, str(samples), str(seq_len)],
        cwd=out,
        env=env,
        capture_output=True,
        text=True,
    )
    wall, cpu = time.monotonic() - t0, children_cpu() - cpu0
    if r.returncode != 0:
        raise SystemExit(f"direct {method} failed:\n{r.stderr[-3000:]}")
    line = next(ln for ln in r.stderr.splitlines() if ln.startswith("TIMES"))
    return wall, cpu, [float(x) for x in line.split()[1:]]


def run_quantdeck(
    src: Path, out: Path, method: str, samples: int, seq_len: int, env: dict[str, str]
) -> tuple[float, float, int]:
    """Wall time of run_job (subprocess + verify + rename), measured around the call; and the
    CPU time of the whole child (its interpreter, the job's subprocess, verify)."""
    cpu0 = children_cpu()
    r = subprocess.run(
        [sys.executable, "-c", JOB, str(src), str(out), method, str(samples), str(seq_len)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
    )
    if r.returncode != 0:
        raise SystemExit(f"quantdeck {method} failed:\n{r.stderr[-3000:]}")
    result = json.loads(
        next(ln for ln in r.stdout.splitlines() if ln.startswith("RESULT"))[len("RESULT ") :]
    )
    return result["seconds"], children_cpu() - cpu0, int(result.get("peak_rss_bytes") or 0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--methods", default="gptq,awq")
    ap.add_argument("-n", type=int, default=1, help="runs per method and side")
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--src", type=Path, default=None, help="model folder (default: demo model)")
    a = ap.parse_args()
    if a.src is None:
        from quantdeck.core.models import ensure_demo_model

        a.src = ensure_demo_model()
    a.src = a.src.resolve()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}
    work = Path(tempfile.mkdtemp(prefix="quantdeck-bench-convert-"))
    print(
        f"{a.src.name}, {a.samples} x {a.seq_len} calibration tokens, "
        f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}, "
        f"{os.cpu_count()} CPUs"
    )
    try:
        for method in a.methods.split(","):
            direct, job, direct_cpu, job_cpu, phases, job_rss = [], [], [], [], [], []
            for i in range(a.n):
                sides = ("direct", "quantdeck") if i % 2 == 0 else ("quantdeck", "direct")
                for side in sides:
                    out = work / f"{method}-{side}-{i}"
                    if side == "direct":
                        wall, cpu, ph = run_direct(a.src, out, method, a.samples, a.seq_len, env)
                        direct.append(wall)
                        direct_cpu.append(cpu)
                        phases.append(ph)
                    else:
                        wall, cpu, rss = run_quantdeck(
                            a.src, out, method, a.samples, a.seq_len, env
                        )
                        job.append(wall)
                        job_rss.append(rss)
                        job_cpu.append(cpu)
                    shutil.rmtree(out, ignore_errors=True)
            d, q = statistics.median(direct), statistics.median(job)
            dc, qc = statistics.median(direct_cpu), statistics.median(job_cpu)
            ph = [statistics.median(p[k] for p in phases) for k in range(5)]
            print(
                f"{method}: direct GPTQModel {d:.1f} s (import {ph[0]:.1f}, load {ph[1]:.1f}, "
                f"quantize {ph[2]:.1f}, save {ph[3]:.1f}); quantdeck job {q:.1f} s; "
                f"ratio {q / d:.3f} (goal <= 1.05), median of {a.n} run(s)"
            )
            print(
                f"  CPU time (user + system): direct {dc:.1f} s, quantdeck {qc:.1f} s, "
                f"ratio {qc / dc:.3f}"
            )
            print(
                f"  peak RSS: direct {ph[4] / 2**20:.0f} MiB, quantdeck job "
                f"{statistics.median(job_rss) / 2**20:.0f} MiB"
            )
            print(
                f"  wall per run: direct {', '.join(f'{x:.1f}' for x in direct)}; "
                f"quantdeck {', '.join(f'{x:.1f}' for x in job)}"
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
