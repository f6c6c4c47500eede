"""Settings declared once, as dataclass fields, and what every walker over them shares.

A setting is a dataclass field made with :func:`setting`: its annotation gives the type
(``bool``, ``int``, ``float``, ``str``, ``Literal[...]`` for choices, ``list[...]``, and
``X | None`` where None means "auto"), the field its default, and the metadata its bounds, title
and one-line docstring. :func:`declared` reads a dataclass's fields back as :class:`Setting`
attributes; :func:`check_value` and :func:`parse_text` check and parse one value;
:func:`add_option` makes a setting's argparse option and :func:`option_words` the words that set
it. The launch knobs (:mod:`quantdeck.core.launch.knobs`) and the benchmark load
(:mod:`quantdeck.core.bench.load`) are walked with these, and so are their forms in ``gui/``.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal, Union

from quantdeck.core.errors import ConfigError
from quantdeck.core.schema import shown

AUTO = "auto"


def setting(
    default: Any,
    doc: str,
    *,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    flag: str | None = None,
    title: str | None = None,
    unit: str | None = None,
    advanced: bool = False,
    auto: str = AUTO,
    inf: bool = False,
    choice_titles: dict[Any, str] | None = None,
    metavar: str | None = None,
    extra: dict[str, Any] | None = None,
) -> Any:
    """Declare one setting: a dataclass field with its default and, in its metadata, its
    one-line docstring, bounds and how it is shown.

    ``flag`` defaults to ``--`` + the field name with dashes; ``title`` to the name in words.
    ``auto``: what the form and help call the unset value (None, or infinity where ``inf``:
    a float whose infinity is a value, e.g. "all at once"). ``choice_titles``: the form's text
    for each choice. ``extra``: metadata of one walker's own (the launch knobs' vLLM default);
    a walker's own declaration helper passes the rest through (``**common``).
    """
    meta = {
        "doc": doc,
        "ge": ge,
        "gt": gt,
        "le": le,
        "flag": flag,
        "title": title,
        "unit": unit,
        "advanced": advanced,
        "auto": auto,
        "inf": inf,
        "choice_titles": tuple((choice_titles or {}).items()) or None,
        "metavar": metavar,
        **(extra or {}),
    }
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class Setting:
    """One declared setting: its type, default, bounds, flag and how it is shown."""

    name: str
    base: type  # bool, int, float, str or list
    item: type | None  # element type of a list
    optional: bool  # None is allowed and means "auto"
    choices: tuple[Any, ...] | None
    default: Any
    doc: str
    flag: str
    ge: float | None
    gt: float | None
    le: float | None
    title: str
    unit: str | None
    advanced: bool
    auto: str  # what the unset value is called: None, or infinity where ``inf``
    inf: bool  # infinity is a value of this float (shown as ``auto``)
    choice_titles: tuple[tuple[Any, str], ...] | None
    metavar: str | None

    @property
    def key(self) -> str:
        """How error messages name it."""
        return self.name

    @property
    def numeric(self) -> bool:
        return self.base in (int, float) and self.choices is None

    @property
    def secret(self) -> bool:
        """A value never shown (typed as dots in the form)."""
        return False

    @property
    def default_text(self) -> str:
        """The default as help and tooltips say it."""
        return f"default: {self.shown(self.default)}"

    def shown(self, value: Any) -> str:
        """A value as help text says it: the unset value by its name (``auto``)."""
        if value is None or (self.inf and value == math.inf):
            return self.auto
        return str(value)

    def choice_title(self, choice: Any) -> str:
        """A choice as the form shows it."""
        return dict(self.choice_titles or ()).get(choice, self.shown(choice))

    def get(self, obj: Any) -> Any:
        return getattr(obj, self.name)

    def set(self, obj: Any, value: Any) -> None:
        setattr(obj, self.name, value)


def resolve(tp: Any) -> tuple[type, type | None, bool, tuple[Any, ...] | None]:
    """Reduce an annotation to (base type, list item type, optional, choices)."""
    optional = False
    origin = typing.get_origin(tp)
    if origin in (Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        optional = len(args) < len(typing.get_args(tp))
        if len(args) != 1:
            raise TypeError(f"unsupported union {tp}")
        tp = args[0]
        origin = typing.get_origin(tp)
    if origin is Literal:
        choices = typing.get_args(tp)
        return type(choices[0]), None, optional, choices
    if origin is list:
        (item,) = typing.get_args(tp)
        return list, item, optional, None
    if tp in (bool, int, float, str):
        return tp, None, optional, None
    raise TypeError(f"unsupported setting type {tp}")


_WORDS = {
    "kv": "KV",
    "gpu": "GPU",
    "cpu": "CPU",
    "gb": "GiB",
    "lora": "LoRA",
    "loras": "LoRAs",
    "api": "API",
    "cudagraph": "CUDA-graph",
    "num": "number of",
    "max": "max",
    "seqs": "sequences",
    "dtype": "dtype",
}


def title_of(name: str) -> str:
    """A field name in words: ``max_num_seqs`` -> "Max sequences"."""
    words = [_WORDS.get(w, w) for w in name.split("_")]
    if words[:2] == ["max", "number of"]:
        words = ["max", *words[2:]]
    text = " ".join(words)
    return text[0].upper() + text[1:]


def declared(cls: type) -> Iterator[tuple[dataclasses.Field[Any], dict[str, Any]]]:
    """Each field of the dataclass ``cls`` made with :func:`setting`, in declaration order,
    with the keyword arguments of its :class:`Setting` (a walker adds its own)."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        base, item, optional, choices = resolve(hints[f.name])
        m = f.metadata
        if f.default is not dataclasses.MISSING:
            default = f.default
        elif f.default_factory is not dataclasses.MISSING:
            default = f.default_factory()
        else:
            raise TypeError(f"setting {cls.__name__}.{f.name} has no default")
        yield (
            f,
            {
                "name": f.name,
                "base": base,
                "item": item,
                "optional": optional,
                "choices": choices,
                "default": default,
                "doc": m["doc"],
                "flag": m["flag"] or "--" + f.name.replace("_", "-"),
                "ge": m["ge"],
                "gt": m["gt"],
                "le": m["le"],
                "title": m["title"] or title_of(f.name),
                "unit": m["unit"],
                "advanced": m["advanced"],
                "auto": m["auto"],
                "inf": m["inf"],
                "choice_titles": m["choice_titles"],
                "metavar": m["metavar"],
            },
        )


# -- values ---------------------------------------------------------------------------------


def check_value(k: Setting, value: Any) -> None:
    """Raise ConfigError unless ``value`` has the setting's type, bounds and choices."""
    if value is None:
        if k.optional:
            return
        raise ConfigError(f"{k.key}: a value is required")
    if k.base is list:
        assert k.item is not None  # resolve gives every list setting its item type
        if not isinstance(value, list) or not all(is_a(k.item, v) for v in value):
            raise ConfigError(f"{k.key}: expected a list of {k.item.__name__}, got {shown(value)}")
        return
    if not is_a(k.base, value):
        raise ConfigError(f"{k.key}: expected {k.base.__name__}, got {shown(value)}")
    if k.base is float and not math.isfinite(value) and not (k.inf and value == math.inf):
        raise ConfigError(f"{k.key}: {value} is not a finite number")
    if k.choices is not None and value not in k.choices:
        allowed = ", ".join(str(c) for c in k.choices)
        raise ConfigError(f"{k.key}: {shown(value)} is not one of {allowed}")
    if k.ge is not None and value < k.ge:
        raise ConfigError(f"{k.key}: {value} is below the minimum {k.ge:g}")
    if k.gt is not None and value <= k.gt:
        raise ConfigError(f"{k.key}: {value} must be greater than {k.gt:g}")
    if k.le is not None and value > k.le:
        raise ConfigError(f"{k.key}: {value} is above the maximum {k.le:g}")


def is_a(tp: type | None, v: Any) -> bool:
    """``v`` is a value of ``tp`` (a bool is no int, an int is a float)."""
    if tp is bool:
        return isinstance(v, bool)
    if tp is int:
        return isinstance(v, int) and not isinstance(v, bool)
    if tp is float:
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    return tp is not None and isinstance(v, tp)


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def parse_text(k: Setting, text: str) -> Any:
    """Turn a command-line string into the setting's value ('auto' or '' means None)."""
    t = text.strip()
    if k.choices is not None and t in [str(c) for c in k.choices]:
        return k.choices[[str(c) for c in k.choices].index(t)]
    if k.optional and t.lower() in ("", AUTO, "none", "null"):
        return None
    try:
        if k.base is bool:
            if t.lower() in _TRUE:
                return True
            if t.lower() in _FALSE:
                return False
            raise ValueError
        if k.base is int:
            return parse_int(t)
        if k.base is float:
            return float(t)
        if k.base is list:
            parts = [p for p in t.replace(",", " ").split() if p]
            return [parse_int(p) if k.item is int else p for p in parts]
    except ValueError:
        raise ConfigError(f"{k.key}: '{text}' is not a valid {k.base.__name__}") from None
    return t


_SUFFIX = {"k": 10**3, "m": 10**6, "g": 10**9, "ki": 2**10, "mi": 2**20, "gi": 2**30}


def parse_int(t: str) -> int:
    """An int, with vLLM's size suffixes (``128M``, ``4GiB``, ``32k``)."""
    s = t.strip().lower().removesuffix("b")
    for suf in sorted(_SUFFIX, key=len, reverse=True):
        if s.endswith(suf) and s[: -len(suf)].replace(".", "", 1).isdigit():
            value = float(s[: -len(suf)]) * _SUFFIX[suf]
            if not math.isfinite(value):  # 400 digits and a suffix: no size
                raise ValueError(t)
            return int(value)
    return int(s)


# -- command-line options ---------------------------------------------------------------------


def add_option(
    g: argparse._ActionsContainer,
    k: Setting,
    *,
    dest: str,
    help: str,
    flag: str | None = None,
    check: bool = True,
) -> None:
    """Add ``k``'s option to ``g`` (a parser or one of its groups): bool -> ``--x/--no-x``,
    list -> one or more items, others one value parsed (and, with ``check``, checked against
    the bounds) as :func:`parse_text` reads it. Left out, it is absent from the namespace."""
    flag = flag or k.flag
    if k.base is bool:
        g.add_argument(
            flag,
            dest=dest,
            action=argparse.BooleanOptionalAction,
            default=argparse.SUPPRESS,
            help=help,
        )
    elif k.base is list:
        assert k.item is not None  # resolve gives every list setting its item type
        g.add_argument(
            flag,
            dest=dest,
            nargs="+",
            default=argparse.SUPPRESS,
            metavar=k.metavar or k.item.__name__.upper(),
            help=help,
            type=partial(_option_item, k),
        )
    else:
        choices = "{" + ",".join(map(str, k.choices)) + "}" if k.choices else None
        g.add_argument(
            flag,
            dest=dest,
            default=argparse.SUPPRESS,
            help=help,
            metavar=k.metavar or choices or k.base.__name__.upper(),
            type=partial(_option_value, k, check),
        )


def _option_value(k: Setting, check: bool, text: str) -> Any:
    try:
        v = parse_text(k, text)
        if v is not None and k.choices is not None and k.base is int:
            v = int(v)
        if check or k.choices is not None:
            check_value(k, v)
    except (ConfigError, ValueError) as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return v


def _option_item(k: Setting, text: str) -> Any:
    try:
        return parse_int(text) if k.item is int else text
    except ValueError:
        raise argparse.ArgumentTypeError(f"{k.key}: '{text}' is not an integer") from None


def option_words(k: Setting, value: Any, flag: str | None = None) -> list[str]:
    """The command-line words that set ``k`` to ``value``: ``--x`` / ``--no-x``, a list's flag
    and its items, else one ``--flag=value`` word (so no value can read as a flag of its own)."""
    flag = flag or k.flag
    if k.base is bool:
        return [flag if value else "--no-" + flag[2:]]
    if k.base is list:
        return [flag, *(str(x) for x in value)]
    return [f"{flag}={value}"]
