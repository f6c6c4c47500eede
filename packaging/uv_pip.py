"""``uv pip install`` from the sources pip is configured with, resolving as pip does.

    VENV/bin/python packaging/uv_pip.py [--pytorch-cpu-index] ARGS...   # e.g. -e ".[cpu,test]"

uv does not read pip's configuration. This reads it (``pip config list``: its files and the
``PIP_*`` variables) and hands uv the index URLs, find-links and constraint files, and pip's
certificate file as ``SSL_CERT_FILE``, all in uv's environment variables (an index URL may
carry a password: never on the command line); a variable the user set wins. uv picks the best
version across all indexes, as pip does, and installs into the Python that runs this, compiling
the bytecode as pip does. ``--pytorch-cpu-index`` adds PyTorch's CPU wheel index to the extra
indexes. The exit status is uv's (127 if uv is not installed beside that Python).
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

PYTORCH_CPU = "https://download.pytorch.org/whl/cpu"
# pip's setting -> uv's variable, and how uv separates the items of a list
VARIABLES = {
    "index-url": ("UV_INDEX_URL", " "),
    "extra-index-url": ("UV_EXTRA_INDEX_URL", " "),
    "find-links": ("UV_FIND_LINKS", ","),
    "constraint": ("UV_CONSTRAINT", " "),
}


def pip_sources() -> dict[str, str]:
    """uv's environment for pip's configured sources."""
    out = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, check=True
    ).stdout
    items: dict[str, list[str]] = {}
    env: dict[str, str] = {}
    for line in out.splitlines():
        key, _, raw = line.partition("=")
        name = key.rsplit(".", 1)[-1]
        try:
            value = str(ast.literal_eval(raw))
        except (ValueError, SyntaxError):
            continue
        if name == "cert" and value:
            env["SSL_CERT_FILE"] = value
        elif name in VARIABLES:
            seen = items.setdefault(name, [])
            seen += [v for v in value.split() if v not in seen]
    for name, values in items.items():
        variable, sep = VARIABLES[name]
        env[variable] = sep.join(values[-1:] if name == "index-url" else values)
    return env


def main(argv: list[str]) -> int:
    uv = Path(sys.executable).with_name("uv")
    if not uv.is_file():
        return 127
    env = {**pip_sources(), **os.environ}  # a variable the user set wins
    if argv[:1] == ["--pytorch-cpu-index"]:
        argv = argv[1:]
        extra = [env.get("UV_EXTRA_INDEX_URL", ""), PYTORCH_CPU]
        env["UV_EXTRA_INDEX_URL"] = " ".join(filter(None, extra))
    cmd = [str(uv), "pip", "install", "-q", "--python", sys.executable, "--compile-bytecode"]
    cmd += ["--index-strategy", "unsafe-best-match", *argv]
    return subprocess.run(cmd, env=env).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
