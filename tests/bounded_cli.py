"""The real CLI in a subprocess with its address space limited (RLIMIT_AS, as ``ulimit -v``
sets it), timed and measured: its CPU time from ``wait4``, its peak RSS from its own
``VmHWM``. For the inputs that used to eat the machine or end in a traceback (issues 31 and
43): each must be one ``quantdeck: error:`` line and exit 2, in bounded memory and time."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

AS_LIMIT = 3 * 2**29  # 1.5 GiB of address space for the CLI under test
ULIMIT_V = 3_000_000 * 1024  # `ulimit -v 3000000` (KiB): the round-4 audit's bound (issue 43)
# `python -m quantdeck.cli ARGV` that writes its peak RSS (KiB: its own or a reaped child's,
# the larger) to the file named in argv[1] as it exits. Measured inside: wait4's ru_maxrss
# keeps the high-water mark across exec, so from here it starts at whatever this pytest
# process had grown to when it forked (340 MiB after a torch import; 978 MiB on a
# parallel-pass worker after the conversion tests).
PEAK_WRAPPER = """
import atexit, resource, runpy, sys
peak_file = sys.argv.pop(1)

def write_peak():
    with open("/proc/self/status") as status:
        own = next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    with open(peak_file, "w") as out:
        out.write(str(max(own, children)))

atexit.register(write_peak)
sys.argv[0] = "quantdeck"
runpy.run_module("quantdeck.cli", run_name="__main__", alter_sys=True)
"""


@dataclass
class Bounded:
    code: int
    out: str
    err: str
    wall_s: float
    cpu_s: float
    peak_mib: float


def run_bounded(
    argv: list[str], tmp_path: Path, timeout: float = 30.0, *, as_limit: int = AS_LIMIT
) -> Bounded:
    """``python -m quantdeck.cli ARGV`` in ``tmp_path`` with RLIMIT_AS at ``as_limit`` bytes
    (1.5 GiB unless told); killed (and the test failed) past ``timeout`` seconds: a hang is a
    failure, not a wait."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (as_limit, as_limit))

    # one BLAS thread: numpy's OpenBLAS reserves address space per thread at import
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    out, err = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
    peak = tmp_path / "peak-kib.txt"
    with open(out, "wb") as o, open(err, "wb") as e:
        t0 = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-c", PEAK_WRAPPER, str(peak), *argv],
            cwd=tmp_path,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=o,
            stderr=e,
            preexec_fn=limit,
        )
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if time.monotonic() - t0 > timeout:
                proc.kill()
                proc.wait()
                pytest.fail(f"{argv} still ran after {timeout} s")
            time.sleep(0.02)
        wall = time.monotonic() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
    return Bounded(
        proc.returncode,
        out.read_text(),
        err.read_text(errors="replace"),
        wall,
        usage.ru_utime + usage.ru_stime,
        int(peak.read_text()) / 1024,
    )


def one_line_exit_2(r: Bounded, words: str) -> None:
    lines = [line for line in r.err.splitlines() if line.strip()]
    assert r.code == 2 and "Traceback" not in r.err, (r.code, r.err[-2000:])
    assert len(lines) == 1 and lines[0].startswith("quantdeck: error: "), r.err
    assert words in lines[0], lines[0]
