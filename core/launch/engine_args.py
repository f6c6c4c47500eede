"""Every option of the chosen engine: ``vllm serve`` flags beyond the curated knobs.

``LaunchConfig.extra_args`` maps an option's name (vLLM's flag without its dashes:
``performance-mode``) to its value: True / False for a switch (``--x`` / ``--no-x``), a list for
an option of several values, a mapping for a JSON option, else a number or text. They come from
``--vllm-arg NAME=VALUE`` (:func:`parse_cli_arg`) and from a profile's ``vllm-args:`` mapping,
and reach vLLM after the curated flags (:func:`arg_words`).

:func:`check_names` checks them without an engine: a name, no flag Quantdeck sets itself (the
model, host, port, key, anything a knob sets: the refusal names the knob), no secret on argv.
:func:`check_against` checks them against one engine's own parser, as its probe recorded it
(:class:`EngineOptions`, e.g. ``quantdeck.core.runtime.Capabilities``): the option exists, its
value has the option's kind and is one of its choices; every refusal names the engine and its
vLLM version. Secrets: ``--hf-token`` reaches vLLM as ``HF_TOKEN`` in its environment, as the API
key does; any other secret-looking value is refused.
"""

from __future__ import annotations

import difflib
import json
import math
import re
import unicodedata
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from quantdeck.core.errors import ConfigError, mask_credentials
from quantdeck.core.schema import check_tree, load_json, shown

SECTION = "vllm-args"  # a profile's mapping of them (vLLM's own --config YAML: top level)
CLI_OPTION = "--vllm-arg"
MAX_ARGS = 200

# vLLM's FlexibleArgumentParser turns -O3 into --optimization-level 3 before argparse sees it
ALIASES = {"O": "optimization-level"}

# Flags Quantdeck sets or needs left alone, besides the knobs' own (knobs.managed_options).
OWN_FLAGS: dict[str, str] = {
    "config": "give a profile, or a `vllm serve --config` YAML, with --profile FILE",
    "kv-events-config": "use its setting cache.kv_events (--kv-events)",
    "profiler-config": "use its setting server.profiler (--profiler)",
    "middleware": "it carries Quantdeck's key guard (server.api_key)",
    "disable-access-log-for-endpoints": "it keeps Quantdeck's own /health and /metrics polls "
    "out of the server log",
    "uds": "Quantdeck reaches the server on server.host and server.port (--host, --port)",
    "ssl-keyfile": "Quantdeck watches the server over plain HTTP on server.host:server.port",
    "ssl-certfile": "Quantdeck watches the server over plain HTTP on server.host:server.port",
    "ssl-ca-certs": "Quantdeck watches the server over plain HTTP on server.host:server.port",
    "ssl-cert-reqs": "Quantdeck watches the server over plain HTTP on server.host:server.port",
    "headless": "Quantdeck watches the OpenAI API server, which --headless does not start",
    "help": "it prints vLLM's help instead of serving (the engine's options: "
    "`quantdeck engines options`)",
}

# Options that move the routes Quantdeck reaches the server on (its readiness probe: /health and
# /v1/models; its scrape: /metrics): with one, a server that serves is never seen ready (a
# --root-path /v1 waited out the 30-minute start-up deadline). Refused before anything starts.
ROUTE_FLAGS: dict[str, str] = {
    "root-path": "it moves the routes Quantdeck's readiness probe (/health, /v1/models) and "
    "metrics scrape (/metrics) reach, so the server would never be seen ready; serve at the "
    "root and let the proxy in front strip its prefix",
}

# Secrets vLLM also reads from its environment: passed there, never on argv nor in a file.
SECRET_ENVS = {"hf-token": "HF_TOKEN"}
_SECRET_WORDS = frozenset(
    {"key", "apikey", "token", "password", "passwd", "secret", "credential", "credentials"}
)
_TOKEN_LIKE = re.compile(r"\b(?:hf_|sk-|ghp_|github_pat_|xox[abp]-|glpat-)[A-Za-z0-9_-]{16,}")
_PLAIN_VALUE = re.compile(r"(?i)[-+]?\d+(\.\d+)?[kmgt]?|true|false|none|null|auto")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,79}")
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


class EngineOptions(Protocol):
    """What :func:`check_against` needs of an engine: its options as its probe recorded them
    (option string -> ``{"dest", "default", "choices", "nargs", "kind", "help", "group"}``)
    and how refusals name it."""

    @property
    def options(self) -> dict[str, dict[str, Any]]: ...

    @property
    def label(self) -> str: ...


# -- names and the command line ---------------------------------------------------------------


def canonical_name(raw: str, where: str = SECTION) -> str:
    """An option's name as ``extra_args`` keys it: without dashes in front, ``_`` as ``-``
    (vLLM reads both), ``O`` as ``optimization-level``."""
    name = raw.strip()
    name = name[2:] if name.startswith("--") else name[1:] if name.startswith("-") else name
    if name in ALIASES:
        return ALIASES[name]
    if "." in name and _NAME.fullmatch(name.partition(".")[0]):
        base, _, key = name.partition(".")
        raise ConfigError(
            f"{where}: {shown(raw)}: give {base} one JSON object instead of its keys one by one "
            f'(e.g. {base}={{"{key}": ...}})'
        )
    if not _NAME.fullmatch(name):
        raise ConfigError(f"{where}: {shown(raw)} is not an option name (letters, digits, '-')")
    return name.replace("_", "-")


def parse_cli_arg(text: str) -> tuple[str, Any]:
    """``--vllm-arg`` text: ``NAME=VALUE`` (a number or JSON object where the text is exactly
    one, else the text), ``NAME`` (a switch on) or ``no-NAME`` (a switch off)."""
    raw, sep, value = text.partition("=")
    name = canonical_name(raw, CLI_OPTION)
    if not sep:
        return (name[3:], False) if name.startswith("no-") and len(name) > 3 else (name, True)
    if value == "":
        raise ConfigError(
            f"{CLI_OPTION} {name}=: no value (NAME alone turns a switch on, no-NAME off)"
        )
    return name, _scalar(value, f"{CLI_OPTION} {name}")


def _scalar(text: str, where: str) -> Any:
    """A number or JSON object where its text says exactly that (``3``, ``0.5``, ``{...}``),
    so a profile keeps it as one; any other text as it is (``007``, ``1.10`` stay text: vLLM
    gets the same word either way). A JSON object nested too deeply or holding NaN or
    Infinity is refused (``where`` names it)."""
    if re.fullmatch(r"-?(0|[1-9][0-9]*)", text):
        return int(text)
    try:
        number = float(text)
    except ValueError:
        number = None
    if number is not None and math.isfinite(number) and repr(number) == text:
        return number
    if text.startswith("{"):
        try:  # bounded: nested at most MAX_DEPTH levels, its numbers finite, or refused
            parsed = load_json(text, where, syntax_error=_NotJson)
        except _NotJson:
            return text
        if isinstance(parsed, dict):
            return parsed
    return text


class _NotJson(ConfigError):
    """Text that is no JSON at all (it stays text: vLLM gets it as it was given)."""


def arg_words(name: str, value: Any) -> list[str]:
    """The ``vllm serve`` words that set option ``name`` to ``value``, as vLLM's own --config
    YAML reading turns a value into words: a switch ``--x`` / ``--no-x``, a list its flag and
    items, a mapping one JSON word, else one ``--x=value`` word (no value reads as a flag)."""
    flag = "--" + name
    if value is True:
        return [flag]
    if value is False:
        return ["--no-" + name]
    if isinstance(value, list):
        return [flag, *(str(x) for x in value)] if value else []
    if isinstance(value, dict):
        return [f"{flag}={json.dumps(value, separators=(',', ':'))}"]
    return [f"{flag}={value}"]


def secret_env(extra: Mapping[str, Any]) -> dict[str, str]:
    """The secrets among ``extra`` that go to vLLM's environment: ``{variable: value}``."""
    return {SECRET_ENVS[n]: v for n, v in extra.items() if n in SECRET_ENVS and isinstance(v, str)}


def is_secret(name: str, value: Any) -> bool:
    """A secret held in ``extra_args`` that must stay out of argv and files (``--hf-token``
    with a value: it goes in the environment)."""
    return name in SECRET_ENVS and isinstance(value, str)


# -- checks without an engine -----------------------------------------------------------------


def check_names(extra: Any, managed: Mapping[str, str]) -> None:
    """Raise ConfigError unless ``extra`` is a mapping of option names to values that may
    reach vLLM: no flag Quantdeck sets itself (``managed``: name -> what to use instead), no
    secret on argv, no control character, no list item that would read as an option."""
    if not isinstance(extra, dict):
        raise ConfigError(f"{SECTION}: expected a mapping of options, got {type(extra).__name__}")
    if len(extra) > MAX_ARGS:
        raise ConfigError(f"{SECTION}: {len(extra)} options; at most {MAX_ARGS}")
    for name, value in extra.items():
        if not isinstance(name, str) or canonical_name(name) != name:
            raise ConfigError(f"{SECTION}: {shown(name)} is not an option name as vLLM spells it")
        where = f"{SECTION}.{name}"
        _check_managed(name, where, managed)
        _check_shape(value, where)
        _check_secret(name, value, where)
        for text in _texts(value):
            if any(unicodedata.category(c) in ("Cc", "Zl", "Zp") for c in text):
                what = "the value" if is_secret(name, value) else shown(text)
                raise ConfigError(f"{where}: {what} holds a control character or line break")
        if isinstance(value, list):
            for item in value:
                if str(item).startswith("-"):
                    raise ConfigError(
                        f"{where}: {shown(item)} starts with '-' and would read as an option"
                    )


def _check_managed(name: str, where: str, managed: Mapping[str, str]) -> None:
    for n in (name, name[3:] if name.startswith("no-") else None):
        if n and n in managed:
            raise ConfigError(f"{where}: Quantdeck sets --{n} itself: {managed[n]}")
        if n and n in ROUTE_FLAGS:
            raise ConfigError(f"{where}: --{n} is refused: {ROUTE_FLAGS[n]}")


def _check_shape(value: Any, where: str) -> None:
    if value is None:
        raise ConfigError(f"{where}: no value (leave the option out for vLLM's default)")
    # as a JSON option's text is read (load_json): a profile's YAML nests and writes .nan too;
    # and a text that is JSON (vLLM parses it for a JSON option: --kv-transfer-config '{...}')
    # within the same bounds, whatever the engine says of the option
    check_tree(value, where)
    for item in value if isinstance(value, list) else [value]:
        if isinstance(item, str) and item.lstrip()[:1] in ("{", "["):
            try:
                load_json(item, where, syntax_error=_NotJson)
            except _NotJson:
                pass  # no JSON: text, as given
    if isinstance(value, list):
        if not all(isinstance(x, (str, int, float)) for x in value):
            raise ConfigError(f"{where}: a list holds only numbers and text")
    elif isinstance(value, dict):
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: the mapping is no JSON object") from None
    elif not isinstance(value, (bool, int, float, str)):
        raise ConfigError(f"{where}: {type(value).__name__} is no option value")


def _texts(value: Any) -> Iterator[str]:
    """Every text in ``value``: itself, list items, mapping keys and values, all the way down."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, list):
        for x in value:
            yield from _texts(x)
    elif isinstance(value, dict):
        for k, v in value.items():
            yield str(k)
            yield from _texts(v)


def _keys(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        for k, v in value.items():
            yield str(k)
            yield from _keys(v)
    elif isinstance(value, list):
        for x in value:
            yield from _keys(x)


def _secret_name(name: str) -> bool:
    return bool(_SECRET_WORDS & set(re.split(r"[-_.\s]+", name.lower())))


_SECRET_REFUSAL = (
    "Quantdeck never puts a secret on vLLM's command line (another user can read it in /proc) "
    "nor in a file; only the API key (server.api_key) and --hf-token (passed as HF_TOKEN) "
    "reach vLLM through its environment"
)


def _check_secret(name: str, value: Any, where: str, kind: str | None = None) -> None:
    """Refuse a secret-looking value: a text value of an option named like a secret (key,
    token, password, ...), a mapping key named so, a URL with credentials, a token's shape.
    The message never holds the value."""
    if isinstance(value, bool) or kind in ("bool", "int", "float", "choice"):
        return
    if name in SECRET_ENVS:
        return  # passed in the environment
    if (
        _secret_name(name)
        and isinstance(value, (str, list, dict))
        and not (isinstance(value, str) and _PLAIN_VALUE.fullmatch(value.strip()))
    ):
        raise ConfigError(f"{where}: --{name} takes a secret; {_SECRET_REFUSAL}")
    for key in _keys(value):
        if _secret_name(key):
            raise ConfigError(f"{where}: the value's key '{key}' holds a secret; {_SECRET_REFUSAL}")
    for text in _texts(value):
        if mask_credentials(text) != text or _TOKEN_LIKE.search(text):
            raise ConfigError(f"{where}: the value holds a credential; {_SECRET_REFUSAL}")


# -- checks against an engine -----------------------------------------------------------------


def _long_flag(options: Mapping[str, Mapping[str, Any]], dest: Any) -> str | None:
    """The first ``--`` option string of the action whose dest is ``dest``."""
    return next(
        (f for f, o in options.items() if f.startswith("--") and o.get("dest") == dest), None
    )


def check_against(
    extra: Mapping[str, Any], engine: EngineOptions, managed: Mapping[str, str]
) -> dict[str, Any]:
    """``extra`` checked against ``engine``'s own options: each one exists there (a short
    alias such as ``tp`` is read as its long flag), is no flag Quantdeck sets (also by its
    dest), and its value has the option's kind and is one of its choices. Returns the values
    in their kinds' types (``"4"`` -> 4 for an int, ``"true"`` -> True for a switch, JSON text
    -> a mapping), a switch turned off dropped where vLLM has no ``--no-`` form (off is then
    its default). Every refusal names the engine (``engine.label``)."""
    opts = engine.options
    by_dest: dict[Any, str] = {}
    for m in managed:
        o = opts.get("--" + m)
        if o is not None and o.get("dest") is not None:
            by_dest.setdefault(o["dest"], m)
    out: dict[str, Any] = {}
    for given, value in extra.items():
        name = given
        opt = opts.get("--" + name)
        if opt is None and "-" + name in opts:  # vLLM's short aliases: -tp, -sc, -q
            long = _long_flag(opts, opts["-" + name].get("dest"))
            if long is not None:
                name, opt = long[2:], opts[long]
        where = f"{SECTION}.{given}"
        if opt is None:
            longs = [f for f in opts if f.startswith("--")]
            close = difflib.get_close_matches("--" + name, longs, n=1, cutoff=0.8)
            hint = f" (did you mean {close[0]}?)" if close else ""
            raise ConfigError(f"{where}: {engine.label} has no --{name} option{hint}")
        _check_managed(name, where, managed)
        if opt.get("dest") in by_dest:
            m = by_dest[opt["dest"]]
            raise ConfigError(f"{where}: Quantdeck sets --{m} itself: {managed[m]}")
        if name in out:
            raise ConfigError(f"{where}: --{name} is given twice")
        value = _coerce(name, value, opt, where, engine)
        _check_secret(name, value, where, opt.get("kind"))
        if value is False and "--no-" + name not in opts:
            continue  # a plain switch, off: vLLM's default
        out[name] = value
    return out


def _coerce(name: str, value: Any, opt: Mapping[str, Any], where: str, engine: Any) -> Any:
    kind = opt.get("kind")
    if kind is None:  # a probe that recorded no kinds: the value as given
        return value
    if kind == "bool":
        if isinstance(value, str) and value.strip().lower() in _TRUE | _FALSE:
            return value.strip().lower() in _TRUE
        if not isinstance(value, bool):
            raise ConfigError(
                f"{where}: --{name} is a switch: give {name} (on) or no-{name} (off), "
                f"not {shown(value)}"
            )
        return value
    if isinstance(value, bool):
        if value is True and opt.get("nargs") == "?":
            return True  # a bare flag with its own meaning (--hf-token: the login's token)
        raise ConfigError(f"{where}: --{name} takes a value ({kind}): give {name}=VALUE")
    if opt.get("nargs") in ("+", "*") or kind == "list":
        items = value if isinstance(value, list) else _split(value)
        if not items:
            raise ConfigError(f"{where}: no items")
        return [_one(name, x, kind, opt, where, engine) for x in items]
    if isinstance(value, list):
        raise ConfigError(f"{where}: --{name} takes one value ({kind}), not a list")
    return _one(name, value, kind, opt, where, engine)


def _split(value: Any) -> list[Any]:
    if isinstance(value, str):
        t = value.strip()
        if t.startswith("["):
            try:
                parsed = load_json(t, f"{SECTION}: {shown(t)}", syntax_error=_NotJson)
            except _NotJson:
                parsed = None
            if isinstance(parsed, list):
                return parsed
        return [p.strip() for p in t.split(",") if p.strip()]
    return [value]


def _one(name: str, value: Any, kind: str, opt: Mapping[str, Any], where: str, engine: Any) -> Any:
    if kind == "choice":
        choices = [c for c in opt.get("choices") or [] if c is not None]
        for c in choices:
            if str(c) == str(value).strip():
                return c
        allowed = ", ".join(str(c) for c in choices)
        raise ConfigError(f"{where}: {shown(value)} is not one of {allowed} ({engine.label})")
    if kind in ("json", "json|str"):
        if isinstance(value, (dict, list)):
            return value
        text = str(value).strip()
        if kind == "json|str" and not text.startswith("{"):
            return text
        parsed = load_json(text, f"{where}: --{name} takes a JSON object")
        if not isinstance(parsed, dict):
            raise ConfigError(f"{where}: --{name} takes a JSON object, not {shown(value)}")
        return parsed
    if isinstance(value, dict):
        raise ConfigError(f"{where}: --{name} takes one value ({kind}), not a mapping")
    if kind == "int":
        if isinstance(value, int):
            return value
        text = str(value).strip()
        if re.fullmatch(r"[-+]?\d+", text):
            return int(text)
        if re.fullmatch(r"\d+(\.\d+)?[kKmMgGtT]", text):
            return text  # vLLM's own reading: 1k = 1000, 1K = 1024
        raise ConfigError(f"{where}: {shown(value)} is not a whole number")
    if kind == "float":
        try:
            number = float(value if isinstance(value, (int, float)) else str(value).strip())
        except (ValueError, OverflowError):
            raise ConfigError(f"{where}: {shown(value)} is not a number") from None
        if not math.isfinite(number):  # vLLM's float() would take nan and inf
            raise ConfigError(f"{where}: {shown(value)} is not a finite number")
        return value if isinstance(value, (int, float)) else number
    return value


# -- the engine's options, listed -------------------------------------------------------------


@dataclass(frozen=True)
class EngineOption:
    """One option of an engine's ``vllm serve`` (all its option strings), as a list of them
    shows it: ``managed`` says what to use instead where Quantdeck sets it itself."""

    flags: tuple[str, ...]  # the long flag first, then its --no- form and short aliases
    kind: str
    default: Any
    choices: tuple[Any, ...] | None
    group: str
    help: str
    managed: str | None

    @property
    def name(self) -> str:
        """Its name as ``--vllm-arg`` and ``vllm-args:`` take it."""
        return self.flags[0].lstrip("-")

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "flags": list(self.flags),
            "kind": self.kind,
            "default": self.default,
            "choices": list(self.choices) if self.choices is not None else None,
            "group": self.group,
            "help": self.help,
            "managed": self.managed,
        }


def list_options(
    engine: EngineOptions, managed: Mapping[str, str], search: str | None = None
) -> list[EngineOption]:
    """``engine``'s options, one per action (its option strings together), in its parser's
    order; with ``search``, those whose flags or help hold every word of it (any case)."""
    by_dest: dict[Any, list[str]] = {}
    facts: dict[Any, Mapping[str, Any]] = {}
    for flag, o in engine.options.items():
        key = o.get("dest", flag)
        by_dest.setdefault(key, []).append(flag)
        facts.setdefault(key, o)
    words = (search or "").lower().split()
    out: list[EngineOption] = []
    for key, flags in by_dest.items():
        flags = sorted(flags, key=lambda f: (not f.startswith("--"), f.startswith("--no-")))
        facts_ = facts[key]
        name = flags[0].lstrip("-")
        help_ = str(facts_.get("help") or "")
        if words and not all(w in (" ".join(flags) + " " + help_).lower() for w in words):
            continue
        if name == "help":
            continue
        choices = facts_.get("choices")
        out.append(
            EngineOption(
                flags=tuple(flags),
                kind=str(facts_.get("kind") or "?"),
                default=facts_.get("default"),
                choices=tuple(c for c in choices if c is not None) if choices else None,
                group=str(facts_.get("group") or ""),
                help=help_,
                managed=managed.get(name),
            )
        )
    return out


# -- speculative decoding ---------------------------------------------------------------------

_NGRAM = re.compile(r"(?i)ngram:(\d+)")
MAX_SPECULATIVE_TOKENS = 32


def speculative_config(text: str) -> dict[str, Any]:
    """vLLM's ``--speculative-config`` object from the ``speculative`` knob's text:
    ``ngram:K`` (n-gram lookup in the prompt, K tokens drafted a step, no draft model), or
    vLLM's own JSON object (EAGLE, a draft model, MTP: it names a ``method`` or a ``model``)."""
    t = text.strip()
    where = "performance.speculative"
    m = _NGRAM.fullmatch(t)
    if m:
        k = int(m.group(1))
        if not 1 <= k <= MAX_SPECULATIVE_TOKENS:
            raise ConfigError(f"{where}: ngram:{k}: K is 1 to {MAX_SPECULATIVE_TOKENS}")
        return {"method": "ngram", "num_speculative_tokens": k}
    if not t.startswith("{"):
        raise ConfigError(
            f"{where}: {shown(text)} is neither ngram:K nor a JSON object of vLLM's speculative "
            'config (e.g. {"method": "eagle3", "model": "PATH", "num_speculative_tokens": 3})'
        )
    parsed = load_json(t, where)  # nested at most MAX_DEPTH levels, its numbers finite
    if not isinstance(parsed, dict) or not ({"method", "model"} & set(parsed)):
        raise ConfigError(f"{where}: the JSON object names no method and no model")
    _check_secret("speculative-config", parsed, where)
    return parsed
