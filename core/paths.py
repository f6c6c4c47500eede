"""Quantdeck's folders and how files get into them.

One place for the user folders (config, data, cache: each overridable by an environment variable
for tests and portable set-ups), the shipped assets, and the atomic write every saved file goes
through.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import platformdirs

CONFIG_DIR_ENV = "QUANTDECK_CONFIG_DIR"
DATA_DIR_ENV = "QUANTDECK_DATA_DIR"
CACHE_DIR_ENV = "QUANTDECK_CACHE_DIR"

# assets/ is installed as quantdeck/assets, beside quantdeck/core; in a source tree it is the
# top-level assets/ folder beside core/. Either way: one level above this package.
ASSETS = Path(__file__).resolve().parents[1] / "assets"
CORPUS = ASSETS / "corpus"


def _from_env(name: str) -> Path | None:
    value = os.environ.get(name)
    return Path(value).expanduser() if value else None


def config_dir() -> Path:
    """Settings and launch profiles: ``$QUANTDECK_CONFIG_DIR`` or the platform's config dir."""
    return _from_env(CONFIG_DIR_ENV) or platformdirs.user_config_path("quantdeck")


def data_root() -> Path:
    """Models Quantdeck builds and saved runs: ``$QUANTDECK_DATA_DIR`` or the user data dir."""
    return _from_env(DATA_DIR_ENV) or platformdirs.user_data_path("quantdeck")


def cache_dir() -> Path:
    """Engine probes, vLLM's and inductor's caches, server run folders: ``$QUANTDECK_CACHE_DIR``
    or the user cache dir."""
    return _from_env(CACHE_DIR_ENV) or platformdirs.user_cache_path("quantdeck")


def write_atomic(path: Path, text: str) -> None:
    """Replace ``path`` with ``text`` so that readers see the old or the new file, never half:
    a temporary sibling, fsynced, renamed into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_json(path: Path, obj: Any, *, indent: int | None = 1) -> None:
    """:func:`write_atomic` of ``obj`` as JSON (anything not JSON written as its ``str``)."""
    write_atomic(path, json.dumps(obj, indent=indent, default=str))
