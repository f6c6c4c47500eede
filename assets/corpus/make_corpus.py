"""Regenerate train.txt / heldout.txt from CPython's ``pydoc_data.topics`` (PSF license).

Run with the interpreter whose documentation you want (the committed files came from
CPython 3.11.7)::

    python assets/corpus/make_corpus.py

The split is deterministic: topics are ordered by the SHA-256 of their name and whole
topics go to the held-out set until it holds about 25-35 KB; everything else is training text.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from pydoc_data.topics import topics

HERE = Path(__file__).resolve().parent
HELDOUT_TARGET = 25_000  # characters
HELDOUT_MAX_TOPIC = 12_000  # keep many small topics rather than one big one

_UNDERLINE = re.compile(r"^\s*([*=\-~^#])\1{2,}\s*$")
_EMPHASIS = re.compile(r"\*\*(.+?)\*\*|\*(\S(?:.*?\S)?)\*")
_ASCII = str.maketrans(
    {
        "\u2019": "'",
        "\u2018": "'",
        "\u201c": '"',
        "\u201d": '"',
        "\u2013": "-",
        "\u2014": "-",
        "\u2026": "...",
        "\u00a0": " ",
    }
)


def _is_code_block(lines: list[str]) -> bool:
    """An indented block that reads like code or grammar rather than prose."""
    if not all(line.startswith(" ") for line in lines):
        return False
    text = " ".join(line.strip() for line in lines)
    if "::=" in text or text.startswith((">>>", "...", "|")):
        return True
    prose = re.search(r"[a-z]{2,}[.,;] ", text + " ") and text.endswith((".", ":", "?", "!"))
    return not prose


def clean(text: str) -> str:
    """Strip the rendered reST roughly: underlines, grammar, code samples, emphasis."""
    blocks: list[list[str]] = [[]]
    for line in text.translate(_ASCII).splitlines():
        if not line.strip():
            blocks.append([])
        elif not _UNDERLINE.match(line):
            blocks[-1].append(line.rstrip())
    kept = []
    for block in blocks:
        block = [
            ln for ln in block if "::=" not in ln and not ln.lstrip().startswith((">>>", "... "))
        ]
        if block and not _is_code_block(block):
            kept.append("\n".join(block))
    out = "\n\n".join(kept)
    out = _EMPHASIS.sub(lambda m: m.group(1) or m.group(2), out)
    return out.strip() + "\n"


def main() -> None:
    """Write train.txt and heldout.txt next to this script."""
    names = sorted(topics, key=lambda n: hashlib.sha256(n.encode()).hexdigest())
    cleaned = {n: clean(topics[n]) for n in names}
    heldout: list[str] = []
    size = 0
    for name in names:
        if size >= HELDOUT_TARGET:
            break
        if len(cleaned[name]) <= HELDOUT_MAX_TOPIC:
            heldout.append(name)
            size += len(cleaned[name])
    train = [n for n in sorted(topics) if n not in heldout]
    (HERE / "train.txt").write_text("\n\n".join(cleaned[n] for n in train), encoding="utf-8")
    (HERE / "heldout.txt").write_text(
        "\n\n".join(cleaned[n] for n in sorted(heldout)), encoding="utf-8"
    )
    print("heldout topics:", ", ".join(sorted(heldout)))


if __name__ == "__main__":
    main()
