"""Launch profiles: the YAML that ``vllm serve --config FILE`` reads, kept in the config dir.

Saved atomically (write a temporary file beside the target, fsync, rename), so a crash never
leaves half a profile behind.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from quantdeck.core.errors import ConfigError
from quantdeck.core.launch.config import LaunchConfig
from quantdeck.core.launch.knobs import from_yaml, to_yaml, validate
from quantdeck.core.paths import config_dir, write_atomic

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._ -]{0,79}$")


def profiles_dir() -> Path:
    return config_dir() / "profiles"


def profile_path(name: str) -> Path:
    if not _NAME.match(name):
        raise ConfigError(f"profile name '{name}': use letters, digits, space, '.', '_' or '-'")
    return profiles_dir() / f"{name}.yaml"


def save_profile(name: str, cfg: LaunchConfig) -> Path:
    validate(cfg)
    path = profile_path(name)
    write_atomic(path, to_yaml(cfg))
    return path


def load_file(path: str | os.PathLike[str]) -> LaunchConfig:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{p}: no such profile file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{p}: cannot read ({getattr(e, 'strerror', None) or e})") from None
    return from_yaml(text, where=str(p))


def load_profile(name: str) -> LaunchConfig:
    return load_file(profile_path(name))


def delete_profile(name: str) -> None:
    p = profile_path(name)
    if not p.exists():
        raise ConfigError(f"profile '{name}' does not exist")
    p.unlink()


def list_profiles() -> list[str]:
    d = profiles_dir()
    if not d.is_dir():
        return []
    return sorted(p.stem for p in d.glob("*.yaml"))
