"""A tuning space: which launch settings a tune varies, and how ``--space`` items read.

One rule says which knobs are tuned (:func:`untuned_reason`): every knob of the groups that
change how the engine serves the model (cache, scheduler, performance, compilation, parallel)
and the model's dtype and max_model_len, but no secret and no setting of Quantdeck's own. A knob
added to the schema in one of those groups is tunable without a word here.

An item is ``KNOB=V1,V2`` (each value read as the knob's command-line option reads it: numbers,
``true``/``false``, a choice, ``auto`` or ``none`` for unset, ``ngram:K`` or a JSON object for
speculative decoding, ``[1,2,4]`` for a list), or ``vllm:NAME=V1,V2`` for another option of the
engine (a point sets ``extra_args[NAME]``, as ``--vllm-arg NAME=VALUE`` does; ``true``/``false``
turn a switch on or off). The ``vllm:`` prefix keeps the engine's names apart from the knobs':
a mistyped knob is refused here, not taken for an engine option that fails at its start, and a
saved run's space can be given back to ``--space`` as it is. Values are split at commas outside
brackets and quotes, so a JSON object is one value. A knob named twice is refused, never
dropped.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any

from quantdeck.core.errors import ConfigError
from quantdeck.core.launch import (
    DeviceFacts,
    LaunchConfig,
    check_value,
    parse_text,
    validate,
)
from quantdeck.core.launch import engine_args as ea
from quantdeck.core.launch.knobs import Knob, iter_knobs, knob_by_name, managed_options

ENGINE_PREFIX = "vllm:"  # a space's name for an engine option: vllm:NAME (``--vllm-arg NAME``)

# The groups whose knobs change how the engine serves the model it serves: the KV cache and
# memory, batching, the performance levers, compilation and CUDA graphs, the spread over GPUs.
TUNED_GROUPS = ("cache", "scheduler", "performance", "compilation", "parallel")
# Of the model group, the two that change how the same model is served; the others pick the
# model or how it loads (path, served name, quantization, load format, remote code), or change
# what it answers or offers, not how fast (seed, sleep mode).
TUNED_MODEL_KNOBS = ("dtype", "max_model_len")
# Why the other groups are not: what is served, or where and how clients reach it.
_UNTUNED_GROUPS = {
    "model": "it says which model is served, how it loads or what it answers, not how it is "
    "served (of the model's settings, dtype and max_model_len are tuned)",
    "lora": "it says which adapters are served, not how fast",
    "server": "it says where and how clients reach the server, not how the engine serves",
}
HINT = "or vllm:NAME=V1,V2 for another option of the engine (`quantdeck engines options`)"


def untuned_reason(k: Knob) -> str | None:
    """Why knob ``k`` is never in a tuning space; None: it is tunable."""
    if k.quantdeck_only:  # kv_events, ray_address, ...: vLLM never gets them
        return "it is Quantdeck's own setting: vLLM never gets it"
    if k.secret_env:
        return "it is a secret: it changes nothing measured"
    if k.group in TUNED_GROUPS or (k.group == "model" and k.name in TUNED_MODEL_KNOBS):
        return None
    return _UNTUNED_GROUPS.get(k.group, f"the {k.group} settings are not tuned")


@lru_cache(maxsize=1)
def tunable_knobs() -> dict[str, Knob]:
    """The knobs a space may vary, by name, in the schema's order."""
    return {k.name: k for k in iter_knobs() if untuned_reason(k) is None}


def engine_option(key: str) -> str | None:
    """The engine option a space key names (``vllm:NAME`` -> ``NAME``), None for a knob."""
    return key[len(ENGINE_PREFIX) :] if key.startswith(ENGINE_PREFIX) else None


def check_key(key: str) -> None:
    """Raise ConfigError unless ``key`` is a knob a space may vary or ``vllm:NAME``."""
    if engine_option(key) is None and key not in tunable_knobs():
        raise ConfigError(f"tune: '{key}' is not a tunable knob ({_choices()})")


def space_value(cfg: LaunchConfig, key: str) -> Any:
    """The value of space key ``key`` in ``cfg`` (an engine option not set: None)."""
    name = engine_option(key)
    if name is not None:
        return cfg.extra_args.get(name)
    check_key(key)
    return tunable_knobs()[key].get(cfg)


def apply_point(base: LaunchConfig, point: Mapping[str, Any]) -> LaunchConfig:
    """``base`` with the point's values set (an engine option's None: left out), checked."""
    cfg = base.copy()
    for key, value in point.items():
        name = engine_option(key)
        if name is None:
            check_key(key)
            tunable_knobs()[key].set(cfg, value)
        elif value is None:
            cfg.extra_args.pop(name, None)
        else:
            cfg.extra_args[name] = value
    return validate(cfg)


def default_space(device: DeviceFacts, concurrency: int | None) -> dict[str, list[Any]]:
    """Candidate values sized to the load: max_num_seqs around the offered concurrency."""
    c = concurrency or 64
    seqs = sorted({max(1, c // 4), max(1, c // 2), c, c * 2} | ({256} if device.is_cuda else set()))
    space: dict[str, list[Any]] = {
        "max_num_seqs": seqs,
        "max_num_batched_tokens": [2048, 8192] if device.is_cuda else [512, 2048],
        "enable_chunked_prefill": [True, False],
    }
    if device.is_cuda:
        space["block_size"] = [16, 32]
        space["gpu_memory_utilization"] = [0.85, 0.92]
    return space


def parse_space(
    items: Iterable[str] | None, device: DeviceFacts, concurrency: int | None
) -> dict[str, list[Any]]:
    """The space of ``KNOB=V1,V2`` and ``vllm:NAME=V1,V2`` items (the module's docstring says
    how each reads), in their order; none: :func:`default_space`. A knob named twice (in one
    ``--space`` or across several, or two lines of the GUI's box) is refused, as is a value
    given twice for one knob."""
    items = list(items or [])
    if not items:
        return default_space(device, concurrency)
    space: dict[str, list[Any]] = {}
    for item in items:
        raw, sep, text = item.partition("=")
        raw = raw.strip()
        if not sep:
            raise ConfigError(
                f"--space {item!r}: expected KNOB=V1,V2 with KNOB one of {_choices()}, {HINT}"
            )
        if raw.startswith(ENGINE_PREFIX):
            key, values = _engine_values(raw[len(ENGINE_PREFIX) :], text)
        else:
            key = _knob(raw, item).name
            values = [_knob_value(tunable_knobs()[key], v) for v in split_values(text)]
        if key in space:
            raise ConfigError(
                f"--space {item!r}: {key} is given twice: give all its values at once ({key}=V1,V2)"
            )
        for a, b in itertools.combinations(values, 2):
            if repr(a) == repr(b):
                raise ConfigError(f"--space {key}: the value {text_of(a)} is given twice")
        space[key] = values
    return space


def text_of(value: Any) -> str:
    """A candidate value as a space item writes it."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        return json.dumps(value, separators=(",", ":"))
    return "none" if value is None else str(value)


def split_values(text: str) -> list[str]:
    """``text`` split at the commas outside brackets, braces and quotes, each part stripped."""
    parts, depth, quote, start = [], 0, "", 0
    for i, c in enumerate(text):
        if quote:
            quote = "" if c == quote and text[i - 1] != "\\" else quote
        elif c in "\"'":
            quote = c
        elif c in "[{":
            depth += 1
        elif c in "]}":
            depth = max(0, depth - 1)
        elif c == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    parts.append(text[start:].strip())
    return parts


def _choices() -> str:
    return "KNOB one of " + ", ".join(tunable_knobs())


def _knob(raw: str, item: str) -> Knob:
    """The tunable knob ``raw`` names (its name, ``group.name`` or its flag's name)."""
    k: Knob | None = None
    for name in (raw, raw.replace("-", "_")):
        try:
            k = knob_by_name(name)
            break
        except ConfigError:
            continue
    if k is None:
        raise ConfigError(f"--space {item!r}: expected KNOB=V1,V2 with {_choices()}, {HINT}")
    why = untuned_reason(k)
    if why is not None:
        raise ConfigError(f"--space {item!r}: {k.key} is not tuned: {why}; {_choices()}, {HINT}")
    return k


def _knob_value(k: Knob, text: str) -> Any:
    """One candidate of knob ``k``, as its command-line option reads it, checked."""
    if k.base is list and text.startswith("[") and text.endswith("]"):
        text = text[1:-1]
    try:
        value = parse_text(k, text)
        check_value(k, value)
        if k.to_vllm is not None and value is not None:
            k.to_vllm(value)
    except ConfigError as e:
        raise ConfigError(f"--space {k.name}: {e}") from None
    return value


def _engine_values(raw: str, text: str) -> tuple[str, list[Any]]:
    """``vllm:NAME=V1,V2``'s key and values: the name as ``--vllm-arg`` spells it, each value
    read as ``--vllm-arg NAME=VALUE`` reads it (``true``/``false``: the switch on or off). A
    flag Quantdeck sets itself is refused, naming the knob to tune instead; so is a secret."""
    where = f"--space {ENGINE_PREFIX}{raw.strip()}"
    name = ea.canonical_name(raw, where)
    key = ENGINE_PREFIX + name
    where = f"--space {key}"
    managed = managed_options()
    flag = name[3:] if name.startswith("no-") and name[3:] in managed else name
    if flag in managed:
        k = next((k for k in iter_knobs() if k.flag == "--" + flag), None)
        if k is not None and untuned_reason(k) is None:
            raise ConfigError(
                f"{where}: Quantdeck sets --{flag} itself, from {k.key}: tune that knob "
                f"({k.name}=V1,V2)"
            )
        raise ConfigError(f"{where}: Quantdeck sets --{flag} itself: {managed[flag]}")
    if name in ea.SECRET_ENVS:
        raise ConfigError(f"{where}: a secret is not tuned: it changes nothing measured")
    values: list[Any] = []
    for v in split_values(text):
        if not v:
            raise ConfigError(f"{where}: an empty value (give each value, e.g. {key}=1,2)")
        value: Any
        if v.lower() in ("true", "false"):
            value = v.lower() == "true"
        else:
            value = ea.parse_cli_arg(f"{name}={v}")[1]
        try:
            ea.check_names({name: value}, managed)
        except ConfigError as e:
            raise ConfigError(f"{where}: {e}") from None
        values.append(value)
    return key, values
