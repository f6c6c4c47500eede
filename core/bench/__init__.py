"""Benchmarks: the load, its prompts and statistics, the client, A/B runs, tuning, saved runs."""

from quantdeck.core.bench.ab import ABRun, Arm, check_arms, knob_diff, parse_arm
from quantdeck.core.bench.client import Bench
from quantdeck.core.bench.load import LoadSpec, parse_slo
from quantdeck.core.bench.runs import (
    check_result_target,
    compare,
    environment,
    list_runs,
    load_run,
    runs_dir,
    save_run,
    write_result,
)
from quantdeck.core.bench.stats import summary_lines
from quantdeck.core.bench.tune import Tuner, apply_point, parse_space, point_outcome

__all__ = [
    "ABRun",
    "apply_point",
    "Arm",
    "Bench",
    "check_arms",
    "check_result_target",
    "compare",
    "environment",
    "knob_diff",
    "list_runs",
    "load_run",
    "LoadSpec",
    "parse_arm",
    "parse_slo",
    "parse_space",
    "point_outcome",
    "runs_dir",
    "save_run",
    "summary_lines",
    "Tuner",
    "write_result",
]
