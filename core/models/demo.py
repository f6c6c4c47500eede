"""The built-in demo model: where it lives, whether it is built, and building it.

Plain Python (it runs in the GUI process): the training itself happens in a subprocess,
``python -m quantdeck.core.workers.demo_train``, which is the only place that imports torch. A
build goes through :func:`quantdeck.core.paths.atomic_dir`: it writes into a sibling temp folder
``.quantdeck-demo.tmp-XXXX``; only when it succeeded is the marker file written and the folder
renamed into place, so a half-built model is never seen. An earlier demo build is replaced; any
other file or folder at the target is refused and left as it is. One build at a time per target,
across processes (a panel and a CLI on their first start, two test workers): the others wait on
its lock and use what it built.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from quantdeck.core.errors import ConfigError, ModelError
from quantdeck.core.events import DoneEvent, Event
from quantdeck.core.paths import atomic_dir, check_output_dir, data_root
from quantdeck.core.procs import spawn, subprocess_env, worker_command, worker_events
from quantdeck.core.schema import load_json

DEMO_MODEL_NAME = "quantdeck-demo"
MARKER_NAME = ".quantdeck-demo.json"
# Bump when core/demo_train.py or the corpus changes what gets built: older builds are redone.
RECIPE_VERSION = 1

_REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")

ProgressCallback = Callable[[Event], None]


def default_demo_dir() -> Path:
    """Where the demo model is kept: ``<data root>/models/quantdeck-demo``."""
    return data_root() / "models" / DEMO_MODEL_NAME


def is_complete(path: Path | str) -> bool:
    """True when ``path`` holds a finished build of the current recipe."""
    path = Path(path)
    try:
        marker = load_json((path / MARKER_NAME).read_bytes(), str(path / MARKER_NAME))
    except (OSError, ConfigError):
        return False
    if not isinstance(marker, dict) or marker.get("recipe") != RECIPE_VERSION:
        return False
    return all((path / name).is_file() for name in _REQUIRED_FILES)


def _run_build(
    cmd: list[str], on_progress: ProgressCallback | None
) -> tuple[int, DoneEvent | None, str]:
    """Run the build, feeding stdout's JSON lines to ``on_progress``.

    Returns (exit code, the "done" event or None, the last non-empty stderr line).
    """
    proc = spawn(  # its own group, dies with us, leased
        cmd,
        kind="demo model build",
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        encoding="utf-8",
        errors="replace",
        env=subprocess_env({"PYTHONUNBUFFERED": "1"}),
    )
    err_lines: list[str] = []

    def drain_stderr() -> None:
        assert proc.stderr is not None
        err_lines.extend(proc.stderr)

    reader = threading.Thread(target=drain_stderr, daemon=True)
    reader.start()
    done: DoneEvent | None = None
    try:
        assert proc.stdout is not None
        for event in worker_events(proc.stdout, stamp=False):
            if isinstance(event, DoneEvent):
                done = event
            if on_progress is not None:
                on_progress(event)
        rc = proc.wait()
    finally:
        if proc.poll() is None:  # on_progress raised: stop the build
            proc.kill()
            proc.wait()
        reader.join(timeout=5)
    last_err = next((ln.strip() for ln in reversed(err_lines) if ln.strip()), "")
    return rc, done, last_err


def build_lock_path(target: Path) -> Path:
    """The lock file a build of ``target`` holds (an ``flock``), beside it: ``.NAME.lock``."""
    return target.parent / f".{target.name}.lock"


@contextlib.contextmanager
def _build_lock(target: Path) -> Iterator[None]:
    """Hold ``target``'s build lock, waiting while another process (or thread) builds it.
    Folders it had to make for the lock go again, with the lock, when they hold nothing else
    (a failed first build leaves no trace)."""
    made = [p for p in (target.parent, *target.parent.parents) if not p.exists()]  # deepest first
    path = build_lock_path(target)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        lock = open(path, "ab")  # noqa: SIM115 (closed below: the lock goes with it)
    except OSError as exc:
        raise ModelError(f"cannot lock the demo model's folder {target.parent}: {exc}") from exc
    try:
        with lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            yield
    finally:
        if made:
            path.unlink(missing_ok=True)
            for folder in made:
                with contextlib.suppress(OSError):
                    folder.rmdir()


def ensure_demo_model(
    path: Path | None = None,
    *,
    python: str | None = None,
    on_progress: ProgressCallback | None = None,
    force: bool = False,
) -> Path:
    """Return the demo model folder, building it first unless a complete build is there.

    ``python`` is the interpreter that has torch and transformers (default: this one);
    ``on_progress`` receives each JSON event the build prints. Raises :class:`ModelError`
    when the build fails and :class:`ConfigError` when something other than a demo build is
    at ``path``; no temp folder is left behind.
    """
    target = Path(path) if path is not None else default_demo_dir()
    target = target.expanduser().absolute()
    if not force and is_complete(target):
        return target
    check_output_dir(target, "demo-model", overwrite=True)  # a refusal leaves no lock file
    with _build_lock(target):
        if not force and is_complete(target):  # built by another process while we waited
            return target
        _build(target, python, on_progress)
    return target


def _build(target: Path, python: str | None, on_progress: ProgressCallback | None) -> None:
    """Build the demo model at ``target`` (its lock held)."""
    with atomic_dir(target, "demo-model", overwrite=True) as tmp:
        cmd = worker_command("demo_train", str(tmp), python=python)
        try:
            rc, done, last_err = _run_build(cmd, on_progress)
        except OSError as exc:
            raise ModelError(f"cannot start the demo model build ({cmd[0]}): {exc}") from exc
        if rc != 0 or done is None:
            why = last_err or (f"exit code {rc}" if rc else "no 'done' event")
            raise ModelError(f"building the demo model failed: {why}")
        marker = {
            "recipe": RECIPE_VERSION,
            "name": DEMO_MODEL_NAME,
            **{
                k: done.result[k]
                for k in ("seconds", "final_loss", "initial_loss", "steps", "seed")
                if k in done.result
            },
        }
        try:
            (tmp / MARKER_NAME).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")
        except OSError as exc:
            raise ModelError(f"cannot write the demo model's marker in {tmp}: {exc}") from exc
