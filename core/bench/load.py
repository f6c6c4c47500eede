"""What a benchmark sends: the load (:class:`LoadSpec`), the SLO limits, the requests and
the record each request leaves."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from quantdeck.core.errors import ConfigError

SLO_KEYS = ("ttft", "tpot", "e2el")
DEFAULT_PERCENTILES = (50.0, 90.0, 99.0)
DATASETS = ("corpus", "random")


@dataclass(frozen=True)
class LoadSpec:
    """What to send. Exactly one prompt source: synthetic prompts of ``input_len`` tokens
    (``dataset``), a JSONL file or ShareGPT."""

    num_prompts: int = 64
    input_len: int = 128
    output_len: int = 128
    concurrency: int | None = None  # at most this many in flight (None: unbounded)
    request_rate: float = math.inf  # Poisson arrivals per s (inf: all at once)
    burstiness: float = 1.0  # gamma shape of inter-arrival times (1: Poisson)
    prompts_file: str | None = None  # JSONL: {"prompt": str, "output_len"?: int}
    sharegpt: str | None = None  # ShareGPT JSON: first human turn, reply length as output
    # synthetic prompts: "corpus" (windows of English text) or "random" (runs of consecutive
    # token ids from random offsets, as vllm bench serve's random dataset sends)
    dataset: str = "corpus"
    tokenizer: str | None = None  # "random": the tokenizer's folder (default: the model's)
    warmups: int = 1  # requests before the measured run, not counted
    ignore_eos: bool = True
    temperature: float | None = None  # None: the server's default, as vllm bench serve
    seed: int = 0
    request_timeout_s: float = 600.0

    def check(self) -> None:
        if self.num_prompts < 1:
            raise ConfigError("--num-prompts must be at least 1")
        if self.input_len < 1 or self.output_len < 1:
            raise ConfigError("--input-len and --output-len must be at least 1")
        if self.concurrency is not None and self.concurrency < 1:
            raise ConfigError("--concurrency must be at least 1")
        if not self.request_rate > 0:
            raise ConfigError("--request-rate must be > 0 (inf: all at once)")
        if not 0 < self.burstiness < math.inf:
            raise ConfigError("--burstiness must be a number > 0")
        if self.warmups < 0:
            raise ConfigError("--warmups must be 0 or more")
        if self.seed < 0:
            raise ConfigError("--seed / --load-seed must be 0 or more")
        if self.temperature is not None and not 0 <= self.temperature < math.inf:
            raise ConfigError("--temperature must be a number >= 0")
        if not 0 < self.request_timeout_s < math.inf:
            raise ConfigError("the request timeout must be a number of seconds > 0")
        if self.prompts_file and self.sharegpt:
            raise ConfigError("give --prompts-file or --sharegpt, not both")
        if self.dataset not in DATASETS:
            raise ConfigError(f"--dataset-name {self.dataset!r}: one of {', '.join(DATASETS)}")
        if self.dataset != "corpus" and (self.prompts_file or self.sharegpt):
            raise ConfigError(
                f"--dataset-name {self.dataset} makes its own prompts: not with "
                "--prompts-file or --sharegpt"
            )
        for f in (self.prompts_file, self.sharegpt):
            if f and not Path(f).is_file():
                raise ConfigError(f"{f}: no such file")


def parse_slo(
    items: Sequence[str] | None = None,
    *,
    ttft: float | None = None,
    tpot: float | None = None,
    e2el: float | None = None,
) -> dict[str, float]:
    """SLO limits in ms from ``KEY:MS`` items (as ``vllm bench serve --goodput``) and flags."""
    slo: dict[str, float] = {}
    if items is not None and not items:
        raise ConfigError("--goodput needs limits: KEY:MS with KEY one of ttft, tpot, e2el")
    for item in items or ():
        key, sep, value = item.partition(":")
        if not sep or key not in SLO_KEYS:
            raise ConfigError(
                f"--goodput {item!r}: expected KEY:MS with KEY one of " + ", ".join(SLO_KEYS)
            )
        try:
            slo[key] = float(value)
        except ValueError:
            raise ConfigError(f"--goodput {item!r}: {value!r} is not a number") from None
    for key, flag in (("ttft", ttft), ("tpot", tpot), ("e2el", e2el)):
        if flag is not None:
            slo[key] = float(flag)
    for key, limit in slo.items():
        if not limit > 0:
            raise ConfigError(f"SLO {key} must be > 0 ms")
    return slo


@dataclass
class Request:
    prompt: str | list[int]
    prompt_len: int
    output_len: int


@dataclass
class RequestRecord:
    """One request's measurements (seconds, as vLLM's RequestFuncOutput)."""

    index: int
    prompt_len: int
    output_len: int  # asked for
    success: bool = False
    error: str = ""
    start_time: float = 0.0  # since the run's start
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    latency: float = 0.0
    output_tokens: int = 0
    generated_text: str = ""
    resumed: int = 0  # times its stream was cut and continued (Bench(resume=N))

    @property
    def tpot(self) -> float:
        return (
            (self.latency - self.ttft) / (self.output_tokens - 1) if self.output_tokens > 1 else 0.0
        )
