"""The tuner against the exhaustive grid: same model, load, targets and space.

    python benchmarks/tune_goal.py MODEL --ttft-ms X --tpot-ms Y [knobs via --extra "..."]
        [--space KNOB=V1,V2 ...] [--concurrency 64 --num-prompts 256 --input-len 512
        --output-len 128] --out DIR

Runs ``quantdeck tune --strategy grid`` then ``--strategy coordinate`` and prints the
coordinate search's best goodput as a share of the grid's best and its time as a share of the
grid's (goal on a GPU: >= 95 % of the goodput in <= 1/3 of the time).
"""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path


def tune(ns: argparse.Namespace, strategy: str) -> dict:
    out = ns.out / f"tune-{strategy}.json"
    cmd = [
        sys.executable,
        "-m",
        "quantdeck.cli",
        "tune",
        ns.model,
        *shlex.split(ns.extra),
        "--ttft-ms",
        str(ns.ttft_ms),
        "--tpot-ms",
        str(ns.tpot_ms),
        "--strategy",
        strategy,
        "--concurrency",
        str(ns.concurrency),
        "--num-prompts",
        str(ns.num_prompts),
        "--input-len",
        str(ns.input_len),
        "--output-len",
        str(ns.output_len),
        "--json",
        str(out),
    ]
    if ns.space:
        cmd += ["--space", *ns.space]
    subprocess.run(cmd, check=True)
    return json.loads(out.read_text())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--ttft-ms", type=float, required=True)
    ap.add_argument("--tpot-ms", type=float, required=True)
    ap.add_argument("--extra", default="", help="launch knobs for every point")
    ap.add_argument("--space", nargs="+")
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--num-prompts", type=int, default=256)
    ap.add_argument("--input-len", type=int, default=512)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--out", type=Path, required=True)
    ns = ap.parse_args()
    ns.out.mkdir(parents=True, exist_ok=True)
    grid = tune(ns, "grid")
    if not (grid.get("best") or {}).get("goodput"):  # nothing for the search to match
        print("the grid found no point with goodput: targets too tight for this load")
        return 1
    coord = tune(ns, "coordinate")
    g, c = grid["best"]["goodput"], coord["best"]["goodput"] or 0.0
    print(
        f"grid: {len(grid['points'])} points, {grid['seconds']:.0f} s, best goodput {g:.2f} "
        f"req/s at {grid['best']['values']}"
    )
    print(
        f"coordinate: {len(coord['points'])} points, {coord['seconds']:.0f} s, best goodput "
        f"{c:.2f} req/s at {coord['best']['values']}"
    )
    # the coordinate search's choice as the grid measured it: the share without the noise of
    # measuring the same point twice
    same = next(
        (p["goodput"] for p in grid["points"] if p["values"] == coord["best"]["values"]), None
    )
    print(
        f"goodput share {c / g:.3f} (goal >= 0.95)"
        + (f"; of its choice as the grid measured it {same / g:.3f}" if same else "")
        + f"; time share {coord['seconds'] / grid['seconds']:.3f} (goal <= 0.333)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
