"""What a benchmark sends: the load (:class:`LoadSpec`), the SLO limits, the requests and
the record each request leaves."""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any, Literal

from quantdeck.core.errors import ConfigError
from quantdeck.core.fields import Setting, add_option, declared, is_a, option_words, setting

DEFAULT_PERCENTILES = (50.0, 90.0, 99.0)
Dataset = Literal["corpus", "random"]


@dataclass(frozen=True)
class LoadSpec:
    """What to send. Exactly one prompt source: synthetic prompts of ``input_len`` tokens
    (``dataset``), a JSONL file or ShareGPT.

    Each field is declared once, here: :func:`load_fields` walks them into the CLI options of
    every command that sends a load (:func:`add_load_options`), into the checks of
    :meth:`check` and, in ``gui/``, into the Benchmark tab's form."""

    concurrency: int | None = setting(
        None,
        "Fixed number of requests in flight.",
        ge=1,
        auto="unbounded",
        extra={"exclusive": "arrivals"},
    )
    request_rate: float = setting(
        math.inf,
        "Poisson arrivals per second.",
        gt=0,
        inf=True,
        auto="all at once",
        unit="req/s",
        metavar="R",
        extra={"exclusive": "arrivals"},
    )
    burstiness: float = setting(
        1.0, "Gamma shape of the arrival gaps (1: Poisson, < 1: burstier).", gt=0, advanced=True
    )
    num_prompts: int = setting(64, "Requests measured.", ge=1, title="Prompts")
    input_len: int = setting(
        128, "Prompt tokens (exact, through the server's tokenizer).", ge=1, title="Input tokens"
    )
    output_len: int = setting(
        128,
        "Tokens asked of each request: max_tokens (with ignore_eos).",
        ge=1,
        title="Output tokens",
    )
    prompts_file: str | None = setting(
        None,
        'Prompts instead of synthetic ones: a JSONL file, {"prompt": ..., "output_len": ...} '
        "per line.",
        metavar="JSONL",
        title="Prompts file",
        auto="none",
        advanced=True,
    )
    sharegpt: str | None = setting(
        None,
        "Prompts from a ShareGPT JSON file: each conversation's first human turn, its reply's "
        "length as the output.",
        metavar="JSON",
        title="ShareGPT file",
        auto="none",
        advanced=True,
    )
    dataset: Dataset = setting(
        "corpus",
        "Synthetic prompts: windows of English text (corpus) or runs of token ids from random "
        "offsets, as vllm bench serve's random dataset (read from the model's tokenizer.json).",
        flag="--dataset-name",
        title="Prompt text",
        choice_titles={"corpus": "English text", "random": "random token ids (as vllm bench)"},
    )
    tokenizer: str | None = setting(
        None,
        "The random dataset's tokenizer folder.",
        metavar="PATH",
        auto="the served model's",
        advanced=True,
    )
    warmups: int = setting(
        1, "Requests sent before the measurement, not counted.", ge=0, advanced=True
    )
    ignore_eos: bool = setting(
        True,
        "Generate every token asked for; --no-ignore-eos stops at the end of sequence.",
        title="Ignore EOS",
        advanced=True,
    )
    temperature: float | None = setting(
        None,
        "Sampling temperature.",
        ge=0,
        auto="server default",
        advanced=True,
    )
    seed: int = setting(
        0,
        "Seed of the prompts and arrival times.",
        ge=0,
        extra={"alias": "--load-seed"},
        advanced=True,
    )
    request_timeout_s: float = setting(
        600.0,
        "Longest wait for a request's next bytes before it counts as failed.",
        gt=0,
        unit="s",
        flag="--request-timeout",
        extra={"what": "the request timeout"},
        title="Request timeout",
        advanced=True,
    )

    def check(self) -> None:
        """Raise ConfigError (one line naming the option) unless the load can be sent."""
        check_fields(self, load_fields())
        if self.prompts_file and self.sharegpt:
            raise ConfigError("give --prompts-file or --sharegpt, not both")
        if self.dataset != "corpus" and (self.prompts_file or self.sharegpt):
            raise ConfigError(
                f"--dataset-name {self.dataset} makes its own prompts: not with "
                "--prompts-file or --sharegpt"
            )
        for f in (self.prompts_file, self.sharegpt):
            if f and not Path(f).is_file():
                raise ConfigError(f"{f}: no such file")


def _slo_limit(key: str, what: str, **common: Any) -> Any:
    """Declare one SLO limit: ``--slo-KEY-ms``, in ms, off by default."""
    return setting(
        None,
        f"{what} of a good request, at most.",
        gt=0,
        unit="ms",
        flag=f"--slo-{key}-ms",
        title=f"SLO {key.upper()} (goodput)",
        auto="off",
        **common,
    )


@dataclass(frozen=True)
class SloLimits:
    """Goodput's latency limits (ms): a request is good when it keeps to every limit set (as
    ``vllm bench serve --goodput``); None: no limit."""

    ttft: float | None = _slo_limit("ttft", "Time to first token")
    tpot: float | None = _slo_limit("tpot", "Time per output token")
    e2el: float | None = _slo_limit("e2el", "End-to-end latency", advanced=True)


SLO_KEYS = tuple(f.name for f in dataclasses.fields(SloLimits))


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


# -- the walk: checks and command-line options -------------------------------------------------


@dataclass(frozen=True)
class LoadField(Setting):
    """One field of the load or of the SLO limits: a :class:`Setting` and how the CLI names
    it, from the ``extra`` of its declaration: ``what``, how an error names it (default: its
    flags); ``alias``, its flag in a command whose launch knobs take the flag (ab, tune: their
    ``--seed`` is the engine's); ``exclusive``, a tag shared by options that cannot be given
    together."""

    what: str
    alias: str | None
    exclusive: str | None

    def flag_in(self, with_knobs: bool) -> str:
        """Its option in a command that does (ab, tune) or does not (bench) take launch knobs."""
        return self.alias if with_knobs and self.alias else self.flag


@cache
def load_fields(cls: type = LoadSpec) -> tuple[LoadField, ...]:
    """The fields of the load (or of :class:`SloLimits`), in declaration order."""
    out = []
    for f, attrs in declared(cls):
        alias, what = f.metadata.get("alias"), f.metadata.get("what")
        what = what or " / ".join(x for x in (attrs["flag"], alias) if x)
        out.append(
            LoadField(**attrs, what=what, alias=alias, exclusive=f.metadata.get("exclusive"))
        )
    return tuple(out)


_UNIT_WORDS = {"s": "seconds", "ms": "milliseconds"}


def field_problem(f: LoadField, value: Any) -> str | None:
    """What is wrong with ``value`` for ``f``, as the end of a sentence that starts with
    ``f.what`` ("must be 1 or more"); None: nothing."""
    if value is None:
        return None if f.optional else "needs a value"
    if f.choices is not None:
        allowed = ", ".join(map(str, f.choices))
        return None if value in f.choices else f"{value!r}: one of {allowed}"
    if f.base in (bool, str):
        return None if is_a(f.base, value) else f"must be {f.base.__name__}"
    if (
        is_a(f.base, value)
        and (math.isfinite(value) or (f.inf and value == math.inf))
        and (f.ge is None or value >= f.ge)
        and (f.gt is None or value > f.gt)
        and (f.le is None or value <= f.le)
    ):
        return None
    bounds = [f"{op} {b:g}" for op, b in ((">=", f.ge), (">", f.gt), ("<=", f.le)) if b is not None]
    if f.base is int and f.ge is not None and f.le is None:
        return f"must be {f.ge:g} or more"
    if f.inf:
        return f"must be {' and '.join(bounds)} (inf: {f.auto})"
    unit = f" of {_UNIT_WORDS[f.unit]}" if f.unit in _UNIT_WORDS else ""
    return " ".join([f"must be a number{unit}", " and ".join(bounds)]).strip()


def check_fields(obj: Any, fields: Sequence[LoadField]) -> None:
    """Raise ConfigError, one line naming the option, at the first field out of its bounds."""
    for f in fields:
        problem = field_problem(f, f.get(obj))
        if problem:
            raise ConfigError(f"{f.what} {problem}")


_DEST = {LoadSpec: "load:", SloLimits: "slo:"}


def add_load_options(
    p: argparse.ArgumentParser, *, with_knobs: bool = False, slo: bool = True
) -> None:
    """The options of a command that sends a load, one per field of :class:`LoadSpec` and,
    with ``slo``, of :class:`SloLimits` (and ``--goodput``, as vllm bench serve takes them).
    ``with_knobs``: the command takes the launch knobs too (a field's alias replaces a flag
    the knobs have). Values are parsed here and checked by :meth:`LoadSpec.check`."""
    groups = [("load", LoadSpec)] + ([("SLO (goodput)", SloLimits)] if slo else [])
    for title, cls in groups:
        g = p.add_argument_group(title)
        exclusive: dict[str, argparse._MutuallyExclusiveGroup] = {}
        for f in load_fields(cls):
            if f.exclusive is not None and f.exclusive not in exclusive:
                exclusive[f.exclusive] = g.add_mutually_exclusive_group()
            add_option(
                g if f.exclusive is None else exclusive[f.exclusive],
                f,
                dest=_DEST[cls] + f.name,
                flag=f.flag_in(with_knobs),
                help=f"{f.doc} [{f.default_text}]",
                check=False,
            )
    if slo:
        g.add_argument(
            "--goodput",
            nargs="*",
            metavar="KEY:MS",
            help="as vllm bench serve: ttft:MS tpot:MS e2el:MS",
        )


def _given(ns: argparse.Namespace, cls: type) -> dict[str, Any]:
    given = vars(ns)
    return {f.name: given[key] for f in load_fields(cls) if (key := _DEST[cls] + f.name) in given}


def load_from_options(ns: argparse.Namespace) -> LoadSpec:
    """The load that :func:`add_load_options`' options ask for (unchecked)."""
    return LoadSpec(**_given(ns, LoadSpec))


def slo_from_options(ns: argparse.Namespace) -> dict[str, float]:
    """The SLO limits the options ask for, checked (:func:`parse_slo`)."""
    return parse_slo(getattr(ns, "goodput", None), **_given(ns, SloLimits))


def load_args(spec: LoadSpec | SloLimits, *, with_knobs: bool = False) -> list[str]:
    """The options that ask for ``spec`` (a load or SLO limits): its fields off their
    defaults, as :func:`add_load_options` reads them."""
    cls: type = type(spec)
    return [
        word
        for f in load_fields(cls)
        if (value := f.get(spec)) != f.default
        for word in option_words(f, value, f.flag_in(with_knobs))
    ]


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
    def read_in_one_piece(self) -> bool:
        """Its tokens (8 or more) all read within 1 ms, though it took 20 ms or more: vLLM
        sends one event per token as it decodes, so the client read them late (it got no CPU
        while they came: on a host whose cores the server's threads take). Its TTFT and ITL
        are then the client's delay, not the server's (benchmarks/stream_chunks.py)."""
        return len(self.itl) >= 7 and sum(self.itl) < 0.001 and self.latency >= 0.02

    @property
    def tpot(self) -> float:
        return (
            (self.latency - self.ttft) / (self.output_tokens - 1) if self.output_tokens > 1 else 0.0
        )
