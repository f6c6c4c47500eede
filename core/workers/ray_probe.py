"""Subprocess entry point: describe the Ray cluster at ADDRESS as one JSON line.

``python -m quantdeck.core.workers.ray_probe [--installed-only] [--] ADDRESS`` prints
``{"installed", "version", "nodes", "gpus", "cpus", "error"}``. Whether Ray is installed is found
without importing it (``importlib.util.find_spec``); then, unless ``--installed-only``, it connects
as a driver (``ray.init(address=ADDRESS, log_to_driver=False)``), counts the live nodes and the
cluster's total resources, and disconnects. The caller
(:func:`quantdeck.core.launch.ray.probe_ray`) bounds the time it takes.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
from typing import Any


def _say(**fields: Any) -> int:
    print(json.dumps(fields), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="ray_probe")
    ap.add_argument("--installed-only", action="store_true")
    ap.add_argument("address")
    ns = ap.parse_args(argv)
    if importlib.util.find_spec("ray") is None:
        return _say(installed=False)
    version = ""
    try:
        from importlib.metadata import version as dist_version

        version = dist_version("ray")
    except Exception:  # an unpacked wheel without metadata: the version stays unknown
        pass
    if ns.installed_only:
        return _say(installed=True, version=version)
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # as vLLM does
    # stdout is for the one JSON line: Ray's banners go to stderr
    out = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)
    try:
        import ray  # not in .venv: the engine's Python has it

        ray.init(address=ns.address, log_to_driver=False, logging_level="ERROR")
        try:
            nodes = [n for n in ray.nodes() if n.get("Alive")]
            res = ray.cluster_resources()
        finally:
            ray.shutdown()
    except Exception as e:  # report, don't crash: the caller shows this line
        first = (str(e).strip().splitlines() or [""])[0][:300]
        msg = f"cannot connect to the Ray cluster at {ns.address}: {type(e).__name__}: {first}"
        print(json.dumps({"installed": True, "version": version, "error": msg}), file=out)
        return 0
    facts = {
        "installed": True,
        "version": version,
        "nodes": len(nodes),
        "gpus": float(res.get("GPU", 0.0)),
        "cpus": float(res.get("CPU", 0.0)),
    }
    print(json.dumps(facts), file=out, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
