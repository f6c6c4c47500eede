"""Quantdeck's folders and how files get into them.

One place for the user folders (config, data, cache: each overridable by an environment variable
for tests and portable set-ups), the shipped assets, and the two ways every output gets written:
:func:`write_atomic` for a file and :func:`atomic_dir` for a folder. Both build a temporary
sibling and rename it into place, so a reader (or a crash) sees the old target or the new one,
never half of one; a folder Quantdeck did not make is refused, never replaced.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from quantdeck.core.errors import ConfigError, QuantdeckError

CONFIG_DIR_ENV = "QUANTDECK_CONFIG_DIR"
DATA_DIR_ENV = "QUANTDECK_DATA_DIR"
CACHE_DIR_ENV = "QUANTDECK_CACHE_DIR"
PROBE_DIR_ENV = "QUANTDECK_PROBE_DIR"

# assets/ is installed as quantdeck/assets, beside quantdeck/core; in a source tree it is the
# top-level assets/ folder beside core/. Either way: one level above this package.
ASSETS = Path(__file__).resolve().parents[1] / "assets"
CORPUS = ASSETS / "corpus"


def _from_env(name: str) -> Path | None:
    value = os.environ.get(name)
    return Path(value).expanduser() if value else None


def _platform_dir(kind: str) -> Path:
    # imported when asked: the workers an engine runs import this module, and an engine's
    # environment (vLLM and torch) need not have platformdirs (those workers get the folders
    # they use from the environment or their arguments)
    import platformdirs

    return Path(getattr(platformdirs, f"user_{kind}_path")("quantdeck"))


def config_dir() -> Path:
    """Settings and launch profiles: ``$QUANTDECK_CONFIG_DIR`` or the platform's config dir."""
    return _from_env(CONFIG_DIR_ENV) or _platform_dir("config")


def data_root() -> Path:
    """Models Quantdeck builds and saved runs: ``$QUANTDECK_DATA_DIR`` or the user data dir."""
    return _from_env(DATA_DIR_ENV) or _platform_dir("data")


def cache_dir() -> Path:
    """Engine probes, vLLM's and inductor's caches, server run folders: ``$QUANTDECK_CACHE_DIR``
    or the user cache dir."""
    return _from_env(CACHE_DIR_ENV) or _platform_dir("cache")


def probe_dir() -> Path:
    """What each engine accepts (its probe: a file per interpreter, vLLM version and probe
    schema): ``$QUANTDECK_PROBE_DIR`` or the cache folder's ``engines``. A probe describes an
    engine, not a user's state, so cache folders may share one (the test suite's per-worker
    folders do: a probe imports vLLM, ~10 s of a core)."""
    return _from_env(PROBE_DIR_ENV) or cache_dir() / "engines"


def write_atomic(path: Path, text: str, *, private: bool = True, replace: bool = True) -> None:
    """Write ``text`` to ``path`` so that readers see the old or the new file, never half: a
    uniquely named temporary sibling, fsynced, renamed into place.

    ``private`` (the default: saved files may hold keys or prompts) gives mode 0600, else 0644.
    ``replace=False`` never replaces an existing ``path``: :class:`FileExistsError` instead.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            os.fchmod(f.fileno(), 0o600 if private else 0o644)
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        move_file(Path(tmp), path, replace=replace)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def move_file(src: Path, dst: Path, *, replace: bool = True) -> None:
    """Rename ``src`` to ``dst`` in one step. Unless ``replace``, never over an existing ``dst``,
    even one that appeared after a check: :class:`FileExistsError` instead."""
    if replace:
        os.replace(src, dst)
    else:
        os.link(src, dst)
        os.unlink(src)


def write_json(
    path: Path, obj: Any, *, indent: int | None = 1, private: bool = True, replace: bool = True
) -> None:
    """:func:`write_atomic` of ``obj`` as JSON (anything not JSON written as its ``str``)."""
    text = json.dumps(obj, indent=indent, default=str)
    write_atomic(path, text, private=private, replace=replace)


# -- folders ---------------------------------------------------------------------------------

OUTPUT_MARKER = ".quantdeck-output"
# Demo model builds made before OUTPUT_MARKER existed carry only their own marker.
_LEGACY_MARKERS = {".quantdeck-demo.json": "demo-model"}


def output_kind(folder: Path) -> str | None:
    """The kind of output (``"conversion"``, ``"report"``...) Quantdeck's marker in ``folder``
    names; None when ``folder`` is not a real folder that Quantdeck made."""
    if folder.is_symlink() or not folder.is_dir():
        return None
    data = None
    marker = folder / OUTPUT_MARKER
    if marker.is_file():  # not a FIFO or a device, which could block or never end
        try:
            with open(marker, encoding="utf-8") as f:
                data = json.loads(f.read(4096))
        # RecursionError: 4096 bytes of "[" (core.schema, whose load_json bounds the nesting
        # of every other JSON read, sits beside this module, not under it)
        except (OSError, ValueError, RecursionError):
            pass
    if isinstance(data, dict) and isinstance(data.get("kind"), str):
        return data["kind"]
    return next((kind for name, kind in _LEGACY_MARKERS.items() if (folder / name).is_file()), None)


def refuse_overlap(output: Path | str, source: Path | str) -> None:
    """Refuse an output that is, is inside, or contains ``source`` (symbolic links resolved):
    writing there could change or remove the source. Call it before anything is created."""
    out, src = Path(output).expanduser().resolve(), Path(source).expanduser().resolve()
    if out == src:
        raise ConfigError(f"{output}: is the source folder")
    if out.is_relative_to(src):
        raise ConfigError(f"{output}: is inside the source folder {src}")
    if src.is_relative_to(out):
        raise ConfigError(f"{output}: contains the source folder {src}")


def check_output_dir(target: Path, kind: str, *, overwrite: bool = False) -> None:
    """Refuse, with one line, a ``target`` that :func:`atomic_dir` may not put a ``kind`` in.

    Free: no such path, or an empty folder. Replaceable: a folder holding Quantdeck's marker of
    the same ``kind``, and only when ``overwrite``. Anything else (a file, a symbolic link, a
    folder Quantdeck did not make) is never touched.
    """
    if target.is_symlink():
        raise ConfigError(f"{target}: is a symbolic link; Quantdeck does not replace it")
    if not target.exists():
        return
    if not target.is_dir():
        raise ConfigError(f"{target}: exists and is not a folder; Quantdeck does not replace it")
    if not any(target.iterdir()):
        return
    made = output_kind(target)
    if made is None:
        raise ConfigError(
            f"{target}: exists, is not empty and was not made by Quantdeck; choose another folder"
        )
    if made != kind:
        raise ConfigError(
            f"{target}: holds a Quantdeck {made}, not a {kind}; choose another folder"
        )
    if not overwrite:
        raise ConfigError(
            f"{target}: exists (a Quantdeck {kind}); remove it or choose another folder"
        )


@contextlib.contextmanager
def atomic_dir(target: Path, kind: str, *, overwrite: bool = False) -> Iterator[Path]:
    """Build a ``kind`` of output folder at ``target`` all or nothing.

    Yields a new temporary sibling ``.NAME.tmp-XXXX`` to fill. When the block ends normally,
    Quantdeck's marker goes in and the folder is renamed to ``target``; a previous output it
    replaces (see :func:`check_output_dir`, checked before and again at the end) is set aside
    and removed only once the new one is in place. When the block raises, the sibling is
    removed and ``target`` is as it was.
    """
    target = target.expanduser().absolute()
    check_output_dir(target, kind, overwrite=overwrite)
    made = [p for p in (target.parent, *target.parent.parents) if not p.exists()]  # deepest first
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    except OSError as e:
        raise QuantdeckError(f"{target}: cannot create the folder ({e.strerror or e})") from None
    try:
        tmp.chmod(0o755)  # mkdtemp makes it private; an output folder is ordinary data
        yield tmp
        write_json(tmp / OUTPUT_MARKER, {"kind": kind, "created": time.time()}, private=False)
        _move_into_place(tmp, target, kind, overwrite)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        for folder in made:  # the parents it made, when still empty
            with contextlib.suppress(OSError):
                folder.rmdir()
        raise


def _move_into_place(tmp: Path, target: Path, kind: str, overwrite: bool) -> None:
    """Rename ``tmp`` to ``target``. A free target is replaced by one rename, which fails on
    anything non-empty that appeared meanwhile; our own previous output is set aside first."""
    check_output_dir(target, kind, overwrite=overwrite)
    old: Path | None = None
    try:
        if output_kind(target) == kind:
            old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
            os.replace(target, old / target.name)
        try:
            os.replace(tmp, target)
        except OSError:
            if old is not None:  # put the previous output back
                os.replace(old / target.name, target)
                old.rmdir()
                old = None
            raise
    except OSError as e:
        raise QuantdeckError(
            f"{target}: cannot move the new folder into place ({e.strerror or e})"
        ) from None
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
