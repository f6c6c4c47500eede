"""One schema check for every file Quantdeck reads.

config.json, quantization configs, safetensors headers, index files, recordings and run files
come from anywhere: a download, a shared folder, another tool. Each reader parses with
:func:`load_json` (bounded nesting, numbers finite) and reads its fields through
:class:`Fields` (types and ranges), so a bad file is one line naming the file and the key,
raised as the reader's own user error (exit 2), never a traceback.
"""

from __future__ import annotations

import json
import math
import os
import reprlib
import stat
from pathlib import Path
from typing import Any, NoReturn, TypeGuard

from quantdeck.core.errors import ConfigError, QuantdeckError

MAX_DEPTH = 64  # nesting of any file Quantdeck reads; theirs is under 10

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
    """A finite int or float: NaN and infinity are no measurement."""
    return is_int(v) or (isinstance(v, float) and math.isfinite(v))


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
    try:
        regular_file(path, error=error)
        with open(path, "rb") as f:
            raw = f.read(max_bytes + 1)
    except FileNotFoundError:
        raise error(f"{path}: no such {what} file") from None
    except OSError as e:
        raise error(f"{path}: cannot read ({e.strerror or e})") from None
    if len(raw) > max_bytes:
        raise error(f"{path}: over {max_bytes // 2**20} MiB (not a {what} file)")
    return raw


def load_json(
    text: str | bytes,
    where: str,
    *,
    error: type[QuantdeckError] = ConfigError,
    nonfinite_as_none: bool = False,
) -> Any:
    """Parse JSON strictly: ``NaN``, ``Infinity`` and overflowing numbers (``1e999``) are
    refused, or read as ``null`` with ``nonfinite_as_none`` (files Python's json module wrote,
    which may hold them); nesting deeper than :data:`MAX_DEPTH` is refused."""

    def nonfinite(word: str) -> None:
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
        raise error(f"{where}: corrupt JSON (nested too deeply)") from None
    except UnicodeDecodeError:
        raise error(f"{where}: not UTF-8 text") from None
    except json.JSONDecodeError as e:
        raise error(f"{where}: corrupt JSON (line {e.lineno}: {e.msg})") from None
    except ValueError:  # an integer of more than 4300 digits
        raise error(f"{where}: corrupt JSON (a number too long)") from None
    _check_depth(data, where, error)
    return data


def _check_depth(data: Any, where: str, error: type[QuantdeckError]) -> None:
    stack = [(data, 1)] if isinstance(data, (dict, list)) else []
    while stack:
        v, depth = stack.pop()
        children = v.values() if isinstance(v, dict) else v
        if depth > MAX_DEPTH:
            raise error(f"{where}: nested more than {MAX_DEPTH} levels deep")
        stack.extend((c, depth + 1) for c in children if isinstance(c, (dict, list)))


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
