"""Process start to first shown window of the `quantdeck` panel (goals: the light install
<= 1.0 s, the standalone bundle <= 1.5 s).

    python benchmarks/startup.py [-n 5] [--app LABEL=COMMAND ...]

Each `--app` is a command that starts the panel: the default, `venv`, is this interpreter's
`python -m quantdeck.cli`; the light install's is its `.../bin/quantdeck` (build-app.sh's
build venv, OUTDIR/.build/venv, is one), the bundle's `OUTDIR/quantdeck/quantdeck`. Each run
spawns a fresh process with QUANTDECK_EXIT_AFTER_FIRST_PAINT set: the panel prints the time at
which its window's first paint pass ended and quits (quantdeck.gui.app.FirstPaint); the figure
is that time minus the time just before the spawn. The apps take turns, run by run, over the
same data folder (the demo model linked in, so the Library lists it); the first run of each
reads files the page cache may not hold yet (printed apart: "first")."""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def first_paint(cmd: list[str], env: dict[str, str]) -> float:
    t0 = time.time()
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("first-paint ")]
    if not line:
        raise SystemExit(
            f"{shlex.join(cmd)}: no first paint (exit {r.returncode})\n{r.stderr[-2000:]}"
        )
    return float(line[0].split()[1]) - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("-n", type=int, default=5)
    ap.add_argument("--app", action="append", metavar="LABEL=COMMAND", default=[])
    a = ap.parse_args()
    apps = {"venv": [sys.executable, "-m", "quantdeck.cli"]} if not a.app else {}
    for spec in a.app:
        label, _, cmd = spec.partition("=")
        apps[label] = shlex.split(cmd)
    from quantdeck.core.models import ensure_demo_model
    from quantdeck.gui.app import FIRST_PAINT_ENV

    demo = ensure_demo_model()
    data = Path(tempfile.mkdtemp()) / "data"
    (data / "models").mkdir(parents=True)
    os.symlink(demo, data / "models" / demo.name)
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env.update(
        QT_QPA_PLATFORM=os.environ.get("QT_QPA_PLATFORM", "offscreen"),
        QUANTDECK_DATA_DIR=str(data),
        QUANTDECK_CONFIG_DIR=str(data / "cfg"),
        QUANTDECK_CACHE_DIR=str(data / "cache"),
        **{FIRST_PAINT_ENV: "1"},
    )
    times: dict[str, list[float]] = {label: [] for label in apps}
    for _ in range(a.n + 1):
        for label, cmd in apps.items():
            times[label].append(first_paint([*cmd, "gui"], env))
    for label, ts in times.items():
        rest = ts[1:]
        print(
            f"{label}: start to first shown window: first {ts[0]:.3f} s; then median "
            f"{statistics.median(rest):.3f} s, max {max(rest):.3f} s over {a.n} runs"
        )


if __name__ == "__main__":
    main()
