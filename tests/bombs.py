"""Small files that unpack or expand to very large ones, made a block at a time in the test's
own folder: a gzip bomb recording and a YAML alias bomb fleet file (issue 31)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

RECORDING_HEADER = {"event": "recording", "version": 1, "t": 1.0, "source": "serve"}
METRICS = {"event": "metrics", "t": 2.0, "kv_usage_pct": 5.0, "running": 1, "gpus": []}
# one line of a recording, about 1 KB as a GPU host's metrics line: 200 MB of it passes the
# reader's byte cap before its line cap; the short one passes the line cap first
LONG_LINE = json.dumps({**METRICS, "error": "x" * 900}).encode() + b"\n"
SHORT_LINE = json.dumps(METRICS).encode() + b"\n"


def gzip_bomb(path: Path, line: bytes, unpacked: int) -> Path:
    """A recording header, then ``line`` repeated to ``unpacked`` bytes, gzipped a block at a
    time (never held whole): 200 MB of one line packs to about 1 MB."""
    block = line * max(1, 2**20 // len(line))
    with gzip.open(path, "wb", compresslevel=1) as f:
        f.write(json.dumps(RECORDING_HEADER).encode() + b"\n")
        for _ in range(unpacked // len(block) + 1):
            f.write(block)
    return path


def alias_bomb(levels: int = 9, width: int = 9) -> str:
    """A fleet file with nine levels of nine aliases under ``cpus:``: 9**9 (387 million) CPU
    numbers in about 600 bytes, the tester's 638-byte file in form."""
    lists = [f"&l0 [{', '.join(['0'] * width)}]"]
    lists += [f"&l{n} [{', '.join([f'*l{n - 1}'] * width)}]" for n in range(1, levels)]
    return (
        f"instances:\n  - name: a\n    profile: {{model: model}}\n    cpus: [{', '.join(lists)}]\n"
    )
