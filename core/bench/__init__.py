"""Benchmarks: the load, its prompts and statistics, the client, A/B runs, tuning, saved runs.

The jobs (client, A/B, tuning, statistics) are imported on first use: a command line that only
declares the load's options (:func:`add_load_options`) does not load numpy and httpx."""

import importlib
from typing import TYPE_CHECKING, Any

from quantdeck.core.bench.load import (
    LoadField,
    LoadSpec,
    SloLimits,
    add_load_options,
    load_args,
    load_fields,
    load_from_options,
    parse_slo,
    slo_from_options,
)
from quantdeck.core.bench.results import (
    ABResult,
    ArmResult,
    BenchResult,
    LiveTrial,
    LiveTuneResult,
    PointFigures,
    RunResult,
    TuneResult,
)
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

if TYPE_CHECKING:
    from quantdeck.core.bench.ab import ABRun, Arm, check_arms, knob_diff, parse_arm
    from quantdeck.core.bench.client import Bench
    from quantdeck.core.bench.live_tune import LiveSearch, LiveTuner, TrialOutcome
    from quantdeck.core.bench.space import apply_point, parse_space, text_of, tunable_knobs
    from quantdeck.core.bench.stats import summary_lines
    from quantdeck.core.bench.tune import Tuner, point_outcome

_JOBS = {
    "ab": ("ABRun", "Arm", "check_arms", "knob_diff", "parse_arm"),
    "client": ("Bench",),
    "live_tune": ("LiveSearch", "LiveTuner", "TrialOutcome"),
    "space": ("apply_point", "parse_space", "text_of", "tunable_knobs"),
    "stats": ("summary_lines",),
    "tune": ("Tuner", "point_outcome"),
}

__all__ = [
    "ABResult",
    "ABRun",
    "ArmResult",
    "BenchResult",
    "LiveTrial",
    "LiveTuneResult",
    "PointFigures",
    "RunResult",
    "TuneResult",
    "add_load_options",
    "apply_point",
    "Arm",
    "Bench",
    "check_arms",
    "check_result_target",
    "compare",
    "environment",
    "knob_diff",
    "list_runs",
    "LiveSearch",
    "LiveTuner",
    "load_args",
    "load_fields",
    "load_from_options",
    "load_run",
    "LoadField",
    "LoadSpec",
    "parse_arm",
    "parse_slo",
    "parse_space",
    "point_outcome",
    "runs_dir",
    "save_run",
    "slo_from_options",
    "SloLimits",
    "summary_lines",
    "text_of",
    "TrialOutcome",
    "tunable_knobs",
    "Tuner",
    "write_result",
]


def __getattr__(name: str) -> Any:
    for module, names in _JOBS.items():
        if name in names:
            return getattr(importlib.import_module(f"{__name__}.{module}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
