"""Launch profiles: the YAML that ``vllm serve --config FILE`` reads, kept in the config dir.

Saved atomically (write a temporary file beside the target, fsync, rename), so a crash never
leaves half a profile behind. A profile never holds the API key: on request it is kept in the OS
keyring (the ``keyring`` package) under the profile's name, or not kept at all.

A profile records the vLLM version it was saved for in its first line, a YAML comment
(``# saved with vLLM 0.32.0``), so the file stays one that ``vllm serve --config`` reads;
:func:`read_file` returns it (None for a profile saved before, or edited without it), for
:mod:`quantdeck.core.launch.migrate` when the profile launches on another engine.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from quantdeck.core.errors import ConfigError
from quantdeck.core.launch.config import LaunchConfig
from quantdeck.core.launch.knobs import from_yaml, to_yaml, validate
from quantdeck.core.launch.planner import local_vllm_version
from quantdeck.core.paths import config_dir, write_atomic
from quantdeck.core.schema import read_bounded, shown

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._ -]{0,79}")  # whole name: fullmatch, no newline
_MAX_BYTES = 2**20  # a profile is a few hundred bytes
# the first line of a profile: the vLLM version it was saved for
_SAVED_WITH = re.compile(r"#[ \t]*saved with vLLM ([0-9][0-9A-Za-z.+_-]{0,63})[ \t]*\r?(?:\n|$)")


def profiles_dir() -> Path:
    return config_dir() / "profiles"


def profile_path(name: str) -> Path:
    if not _NAME.fullmatch(name):
        raise ConfigError(
            f"profile name {shown(name)}: use letters, digits, space, '.', '_' or '-'"
        )
    return profiles_dir() / f"{name}.yaml"


def save_profile(name: str, cfg: LaunchConfig, *, vllm_version: str | None = None) -> Path:
    """Save ``cfg`` as profile ``name``, recording ``vllm_version`` (the engine's vLLM it was
    made for; default: the vLLM installed beside Quantdeck, the default engine's)."""
    validate(cfg)
    path = profile_path(name)
    version = vllm_version or local_vllm_version()
    head = (
        f"# saved with vLLM {version}\n"
        if version and _SAVED_WITH.match(f"# saved with vLLM {version}")
        else ""
    )
    write_atomic(path, head + to_yaml(cfg))
    return path


def saved_with(text: str) -> str | None:
    """The vLLM version a profile's text records in its first line, or None."""
    m = _SAVED_WITH.match(text)
    return m.group(1) if m else None


def read_file(path: str | os.PathLike[str]) -> tuple[LaunchConfig, str | None]:
    """A profile file (size-bounded) and the vLLM version it was saved with (None: not
    recorded); any damage is a ConfigError naming the file."""
    p = Path(path)
    raw = read_bounded(p, _MAX_BYTES, "profile")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{p}: not UTF-8 text") from None
    return from_yaml(text, where=str(p)), saved_with(text)


def load_file(path: str | os.PathLike[str]) -> LaunchConfig:
    """Read a profile file (size-bounded); any damage is a ConfigError naming the file."""
    return read_file(path)[0]


def read_profile(name: str) -> tuple[LaunchConfig, str | None]:
    """The profile, with its API key from the keyring when one was remembered, and the vLLM
    version it was saved with (None: not recorded)."""
    cfg, version = read_file(profile_path(name))
    cfg.server.api_key = remembered_key(name)
    return cfg, version


def load_profile(name: str) -> LaunchConfig:
    """The profile, with its API key from the keyring when one was remembered."""
    return read_profile(name)[0]


KEYRING_SERVICE = "quantdeck"


def remember_key(name: str, key: str) -> str | None:
    """Keep profile ``name``'s API key in the OS keyring. Returns None, or the one line to
    show when no keyring works (then the key is not kept anywhere)."""
    profile_path(name)  # the same names as profile files
    try:
        import keyring

        keyring.set_password(KEYRING_SERVICE, f"profile:{name}", key)
    except Exception as e:  # (NoKeyringError, or any backend's own error)
        return f"no working keyring ({type(e).__name__}): the API key is not remembered"
    return None


def remembered_key(name: str) -> str | None:
    """Profile ``name``'s API key from the OS keyring; None when none is kept (or none works)."""
    try:
        import keyring

        return keyring.get_password(KEYRING_SERVICE, f"profile:{name}")
    except Exception:  # (no keyring is the normal state on a server)
        return None


def _forget_key(name: str) -> None:
    try:
        import keyring

        keyring.delete_password(KEYRING_SERVICE, f"profile:{name}")
    except Exception:  # (nothing kept, or no keyring: nothing to forget)
        pass


def delete_profile(name: str) -> None:
    p = profile_path(name)
    if not p.exists():
        raise ConfigError(f"profile '{name}' does not exist")
    p.unlink()
    _forget_key(name)


def list_profiles() -> list[str]:
    d = profiles_dir()
    if not d.is_dir():
        return []
    return sorted(p.stem for p in d.glob("*.yaml"))
