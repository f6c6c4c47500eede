"""One walker over the launch settings of :mod:`quantdeck.core.launch.config`.

From the field declarations alone it produces: the ``vllm serve`` argument list, the YAML that
``vllm serve --config FILE`` reads (Quantdeck's profile format), the ``quantdeck`` CLI options
and (in ``gui/``) the form widgets. Nothing here lists knobs by hand.

The engine's other options (``LaunchConfig.extra_args``, :mod:`.engine_args`) ride along: the
``--vllm-arg NAME=VALUE`` option, a profile's ``vllm-args:`` mapping (top level in the YAML for
vLLM), after the curated flags in the argument list; :func:`for_engine` checks them and the knobs
against one engine before anything starts.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from quantdeck.core.errors import ConfigError
from quantdeck.core.fields import (
    Setting,
    add_option,
    check_value,
    declared,
    option_words,
    parse_text,
)
from quantdeck.core.launch import engine_args as ea
from quantdeck.core.launch.config import GROUPS, LaunchConfig
from quantdeck.core.launch.ray import check_address
from quantdeck.core.schema import load_json, load_yaml, shown

COMPILATION_PREFIX = "--compilation-config."
MASK = "***"  # what a secret shows as wherever a command or config is shown


@dataclass(frozen=True)
class Knob(Setting):
    """One launch setting: a :class:`Setting` with its group and vLLM's side of it."""

    group: str
    vllm_default: Any
    positional: bool
    secret_env: str | None  # a secret, passed to vLLM in this environment variable
    quantdeck_only: bool  # never passed to vLLM
    to_vllm: Callable[[Any], Any] | None  # the value as vLLM takes it (text -> JSON object)

    @property
    def key(self) -> str:
        """The ``group.name`` path used in error messages and CLI dests."""
        return f"{self.group}.{self.name}"

    @property
    def secret(self) -> bool:
        return self.secret_env is not None

    @property
    def default_text(self) -> str:
        return f"vLLM default: {self.vllm_default}"

    @property
    def yaml_key(self) -> str:
        """The key in a ``vllm serve --config`` YAML file: the flag without dashes."""
        return self.flag[2:]

    def get(self, cfg: LaunchConfig) -> Any:
        return getattr(getattr(cfg, self.group), self.name)

    def set(self, cfg: LaunchConfig, value: Any) -> None:
        setattr(getattr(cfg, self.group), self.name, value)


@lru_cache(maxsize=1)
def iter_knobs() -> tuple[Knob, ...]:
    """Every launch setting, in declaration order, group by group."""
    out = [
        Knob(
            **attrs,
            group=group,
            vllm_default=f.metadata["vllm_default"],
            positional=f.metadata["positional"],
            secret_env=f.metadata["secret_env"],
            quantdeck_only=f.metadata["quantdeck_only"],
            to_vllm=f.metadata["to_vllm"],
        )
        for group, cls in GROUPS.items()
        for f, attrs in declared(cls)
    ]
    names = [k.name for k in out]
    dup = {n for n in names if names.count(n) > 1}
    if dup:
        raise TypeError(f"knob names must be unique across groups: {sorted(dup)}")
    return tuple(out)


def knob_by_name(name: str) -> Knob:
    for k in iter_knobs():
        if name in (k.name, k.key, k.yaml_key):
            return k
    raise ConfigError(f"unknown setting '{name}'")


@lru_cache(maxsize=1)
def managed_options() -> dict[str, str]:
    """vLLM's options that Quantdeck sets itself (name without dashes -> what to use instead):
    every knob's flag, and the flags of :data:`.engine_args.OWN_FLAGS`. ``--compilation-config``
    is not one: a JSON object given for it is merged with the CUDA-graph knobs."""
    out: dict[str, str] = {}
    for k in iter_knobs():
        if k.quantdeck_only or k.flag.startswith(COMPILATION_PREFIX):
            continue
        if k.positional:
            out["model"] = f"the model is the PATH argument ({k.key})"
            continue
        hint = f"use its setting {k.key} ({k.flag})"
        if k.secret_env:
            hint += f", which reaches vLLM in {k.secret_env}, never on its command line"
        out[k.flag[2:]] = hint
    out.update(ea.OWN_FLAGS)
    return out


# -- values ---------------------------------------------------------------------------------


def validate(cfg: LaunchConfig) -> LaunchConfig:
    """Check bounds, choices and contradictions between knobs; raise ConfigError."""
    for k in iter_knobs():
        check_value(k, k.get(cfg))
    m, s, lo, p = cfg.model, cfg.scheduler, cfg.lora, cfg.parallel
    if (
        s.max_num_batched_tokens is not None
        and s.max_num_seqs is not None
        and s.max_num_batched_tokens < s.max_num_seqs
    ):
        raise ConfigError(
            f"scheduler.max_num_batched_tokens ({s.max_num_batched_tokens}) is smaller than "
            f"scheduler.max_num_seqs ({s.max_num_seqs}): every sequence needs a token per "
            "step"
        )
    if (
        s.enable_chunked_prefill is False
        and s.max_num_batched_tokens is not None
        and m.max_model_len is not None
        and s.max_num_batched_tokens < m.max_model_len
    ):
        raise ConfigError(
            f"scheduler.max_num_batched_tokens ({s.max_num_batched_tokens}) is smaller than "
            f"model.max_model_len ({m.max_model_len}) with chunked prefill off: a long "
            "prompt could never be scheduled"
        )
    if (
        s.max_num_active_seqs is not None
        and s.max_num_seqs is not None
        and s.max_num_active_seqs > s.max_num_seqs
    ):
        raise ConfigError(
            f"scheduler.max_num_active_seqs ({s.max_num_active_seqs}) exceeds "
            f"scheduler.max_num_seqs ({s.max_num_seqs})"
        )
    for k in iter_knobs():
        _check_text(k, k.get(cfg))
        if k.to_vllm is not None and k.get(cfg) is not None:
            k.to_vllm(k.get(cfg))
    ea.check_names(cfg.extra_args, managed_options())
    if not lo.enable_lora and lo.lora_modules:
        raise ConfigError("lora.lora_modules is set but lora.enable_lora is off")
    for spec in lo.lora_modules:
        _check_lora(spec)
    if (
        p.tensor_parallel_size * p.pipeline_parallel_size > 1
        and p.distributed_executor_backend == "uni"
    ):
        raise ConfigError(
            "parallel.distributed_executor_backend 'uni' runs one process: "
            "it cannot serve tensor or pipeline parallel > 1"
        )
    if p.ray_address is not None:
        problem = check_address(p.ray_address)
        if problem:
            raise ConfigError(f"parallel.ray_address: {problem}")
    if cfg.cache.kv_events and cfg.cache.enable_prefix_caching is False:
        raise ConfigError(
            "cache.kv_events: vLLM publishes KV events from its prefix cache, which "
            "cache.enable_prefix_caching turns off"
        )
    if m.model == "":
        raise ConfigError("model.model: no model path given")
    return cfg


def _check_text(k: Knob, value: Any) -> None:
    """Every text value must reach vLLM as the one value it is: no control characters (a
    newline or NUL splits or ends it on its way), and a value that stands alone as an argv word
    (the model, a list item) never starts with '-', where vLLM's parser would read an option."""
    if isinstance(value, str):
        words = [value]
    elif k.base is list and k.item is str and value:
        words = value
    else:
        return
    for w in words:
        what = "the value" if k.secret_env else shown(w)
        if any(unicodedata.category(c) in ("Cc", "Zl", "Zp") for c in w):
            raise ConfigError(f"{k.key}: {what} holds a control character or line break")
        if (k.positional or k.base is list) and w.startswith("-"):
            raise ConfigError(f"{k.key}: {what} starts with '-' and would read as an option")


_LORA_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


def _check_lora(spec: str) -> None:
    """A ``lora_modules`` entry is NAME=PATH with a plain name and an existing adapter folder;
    vLLM reads anything else as JSON, which a shared profile could fill with its own fields."""
    name, sep, path = spec.partition("=")
    where = "lora.lora_modules"
    if not sep or not name or not path:
        raise ConfigError(f"{where}: {shown(spec)} is not NAME=PATH")
    if not _LORA_NAME.fullmatch(name):
        raise ConfigError(
            f"{where}: adapter name {shown(name)}: use up to 64 letters, digits, '.', '_' or '-'"
        )
    if "," in path:
        raise ConfigError(f"{where}: adapter path {shown(path)} holds ',' (vLLM would read JSON)")
    if not Path(path).is_absolute() or not Path(path).is_dir():
        raise ConfigError(f"{where}: adapter path {shown(path)} is not an existing absolute folder")


def _coerce(k: Knob, value: Any, where: str) -> Any:
    """A value read from YAML: accept what YAML types as the knob's type."""
    if isinstance(value, str) and k.base is not str:
        return parse_text(k, value)
    if k.to_vllm is not None and isinstance(value, dict):  # vLLM's JSON object, as YAML nests it
        value = json.dumps(value, separators=(",", ":"))
    if k.base is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if k.base is list and k.item is int and isinstance(value, int):
        value = [value]
    try:
        check_value(k, value)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None
    return value


# -- vllm serve arguments -------------------------------------------------------------------


def _changed(k: Knob, cfg: LaunchConfig) -> bool:
    return k.get(cfg) != k.vllm_default and not k.positional


def _vllm_value(k: Knob, v: Any) -> Any:
    return k.to_vllm(v) if k.to_vllm is not None and v is not None else v


def _curated(
    cfg: LaunchConfig, supported: set[str] | None, label: str
) -> tuple[list[str], dict[str, Any]]:
    """The knobs' ``vllm serve`` words, and the ``--compilation-config`` keys they set."""
    args: list[str] = []
    compilation: dict[str, Any] = {}
    for k in iter_knobs():
        if not _changed(k, cfg) or k.secret_env or k.quantdeck_only:
            continue
        v = k.get(cfg)
        _check_text(k, v)
        if k.flag.startswith(COMPILATION_PREFIX):
            compilation[k.flag[len(COMPILATION_PREFIX) :]] = v
            continue
        if supported is not None and k.flag not in supported:
            raise ConfigError(f"{k.key}: {label} has no {k.flag} option")
        v = _vllm_value(k, v)
        if isinstance(v, dict):
            args.append(f"{k.flag}={json.dumps(v, separators=(',', ':'))}")
        else:
            args.extend(option_words(k, v))
    return args, compilation


def _merged_compilation(cfg: LaunchConfig, compilation: dict[str, Any]) -> dict[str, Any]:
    """The knobs' compilation keys over a ``compilation-config`` object among the extra
    arguments (a key both set is refused: the knob is the one to use)."""
    given = cfg.extra_args.get("compilation-config")
    if given is None:
        return compilation
    if isinstance(given, str):
        given = load_json(given, f"{ea.SECTION}.compilation-config")
    if not isinstance(given, dict):
        raise ConfigError(f"{ea.SECTION}.compilation-config: expected a JSON object")
    for key in compilation:
        if key in given:
            k = knob_by_name(COMPILATION_PREFIX[2:] + key)
            raise ConfigError(
                f"{ea.SECTION}.compilation-config: sets {key}, which Quantdeck sets from "
                f"{k.key}: use that setting ({k.flag})"
            )
    return {**given, **compilation}


def _extra(cfg: LaunchConfig) -> dict[str, Any]:
    """The extra arguments that go on vLLM's command line (secrets go in its environment)."""
    return {
        n: v
        for n, v in cfg.extra_args.items()
        if not ea.is_secret(n, v) and n != "compilation-config"
    }


def for_engine(cfg: LaunchConfig, engine: ea.EngineOptions) -> LaunchConfig:
    """``cfg`` checked against one engine before anything starts: every changed knob's flag
    exists there, and the extra arguments pass :func:`.engine_args.check_against` (returned
    in their kinds' types). Each refusal is one ConfigError line naming the engine and its
    vLLM version (``engine.label``)."""
    out = cfg.copy()
    out.extra_args = ea.check_against(cfg.extra_args, engine, managed_options())
    supported = set(engine.options)
    _, compilation = _curated(out, supported, engine.label)
    if (compilation or "compilation-config" in out.extra_args) and (
        "--compilation-config" not in supported
    ):
        raise ConfigError(f"compilation: {engine.label} has no --compilation-config option")
    return out


def vllm_args(
    cfg: LaunchConfig,
    *,
    supported: set[str] | None = None,
    engine: ea.EngineOptions | None = None,
) -> list[str]:
    """The ``vllm serve`` options for ``cfg`` (model path and secrets excluded): only values
    that differ from vLLM's defaults, so an older vLLM is never handed a flag it does not need;
    then the engine's other options (``cfg.extra_args``), as given.

    Each value is one ``--flag=value`` word, so no value can read as a flag of its own; a
    list follows its flag as items that never start with '-' (argparse takes one value after
    ``=``). ``engine``: the target engine's options (:func:`for_engine` checks ``cfg`` against
    them first); ``supported``: only the option strings it accepts. A changed knob the target
    lacks raises ConfigError naming the flag (and the engine).
    """
    label = "this vLLM"
    if engine is not None:
        cfg = for_engine(cfg, engine)
        supported, label = set(engine.options), engine.label
    args, compilation = _curated(cfg, supported, label)
    compilation = _merged_compilation(cfg, compilation)
    if compilation:
        if supported is not None and "--compilation-config" not in supported:
            raise ConfigError(f"compilation: {label} has no --compilation-config option")
        args.append("--compilation-config=" + json.dumps(compilation, separators=(",", ":")))
    for name, value in _extra(cfg).items():
        args.extend(ea.arg_words(name, value))
    return args


def switch_env(cfg: LaunchConfig) -> dict[str, str]:
    """The vLLM switches that live in its environment, not its flags (not secrets)."""
    env: dict[str, str] = {}
    if cfg.lora.allow_runtime_lora_updating:  # the /v1/load_lora_adapter routes
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    if cfg.parallel.ray_address:  # vLLM calls ray.init(address=None), which reads this
        env["RAY_ADDRESS"] = cfg.parallel.ray_address
    if cfg.model.enable_sleep_mode:  # vLLM serves /sleep, /wake_up, /is_sleeping only then
        env["VLLM_SERVER_DEV_MODE"] = "1"
    return env


def vllm_env(cfg: LaunchConfig) -> dict[str, str]:
    """The secrets and :func:`switch_env`, for vLLM's environment. A secret left unset is
    passed empty, so that a ``VLLM_API_KEY`` in the user's own environment cannot make the
    server ask for a key that Quantdeck does not know."""
    secrets = {k.secret_env: k.get(cfg) or "" for k in iter_knobs() if k.secret_env}
    return {**switch_env(cfg), **secrets, **ea.secret_env(cfg.extra_args)}


def serve_command(cfg: LaunchConfig) -> list[str]:
    """The full ``vllm serve MODEL …`` argv (secrets go in the environment: vllm_env)."""
    model = next(k for k in iter_knobs() if k.positional)
    _check_text(model, cfg.model.model)
    return ["vllm", "serve", cfg.model.model, *vllm_args(cfg)]


def command_line(cfg: LaunchConfig) -> str:
    """``serve_command`` as one shell line to show or copy, a secret set as its variable to
    ``***`` in front (the reader puts the key there; the line itself never holds it)."""
    env = [f"{k}={v}" for k, v in switch_env(cfg).items()]
    env += [f"{k.secret_env}={MASK}" for k in iter_knobs() if k.secret_env and k.get(cfg)]
    env += [f"{var}={MASK}" for var in ea.secret_env(cfg.extra_args)]
    return " ".join([*env, shlex.join(serve_command(cfg))])


# -- YAML (profiles and vllm serve --config) -------------------------------------------------


def to_dict(cfg: LaunchConfig, *, for_vllm: bool = False) -> dict[str, Any]:
    """The settings that differ from vLLM's defaults, keyed like ``vllm serve --config``, and
    the engine's other options under ``vllm-args:`` (``for_vllm``: at the top level, where
    vLLM reads them). Secrets are never included (profiles, settings, recordings and run files
    are built from this); ``for_vllm`` leaves out Quantdeck's own settings too, which vLLM
    would refuse, and gives each value as vLLM takes it (the speculative knob's JSON)."""
    out: dict[str, Any] = {}
    compilation: dict[str, Any] = {}
    for k in iter_knobs():
        if k.secret_env or (for_vllm and k.quantdeck_only):
            continue
        v = k.get(cfg)
        if k.positional:
            if v:
                out[k.yaml_key] = v
        elif v != k.vllm_default:
            if k.flag.startswith(COMPILATION_PREFIX):
                compilation[k.flag[len(COMPILATION_PREFIX) :]] = v
            else:
                out[k.yaml_key] = _vllm_value(k, v) if for_vllm else v
    extra = {n: v for n, v in cfg.extra_args.items() if not ea.is_secret(n, v)}
    if for_vllm:
        compilation = _merged_compilation(cfg, compilation)
        extra.pop("compilation-config", None)
    if compilation:
        out["compilation-config"] = compilation
    if extra and for_vllm:
        out.update(extra)
    elif extra:
        out[ea.SECTION] = extra
    return out


def to_yaml(cfg: LaunchConfig, *, for_vllm: bool = False) -> str:
    return yaml.safe_dump(to_dict(cfg, for_vllm=for_vllm), sort_keys=False, default_flow_style=None)


def from_dict(data: Any, *, where: str = "profile") -> LaunchConfig:
    """Build a LaunchConfig from a ``to_dict``-shaped mapping; keys may use - or _."""
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping of settings, got {type(data).__name__}")
    cfg = LaunchConfig()
    # A key left out means vLLM's default (to_dict leaves out exactly those), except where
    # vLLM's default is no valid value of ours (host: we bind to this machine unless told).
    for k in iter_knobs():
        try:
            check_value(k, k.vllm_default)
        except ConfigError:
            continue
        k.set(cfg, k.vllm_default)
    by_key = {k.yaml_key: k for k in iter_knobs()}
    by_key.update({k.name: k for k in iter_knobs()})
    for raw_key, value in data.items():
        key = str(raw_key)
        secret = by_key.get(key) or by_key.get(key.replace("_", "-"))
        if secret is not None and secret.secret_env and value not in (None, ""):
            raise ConfigError(
                f"{where}: '{key}': a key written in the file is refused ({SECRET_IN_FILE}); "
                "give it with --api-key or VLLM_API_KEY, keep a profile's in the keyring "
                "(profile save --remember-key), or write a fleet instance's api_key: "
                "env:VARIABLE"
            )
        if key.replace("_", "-") == ea.SECTION:
            cfg.extra_args = _extra_from(value, where)
            continue
        if key.replace("_", "-") in ("compilation-config", "O"):
            if not isinstance(value, dict):
                raise ConfigError(f"{where}: compilation-config must be a mapping")
            for sub, subv in value.items():
                sub_knob = by_key.get(COMPILATION_PREFIX[2:] + str(sub))
                if sub_knob is None:
                    raise ConfigError(f"{where}: unknown compilation-config key '{sub}'")
                sub_knob.set(cfg, _coerce(sub_knob, subv, where))
            continue
        knob = by_key.get(key) or by_key.get(key.replace("_", "-"))
        if knob is None:
            raise ConfigError(
                f"{where}: unknown setting '{key}' (another option of the engine goes under "
                f"{ea.SECTION}:)"
            )
        knob.set(cfg, _coerce(knob, value, where))
    return cfg


def _extra_from(value: Any, where: str) -> dict[str, Any]:
    """A profile's ``vllm-args:`` mapping, its names as vLLM spells them."""
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: {ea.SECTION} must be a mapping of options")
    out: dict[str, Any] = {}
    for raw, v in value.items():
        name = ea.canonical_name(str(raw), f"{where}: {ea.SECTION}")
        if name in out:
            raise ConfigError(f"{where}: {ea.SECTION}.{name} is given twice")
        if ea.is_secret(name, v):
            raise ConfigError(
                f"{where}: {ea.SECTION}.{name}: a secret written in the file is refused "
                f"({SECRET_IN_FILE}); give --{name} in {ea.SECRET_ENVS[name]}"
            )
        out[name] = v
    return out


# Why a secret written in a settings file (a profile, a fleet file's inline profile) is
# refused, as a fleet file's own api_key is unless it names where the key is kept. to_dict
# never writes one.
SECRET_IN_FILE = "it would be shown and copied with the file"


def from_yaml(text: str, *, where: str = "profile") -> LaunchConfig:
    """A profile's settings from its YAML (or JSON: YAML reads it), read as every YAML file
    Quantdeck reads: a key given twice or aliases that expand too far are refused in one line
    naming the line (quantdeck.core.schema.load_yaml, as a fleet file)."""
    return from_dict(load_yaml(text, where, "profile") or {}, where=where)


# -- CLI options ----------------------------------------------------------------------------


def add_cli_options(parser: argparse.ArgumentParser, *, with_model: bool = False) -> None:
    """Add one option per knob, named as vLLM names it, grouped like vLLM's help."""
    for group in GROUPS:
        g = parser.add_argument_group(f"{group} settings")
        for k in iter_knobs():
            if k.group != group or (k.positional and not with_model):
                continue
            help_ = k.doc + (f" [{k.default_text}]" if not k.positional else "")
            add_option(g, k, dest="knob:" + k.name, help=help_)
    g = parser.add_argument_group("engine options")
    g.add_argument(
        ea.CLI_OPTION,
        dest=VLLM_ARG_DEST,
        action="append",
        default=argparse.SUPPRESS,
        metavar="NAME[=VALUE]",
        type=_cli_arg,
        help="any other option of the engine's `vllm serve`, checked against that engine before "
        "anything starts: NAME=VALUE, NAME (a switch on), no-NAME (a switch off); repeatable "
        "(e.g. --vllm-arg max-num-queued-tokens=4096)",
    )


VLLM_ARG_DEST = "vllm_arg"


def _cli_arg(text: str) -> tuple[str, Any]:
    try:
        return ea.parse_cli_arg(text)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def apply_cli_options(cfg: LaunchConfig, ns: argparse.Namespace) -> LaunchConfig:
    """Copy the options given on the command line onto ``cfg`` (others stay as they are)."""
    out = cfg.copy()
    for k in iter_knobs():
        dest = "knob:" + k.name
        if dest in vars(ns):
            v = vars(ns)[dest]
            check_value(k, v)
            k.set(out, v)
    for name, value in vars(ns).get(VLLM_ARG_DEST) or []:
        out.extra_args[name] = value  # over a profile's, the last one given wins
    return out
