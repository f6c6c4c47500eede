"""The aggregates of a run, with ``vllm bench serve``'s names and definitions, and its human
summary."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from quantdeck.core.bench.load import DEFAULT_PERCENTILES, RequestRecord

if TYPE_CHECKING:
    from quantdeck.core.bench.results import BenchResult


def _stats(values: list[float], name: str, percentiles: Sequence[float]) -> dict[str, float]:
    arr = np.asarray(values or [0.0], dtype=float) * 1000.0
    out = {
        f"mean_{name}_ms": float(arr.mean()),
        f"median_{name}_ms": float(np.median(arr)),
        f"std_{name}_ms": float(arr.std()),
    }
    for p in percentiles:
        out[f"p{p:g}_{name}_ms"] = float(np.percentile(arr, p))
    return out


def compute_metrics(
    records: Sequence[RequestRecord],
    duration: float,
    slo: dict[str, float] | None = None,
    percentiles: Sequence[float] = DEFAULT_PERCENTILES,
) -> dict[str, Any]:
    """Aggregates with ``vllm bench serve``'s names and definitions."""
    ok = [r for r in records if r.success]
    total_in = sum(r.prompt_len for r in ok)
    total_out = sum(r.output_tokens for r in ok)
    ttfts = [r.ttft for r in ok]
    tpots = [r.tpot for r in ok if r.output_tokens > 1]
    itls = [x for r in ok for x in r.itl]
    e2els = [r.latency for r in ok]
    dur = max(duration, 1e-9)
    m: dict[str, Any] = {
        "duration": duration,
        "completed": len(ok),
        "failed": len(records) - len(ok),
        # requests whose stream was cut and continued (Bench(resume=N)): completed or not
        "resumed_requests": sum(1 for r in records if r.resumed),
        # requests the client read late, all at once (RequestRecord.read_in_one_piece)
        "read_in_one_piece": sum(1 for r in ok if r.read_in_one_piece),
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": len(ok) / dur,
        "request_goodput": None,
        "output_throughput": total_out / dur,
        "total_token_throughput": (total_in + total_out) / dur,
    }
    if slo:
        limits = {k: v / 1000.0 for k, v in slo.items()}
        good = sum(
            1
            for r in ok
            if all(
                {"ttft": r.ttft, "tpot": r.tpot, "e2el": r.latency}[k] <= lim
                for k, lim in limits.items()
            )
        )
        m["good_completed"] = good
        m["request_goodput"] = good / dur
    for name, values in (("ttft", ttfts), ("tpot", tpots), ("itl", itls), ("e2el", e2els)):
        m.update(_stats(values, name, percentiles))
    return m


def records_from(result: BenchResult) -> list[RequestRecord]:
    """The per-request records of a saved result."""
    return [RequestRecord(**r) for r in result.requests]


def summary_lines(run: BenchResult) -> list[str]:
    """The human summary, laid out like ``vllm bench serve``'s."""
    w = 40
    lines = [
        " Serving Benchmark Result ".center(50, "="),
        f"{'Successful requests:':<{w}}{run.completed}",
        f"{'Failed requests:':<{w}}{run.failed}",
    ]
    if run.resumed_requests:
        lines.append(f"{'Resumed requests (cut, continued):':<{w}}{run.resumed_requests}")
    if run.max_concurrency:
        lines.append(f"{'Maximum request concurrency:':<{w}}{run.max_concurrency}")
    lines += [
        f"{'Benchmark duration (s):':<{w}}{_n(run.duration):.2f}",
        f"{'Total input tokens:':<{w}}{run.total_input_tokens}",
        f"{'Total generated tokens:':<{w}}{run.total_output_tokens}",
        f"{'Request throughput (req/s):':<{w}}{_n(run.request_throughput):.2f}",
    ]
    if run.request_goodput is not None:
        lines.append(f"{'Request goodput (req/s):':<{w}}{run.request_goodput:.2f}")
    lines += [
        f"{'Output token throughput (tok/s):':<{w}}{_n(run.output_throughput):.2f}",
        f"{'Total token throughput (tok/s):':<{w}}{_n(run.total_token_throughput):.2f}",
    ]
    keys = list(run.to_json())  # every figure's name, the percentiles asked for among them
    for name, title in (
        ("ttft", "Time to First Token"),
        ("tpot", "Time per Output Token (excl. 1st token)"),
        ("itl", "Inter-token Latency"),
        ("e2el", "End-to-end Latency"),
    ):
        lines.append(title.center(50, "-"))
        for key in sorted((k for k in keys if k.endswith(f"_{name}_ms")), key=_stat_order):
            label = key.split("_")[0]
            label = {"mean": "Mean", "median": "Median", "std": "Std"}.get(label, label.upper())
            lines.append(f"{label + ' ' + name.upper() + ' (ms):':<{w}}{_n(run.figure(key)):.2f}")
    if run.ended_early:
        lines.append(f"ended early: {run.ended_early}")
    late = run.read_in_one_piece or 0
    if late:
        lines.append(
            f"warning: {late} of {run.completed} requests were read in one piece: this "
            "client got no CPU while their tokens streamed (the server's threads take the "
            "cores?), so their TTFT and ITL are its delay, not the server's; leave the client a "
            "core (VLLM_CPU_OMP_THREADS_BIND, a fleet instance's cpus) or run it elsewhere"
        )
    lines.append("=" * 50)
    return lines


def _n(value: Any) -> float:
    """A figure to format: NaN where the run has none."""
    return float(value) if isinstance(value, int | float) else math.nan


def _stat_order(key: str) -> tuple[int, float]:
    head = key.split("_")[0]
    order = {"mean": 0, "median": 1, "std": 2}
    if head in order:
        return order[head], 0.0
    return 3, float(head[1:])
