"""One schema check for every file Quantdeck reads.

config.json, quantization configs, safetensors headers, index files, recordings and run files
come from anywhere: a download, a shared folder, another tool. Each reader parses with
:func:`load_json` (bounded nesting, numbers finite) and reads its fields through
:class:`Fields` (types and ranges), so a bad file is one line naming the file and the key,
raised as the reader's own user error (exit 2), never a traceback.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import reprlib
import stat
import types
import typing
from collections.abc import Callable, Mapping
from itertools import chain
from pathlib import Path
from typing import Any, NoReturn, TypeGuard, Union

import yaml

from quantdeck.core.errors import ConfigError, QuantdeckError
from quantdeck.core.events import ABSENT, Event, _Absent, _Unknown
from quantdeck.core.snapshots import GpuSnapshot, MetricsSnapshot, TelemetrySnapshot

MAX_DEPTH = 64  # nesting of any file Quantdeck reads; theirs is under 10
MAX_YAML_VALUES = 100_000  # values in a YAML file, its aliases expanded: a fleet of 64 takes 5000
# a time stamp (an event's ``t``): seconds since 1970, up to the last second of year 9999 (the
# clock a replay shows reads no further: 1e300 or a 4,000-digit number ended in OverflowError)
MAX_TIME = 253_402_300_799
_INT_RANGE = (-(2**63), 2**64 - 1)  # an integer field's values: what a 64-bit counter holds
_FLOAT_MAX = 1.7976931348623157e308  # an integer where a float belongs must become one

_repr = reprlib.Repr()
_repr.maxlevel = 3
_repr.maxlist = _repr.maxtuple = _repr.maxdict = _repr.maxset = 6
_repr.maxstring = _repr.maxother = 60


def shown(value: Any) -> str:
    """A short repr for an error line, however large or deep the value is."""
    text = _repr.repr(value)
    return text if len(text) <= 120 else text[:117] + "..."


def is_int(v: Any) -> TypeGuard[int]:
    """An integer, not a bool (JSON's ``true`` is not a count)."""
    return isinstance(v, int) and not isinstance(v, bool)


def is_number(v: Any) -> TypeGuard[int | float]:
    """A finite int or float: NaN and infinity are no measurement, nor an integer beyond what
    a float holds (4,000 digits: its use as a float overflows)."""
    if is_int(v):
        return -_FLOAT_MAX <= v <= _FLOAT_MAX
    return isinstance(v, float) and math.isfinite(v)


def regular_file(path: Path, *, error: type[QuantdeckError] = ConfigError) -> int:
    """The size of ``path`` if it is a regular file; a FIFO or a device, which would block
    the reader or never end, is one error line. OSError (missing, unreadable) passes."""
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise error(f"{path}: not a regular file")
    return st.st_size


def read_bounded(
    path: Path, max_bytes: int, what: str, *, error: type[QuantdeckError] = ConfigError
) -> bytes:
    """The bytes of the regular file ``path``, at most ``max_bytes`` of them: a bigger file is
    no ``what`` (a one-line error, read no further), a FIFO is refused before it can block."""
    too_big = f"{path}: over {max_bytes // 2**20} MiB (not a {what} file)"
    try:
        if regular_file(path, error=error) > max_bytes:
            raise error(too_big)
        # O_NONBLOCK: a FIFO put in its place since the stat opens without blocking (and is
        # refused below); it changes nothing for a regular file
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with open(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                raise error(f"{path}: not a regular file")
            raw = f.read(max_bytes + 1)
    except FileNotFoundError:
        raise error(f"{path}: no such {what} file") from None
    except OSError as e:
        raise error(f"{path}: cannot read ({e.strerror or e})") from None
    if len(raw) > max_bytes:
        raise error(too_big)
    return raw


def load_json(
    text: str | bytes,
    where: str,
    *,
    error: type[QuantdeckError] = ConfigError,
    nonfinite_as_none: bool = False,
    syntax_error: type[QuantdeckError] | None = None,
    infinity: bool = False,
) -> Any:
    """Parse JSON strictly: ``NaN``, ``Infinity`` and overflowing numbers (``1e999``) are
    refused, or read as ``null`` with ``nonfinite_as_none`` (files Python's json module wrote,
    which may hold them); nesting deeper than :data:`MAX_DEPTH` is refused. Every JSON text
    Quantdeck reads goes through here: a file, a line, an option's value. ``syntax_error``:
    the error for text that is no JSON at all (default ``error``), for a caller that takes
    such text as plain text. ``infinity`` (with ``nonfinite_as_none``): ``Infinity`` and
    ``-Infinity``, as Python's json module writes an infinite value (a load's rate of requests),
    read as that value, only ``NaN`` as ``null``."""

    def nonfinite(word: str) -> float | None:
        if nonfinite_as_none and infinity and word in ("Infinity", "-Infinity"):
            return float(word)
        if nonfinite_as_none:
            return None
        raise error(f"{where}: {word} is not a finite number")

    def parse_float(word: str) -> float | None:
        v = float(word)
        if math.isfinite(v):
            return v
        nonfinite(word)
        return None

    try:
        data = json.loads(text, parse_constant=nonfinite, parse_float=parse_float)
    except RecursionError:
        deep = f"nested too deeply: over {MAX_DEPTH} levels"
        raise error(f"{where}: corrupt JSON ({deep})") from None
    except UnicodeDecodeError:
        raise error(f"{where}: not UTF-8 text") from None
    except json.JSONDecodeError as e:
        raise (syntax_error or error)(f"{where}: corrupt JSON (line {e.lineno}: {e.msg})") from None
    except ValueError:  # an integer of more than 4300 digits
        raise error(f"{where}: corrupt JSON (a number too long)") from None
    check_depth(data, where, error)
    return data


def check_depth(data: Any, where: str, error: type[QuantdeckError] = ConfigError) -> None:
    """Refuse ``data`` nested more than :data:`MAX_DEPTH` levels deep (walked without
    recursion: a deeper one would end the reader in a RecursionError)."""
    stack = [(data, 1)] if isinstance(data, (dict, list)) else []
    while stack:
        v, depth = stack.pop()
        children = v.values() if isinstance(v, dict) else v
        if depth > MAX_DEPTH:
            raise error(f"{where}: nested more than {MAX_DEPTH} levels deep")
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))


def check_tree(data: Any, where: str, error: type[QuantdeckError] = ConfigError) -> None:
    """Refuse a value read from a file other than by :func:`load_json` (a YAML mapping) that
    JSON could not carry as :func:`load_json` reads it: nested more than :data:`MAX_DEPTH`
    levels, or holding a number that is not finite (YAML's ``.nan``, ``.inf``)."""
    check_depth(data, where, error)
    stack = [data]
    while stack:
        v = stack.pop()
        if isinstance(v, float) and not math.isfinite(v):
            raise error(f"{where}: {v} is not a finite number")
        if isinstance(v, dict):
            stack.extend(chain(v.keys(), v.values()))
        elif isinstance(v, list):
            stack.extend(v)


# -- YAML ---------------------------------------------------------------------------------------


class _Refused(yaml.YAMLError):
    """What a YAML file Quantdeck reads may not hold, with its line (1-based)."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(message)
        self.line, self.message = line, message


class StrictYamlLoader(yaml.SafeLoader):
    """YAML's safe loader, stricter: anchors and aliases (``&a`` ... ``*a``, ``<<: *a``) may
    not expand the file to more than :data:`MAX_YAML_VALUES` values, nor hold themselves (nine
    lines of them make a billion list items, and every reader that walks the lists pays for
    each); a key given twice in a mapping is refused (YAML would keep the last one silently).
    ``what``: the kind of file, as the refusal names it."""

    what = "YAML"

    def compose_document(self) -> yaml.Node | None:
        node = super().compose_document()
        if node is not None:
            _expanded_size(node, {}, set(), self.what)
        return node

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                continue  # a list or mapping as a key: the safe loader refuses it
            key = self.construct_object(key_node)
            if key in seen:
                raise _Refused(key_node.start_mark.line + 1, f"key {shown(key)} given twice")
            seen.add(key)
        return super().construct_mapping(node, deep)


def _expanded_size(node: yaml.Node, sizes: dict[int, int], open_: set[int], what: str) -> int:
    """How many values ``node`` stands for with every alias written out (each node is
    counted once: ``sizes`` keeps what is known); _Refused past MAX_YAML_VALUES or on a node
    that holds itself (``&a [*a]``)."""
    key = id(node)
    if key in sizes:
        return sizes[key]
    if key in open_:
        raise _Refused(node.start_mark.line + 1, "a YAML anchor holds an alias to itself")
    size = 1
    if isinstance(node, yaml.SequenceNode | yaml.MappingNode):
        open_.add(key)
        children = node.value if isinstance(node, yaml.SequenceNode) else chain(*node.value)
        for child in children:
            size += _expanded_size(child, sizes, open_, what)
            if size > MAX_YAML_VALUES:
                raise _Refused(
                    node.start_mark.line + 1,
                    f"its YAML aliases expand to over {MAX_YAML_VALUES:,} values (not a {what})",
                )
        open_.discard(key)
    sizes[key] = size
    return size


def load_yaml(
    text: str | bytes, where: str, what: str, *, error: type[QuantdeckError] = ConfigError
) -> Any:
    """The YAML of a file Quantdeck reads (a profile, a fleet file), by
    :class:`StrictYamlLoader`: one ``error`` line naming ``where`` (and the line) when it is
    not YAML, its aliases expand too far, it gives a key twice or nests too deeply."""
    try:
        text = text.decode("utf-8") if isinstance(text, bytes) else text
    except UnicodeDecodeError:
        raise error(f"{where}: not UTF-8 text") from None
    loader: StrictYamlLoader | None = None
    try:
        loader = StrictYamlLoader(text)  # its reader refuses a control character here
        loader.what = what
        return loader.get_single_data()
    except _Refused as e:
        raise error(f"{where}: line {e.line}: {e.message}") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = f" line {mark.line + 1}" if mark is not None else ""
        raise error(f"{where}:{line} is not valid YAML") from None
    except ValueError as e:  # a tagged or date-like scalar YAML cannot build (2020-13-45)
        raise error(f"{where}: is not valid YAML ({e})") from None
    except RecursionError:
        raise error(f"{where}: is not valid YAML (nested too deeply)") from None
    finally:
        if loader is not None:
            loader.dispose()


class Fields:
    """Typed reads of one JSON object: each failure is ``error("<where>: '<key>' ...")``.

    A key that is absent or ``null`` reads as ``None`` unless ``required``."""

    def __init__(self, data: Any, where: str, *, error: type[QuantdeckError] = ConfigError) -> None:
        self.where, self.error = where, error
        if not isinstance(data, dict):
            self.fail(f"expected a JSON object, got {type(data).__name__}")
        self.data: dict[str, Any] = data

    def fail(self, message: str) -> NoReturn:
        raise self.error(f"{self.where}: {message}")

    def first(self, *keys: str) -> str:
        """The first of ``keys`` (aliases of one field) with a value, else the first key."""
        return next((k for k in keys if self.data.get(k) is not None), keys[0])

    def _get(self, key: str, required: bool, kind: str) -> Any:
        v = self.data.get(key)
        if v is None and required:
            self.fail(f"'{key}' missing (expected {kind})")
        return v

    def _bad(self, key: str, kind: str, v: Any) -> NoReturn:
        self.fail(f"'{key}' must be {kind}, got {shown(v)}")

    def integer(
        self, key: str, *, lo: int | None = None, hi: int | None = None, required: bool = False
    ) -> int | None:
        kind = _bounded("an integer", lo, hi)
        v = self._get(key, required, kind)
        if v is not None and not (
            is_int(v) and (lo is None or v >= lo) and (hi is None or v <= hi)
        ):
            self._bad(key, kind, v)
        return v

    def number(
        self,
        key: str,
        *,
        lo: float | None = None,
        hi: float | None = None,
        required: bool = False,
    ) -> float | None:
        kind = _bounded("a finite number", lo, hi)
        v = self._get(key, required, kind)
        if v is not None and not (
            is_number(v) and (lo is None or v >= lo) and (hi is None or v <= hi)
        ):
            self._bad(key, kind, v)
        return v

    def text(self, key: str, *, max_len: int = 4096, required: bool = False) -> str | None:
        kind = f"a string of at most {max_len} characters"
        v = self._get(key, required, kind)
        if v is not None and not (isinstance(v, str) and len(v) <= max_len):
            self._bad(key, kind, v)
        return v

    def boolean(self, key: str, *, required: bool = False) -> bool | None:
        v = self._get(key, required, "true or false")
        if v is not None and not isinstance(v, bool):
            self._bad(key, "true or false", v)
        return v

    def items(self, key: str, *, max_len: int, required: bool = False) -> list[Any] | None:
        kind = f"a list of at most {max_len} items"
        v = self._get(key, required, kind)
        if v is not None and not (isinstance(v, list) and len(v) <= max_len):
            self._bad(key, kind, v)
        return v

    def sub(self, key: str, *, required: bool = False) -> Fields | None:
        """The nested object at ``key``, read the same way."""
        v = self._get(key, required, "a JSON object")
        if v is None:
            return None
        if not isinstance(v, dict):
            self._bad(key, "a JSON object", v)
        return Fields(v, f"{self.where}: '{key}'", error=self.error)


def _bounded(kind: str, lo: float | None, hi: float | None) -> str:
    def n(x: float) -> str:
        return str(x) if isinstance(x, int) else f"{x:g}"

    if lo is not None and hi is not None:
        return f"{kind} from {n(lo)} to {n(hi)}"
    if lo is not None:
        return f"{kind} >= {n(lo)}"
    if hi is not None:
        return f"{kind} <= {n(hi)}"
    return kind


# -- events: every field as its class declares it ---------------------------------------------
# An event read from JSON (a recording's line, a worker's) is built from whatever the line held.
# check_event holds each field to the type its dataclass declares (core/events.py, and the
# snapshots a metrics event carries), so what a reader accepts is what an emitter could have
# made, and a consumer never meets text where a number belongs.

# A compiled check: True (it fits), False (not of the type: the caller says what was expected)
# or the one-line problem found inside it (naming the inner key).
_Check = Callable[[Any, str], bool | str]


def check_event(ev: Event, where: str, *, error: type[QuantdeckError] = ConfigError) -> None:
    """Refuse, with ``error("<where>: '<field>' must be ..., got ...")``, an event whose fields
    are not of their declared types, or of a kind this version does not know (its fields
    cannot be checked). Field names are the JSON keys (``gpus[1].power_w``, ``server.state``)."""
    problem = _nested(Event)[1](ev, "")
    if isinstance(problem, str):
        raise error(f"{where}: {problem}")


def _mismatch(path: str, kind: str, value: Any) -> str:
    if value is ABSENT:
        return f"'{path}' missing (expected {kind})"
    return f"'{path}' must be {kind}, got {shown(value)}"


def _fields_check(cls: type) -> _Check:
    """The check of every field of the dataclass ``cls`` (an event or a snapshot), made
    once per class."""
    check = _FIELD_CHECKS.get(cls)
    if check is None:
        check = _FIELD_CHECKS[cls] = _make_fields_check(cls)
    return check


_FIELD_CHECKS: dict[type, _Check] = {}


def _make_fields_check(cls: type) -> _Check:
    hints = typing.get_type_hints(cls)
    lenient = cls in _SNAPSHOTS  # a figure an older recording lacks (or wrote NaN) reads None
    scalars: list[tuple[str, str, Callable[[Any], bool]]] = []
    others: list[tuple[str, bool, str, _Check]] = []
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if cls is GpuSnapshot:  # declared Any (a reading may be NA): as to_json writes them
            hint = _GPU_FIELDS.get(f.name, float)
        if lenient:
            hint = hint | None
        elif f.name == "t" and f.default_factory is not dataclasses.MISSING:
            # a time stamp the line did not carry reads ABSENT (Event.from_fields invents none)
            hint = hint | _Absent
        scalar = _scalar(hint)
        if scalar is not None and f.name == "t" and issubclass(cls, Event):
            scalar = _time_stamp(*scalar)
        if scalar is not None:  # most are: a metrics event has 60, checked on every line
            scalars.append((f.name, *scalar))
            continue
        # written inline, its keys beside the event's own: a metrics event's snapshots, an
        # instance's event, a flattened mapping
        inline = f.metadata.get("flatten") or f.name == "event" or hint in _SNAPSHOT_HINTS
        compiled = _compile(hint)
        if f.metadata.get("pairs"):
            compiled = _pairs(*compiled)
        others.append((f.name, bool(inline), *compiled))

    def check(obj: Any, prefix: str) -> bool | str:
        for name, kind, test in scalars:
            value = getattr(obj, name)
            if not test(value):
                return _mismatch(f"{prefix}{name}", kind, value)
        for name, inline, kind, fn in others:
            value = getattr(obj, name)
            path = prefix if inline else f"{prefix}{name}"
            ok = fn(value, path)
            if ok is False:
                return _mismatch(path or name, kind, value)
            if isinstance(ok, str):
                return ok
        return True

    return check


_SNAPSHOTS = (MetricsSnapshot, TelemetrySnapshot, GpuSnapshot)
_SNAPSHOT_HINTS = (MetricsSnapshot | None, TelemetrySnapshot | None)
_GPU_FIELDS: dict[str, Any] = {"index": int, "name": str}  # the rest: numbers
_SCALAR_KINDS: dict[Any, str] = {  # in the order an error line names them
    Any: "anything",
    bool: "true or false",
    int: "an integer",
    float: "a finite number",
    str: "a string",
    type(None): "null",
    _Absent: "absent",
}


def _time_stamp(kind: str, test: Callable[[Any], bool]) -> tuple[str, Callable[[Any], bool]]:
    """An event's ``t``: of its type, and a time a clock can show (0 to :data:`MAX_TIME`)."""

    def stamp(v: Any) -> bool:
        return test(v) and (not isinstance(v, int | float) or 0 <= v <= MAX_TIME)

    return kind.replace("a finite number", f"a time in seconds since 1970 (0 to {MAX_TIME})"), stamp


def _pairs(kind: str, check: _Check) -> tuple[str, _Check]:
    """A mapping of changes, ``{name: [before, after]}`` (a field with ``pairs`` in its
    metadata): each value a list of exactly two."""

    def pairs(v: Any, path: str) -> bool | str:
        ok = check(v, path)
        if ok is not True:
            return ok
        for k, x in v.items():
            if len(x) != 2:
                where = f"{path}.{k}" if path else k
                return _mismatch(where, "a pair [before, after]", x)
        return True

    return kind, pairs


def _scalar(hint: Any) -> tuple[str, Callable[[Any], bool]] | None:
    """(its name, its test) for a type of JSON scalars (``int``, ``float | None``, ``str |
    _Absent``...); None for any other."""
    union = typing.get_origin(hint) in (Union, types.UnionType)
    members = set(typing.get_args(hint) if union else (hint,))
    if not members <= set(_SCALAR_KINDS):
        return None
    kind = " or ".join(v for k, v in _SCALAR_KINDS.items() if k in members and k is not _Absent)
    if Any in members:
        return kind, lambda v: True
    none, absent, number = type(None) in members, _Absent in members, float in members
    # by exact type: JSON's values are of these; bool is no int (JSON's true is not a count)
    exact = {t for t in (str, bool, int) if t in members} | ({int} if number else set())
    # an integer within what its field holds: a count within 64 bits, a number within a
    # float's range (a 4,000-digit one ended a reader in OverflowError)
    lo, hi = _INT_RANGE if int in members else (-_FLOAT_MAX, _FLOAT_MAX)

    def test(v: Any) -> bool:
        t = type(v)
        if t is int and t in exact:
            return lo <= v <= hi
        if t in exact:
            return True
        if t is float:
            return number and math.isfinite(v)
        if v is None:
            return none
        if v is ABSENT:
            return absent
        return str in exact and isinstance(v, str)

    return kind or "absent", test


def _compile(hint: Any) -> tuple[str, _Check]:
    """(what the type is called in an error line, its check)."""
    scalar = _scalar(hint)
    if scalar is not None:
        test = scalar[1]
        return scalar[0], lambda v, p: test(v)
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):
        return _union([_compile(a) for a in args])
    if origin in (list, tuple):
        return _sequence(origin, _compile(args[0]))
    if origin in (dict, Mapping):
        return _mapping(_compile(args[1]))
    if isinstance(hint, type) and dataclasses.is_dataclass(hint):
        return _nested(hint)
    raise TypeError(f"no schema check for the type {hint!r}")


def _union(members: list[tuple[str, _Check]]) -> tuple[str, _Check]:
    kind = " or ".join(k for k, _ in members if k != "absent")

    def check(v: Any, path: str) -> bool | str:
        for _, fn in members:
            ok = fn(v, path)
            if ok is not False:  # it fits, or it is of this member's type with a bad inside
                return ok
        return False

    return kind, check


def _sequence(
    origin: type[list[Any]] | type[tuple[Any, ...]], item: tuple[str, _Check]
) -> tuple[str, _Check]:
    item_kind, item_check = item

    def check(v: Any, path: str) -> bool | str:
        if not isinstance(v, origin):
            return False
        for i, x in enumerate(v):
            ok = item_check(x, f"{path}[{i}]")
            if ok is not True:
                return ok or _mismatch(f"{path}[{i}]", item_kind, x)
        return True

    return ("a list" if origin is list else "a tuple"), check


def _mapping(value: tuple[str, _Check]) -> tuple[str, _Check]:
    value_kind, value_check = value

    def check(v: Any, path: str) -> bool | str:
        if not isinstance(v, dict | Mapping):  # dict first: the ABC's check is slow
            return False
        for k, x in v.items():
            if not isinstance(k, str):  # JSON's keys are text: a value built otherwise
                return _mismatch(path, "an object with text keys", v)
            ok = value_check(x, f"{path}.{k}" if path else k)
            if ok is not True:
                return ok or _mismatch(f"{path}.{k}" if path else k, value_kind, x)
        return True

    return "a JSON object", check


def _nested(cls: type) -> tuple[str, _Check]:
    kind = "an event" if issubclass(cls, Event) else "a JSON object"

    def check(v: Any, path: str) -> bool | str:
        if not isinstance(v, cls):
            return False
        if isinstance(v, _Unknown):
            return f"unknown event {shown(v.name)} (not one this Quantdeck writes)"
        return _fields_check(type(v))(v, f"{path}." if path else "")

    return kind, check
