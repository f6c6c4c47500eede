"""``quantdeck doctor``: what this machine and each engine can do, each problem with a fix."""

from __future__ import annotations

import argparse
import os

from quantdeck.cli._common import AddCommand, print_json
from quantdeck.core.errors import QuantdeckError


def cmd_doctor(ns: argparse.Namespace) -> int:
    from quantdeck.core.doctor import report_lines, run_doctor
    from quantdeck.core.engines import known_pythons, resolve_engine

    pythons = []
    for py in ns.engine_python or ():
        # a path that names no program is the user's typo, not a finding about an engine
        path = os.path.abspath(os.path.expanduser(py)) if py else ""
        if not (path and os.path.isfile(path) and os.access(path, os.X_OK)):
            raise QuantdeckError(f"--engine-python {py!r}: not an executable file")
        pythons.append(path)
    pythons += [resolve_engine(name) for name in ns.engine or ()]
    report = run_doctor(pythons or known_pythons())
    if ns.json:
        print_json(report.to_json())
    else:
        print("\n".join(report_lines(report)))
    return report.exit_code


def register(add: AddCommand) -> None:
    p = add(
        "doctor",
        cmd_doctor,
        "check this machine and each engine (vLLM, torch/CUDA, GPUs and driver, CPU "
        "instruction set, port, Qt's libraries, disk space): each problem with its fix; "
        "exit 0 when an engine can serve, 1 otherwise",
    )
    p.add_argument(
        "--engine-python",
        action="append",
        metavar="PY",
        help="check this Python's vLLM instead of the engines known (repeatable; default: the "
        "registered engines, this interpreter, the active venv's and conda env's)",
    )
    p.add_argument(
        "--engine",
        action="append",
        metavar="NAME|PY",
        help="check this engine (a registered name or a path; repeatable)",
    )
    p.add_argument("--json", action="store_true", help="the report as one JSON object")
