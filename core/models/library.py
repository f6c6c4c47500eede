"""The model library: model folders found under the user's folders and in the Hugging Face cache."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantdeck.core.errors import ModelError, QuantdeckError
from quantdeck.core.models.adapters import AdapterInfo, is_adapter_dir, read_adapter
from quantdeck.core.models.info import ModelInfo, inspect_model

_MAX_DEPTH = 3


@dataclass(frozen=True)
class LibraryEntry:
    """One model or LoRA adapter found: where, from which source, and what the inspector says
    (or why not). An adapter has ``adapter`` set and no ``info``."""

    name: str
    path: str
    source: str  # "folder" | "hf-cache"
    info: ModelInfo | None
    error: str | None = None
    adapter: AdapterInfo | None = None
    kind: str = "model"  # "model" | "adapter"

    @property
    def badge(self) -> str:
        """The format label a list shows: the model's, or ``LoRA-<rank>``; ``?`` when unread."""
        thing = self.adapter or self.info
        return thing.badge if thing else "?"

    @property
    def base_model(self) -> str | None:
        """The base model an adapter was made for, as its config names it."""
        return self.adapter.base_model if self.adapter else None

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "path": self.path,
            "source": self.source,
            "kind": self.kind,
            "badge": self.badge if self.adapter or self.info else None,
            "base_model": self.base_model,
            "adapter": self.adapter.to_json() if self.adapter else None,
            "architecture": self.info.architecture if self.info else None,
            "num_parameters": self.info.num_parameters if self.info else None,
            "weights_bytes": self.info.weights_bytes if self.info else None,
            "quantization": (
                self.info.quantization.__dict__ if self.info and self.info.quantization else None
            ),
            "error": self.error,
        }


def _entry(path: Path, name: str, source: str) -> LibraryEntry:
    """The folder's entry; a bad folder is listed with its one-line error, never raised, so
    one broken download does not hide the others."""
    kind = "adapter" if is_adapter_dir(path) else "model"
    try:
        if kind == "adapter":
            return LibraryEntry(
                name, str(path), source, None, adapter=read_adapter(path), kind=kind
            )
        return LibraryEntry(name, str(path), source, inspect_model(path))
    except QuantdeckError as e:
        return LibraryEntry(name, str(path), source, None, str(e), kind=kind)


def _is_model_dir(path: Path) -> bool:
    return (path / "config.json").is_file() or is_adapter_dir(path)


def _model_dirs(root: Path) -> Iterable[Path]:
    """Folders holding a config.json or an adapter_config.json, at most a few levels down (not
    inside a model)."""
    if _is_model_dir(root):
        yield root
        return
    stack = [(root, 0)]
    while stack:
        d, depth = stack.pop()
        try:
            children = sorted(p for p in d.iterdir() if p.is_dir() and not p.name.startswith("."))
        except OSError:
            continue
        for c in children:
            if _is_model_dir(c):
                yield c
            elif depth + 1 < _MAX_DEPTH:
                stack.append((c, depth + 1))


def scan_folders(folders: Iterable[str | os.PathLike[str]]) -> list[LibraryEntry]:
    out = []
    for f in folders:
        root = Path(f).expanduser()
        if not root.is_dir():
            raise ModelError(f"{root}: no such folder")
        for d in _model_dirs(root):
            out.append(_entry(d, d.name, "folder"))
    return out


def scan_hf_cache(cache_dir: str | os.PathLike[str] | None = None) -> list[LibraryEntry]:
    """Models in the Hugging Face hub cache (huggingface_hub's own scan), newest revision each."""
    from huggingface_hub import scan_cache_dir

    try:
        info = scan_cache_dir(None if cache_dir is None else Path(cache_dir))
    except Exception:  # no cache yet, or unreadable: an empty library, not an error
        return []
    out = []
    for repo in sorted(info.repos, key=lambda r: r.repo_id):
        if repo.repo_type != "model" or not repo.revisions:
            continue
        rev = max(repo.revisions, key=lambda r: r.last_modified)
        if _is_model_dir(Path(rev.snapshot_path)):
            out.append(_entry(Path(rev.snapshot_path), repo.repo_id, "hf-cache"))
    return out


def scan_library(
    folders: Iterable[str | os.PathLike[str]] = (),
    *,
    hf_cache: bool = True,
    cache_dir: str | os.PathLike[str] | None = None,
) -> list[LibraryEntry]:
    entries = scan_folders(folders)
    if hf_cache:
        entries += scan_hf_cache(cache_dir)
    return entries
