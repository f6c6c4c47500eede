"""What a server leaves behind, and its removal: run folders (the newest kept), the engine's
TMPDIR (short where the run folder's path is too long for vLLM's sockets), the shared memory
its processes mapped in /dev/shm, and which of its processes still run."""

from __future__ import annotations

import itertools
import logging
import os
import re
import shutil
import signal
import stat
import tempfile
import time
from pathlib import Path

import psutil

from quantdeck.core.errors import ServerError
from quantdeck.core.paths import cache_dir
from quantdeck.core.procs import group_pids, live_lease_dirs
from quantdeck.core.shm import ShmLedger

log = logging.getLogger("quantdeck.server")
RUN_DIRS_KEPT = 20  # server run folders (log, temp files) kept under cache_dir()/runs
_RUN_DIR_NAME = re.compile(r"^\d{8}-\d{6}(-\d+)?$")


def alive_pids(pids: set[int]) -> set[int]:
    """The pids that still run. A zombie (exited, not yet reaped) counts as gone, and so does
    a process with SIGKILL pending: it only waits for the kernel (a large process's exit can
    take seconds), and nothing it does any more can be waited for."""
    out = set()
    for p in pids:
        try:
            if psutil.Process(p).status() != psutil.STATUS_ZOMBIE and not _kill_pending(p):
                out.add(p)
        except psutil.Error:
            pass
    return out


_SIGKILL_BIT = 1 << (signal.SIGKILL - 1)
_PF_EXITING = 0x4  # the kernel's task flag: the process is exiting


def _kill_pending(pid: int) -> bool:
    """Whether ``pid`` is on its way out: exiting in the kernel, or SIGKILL waits to be
    delivered (Linux: /proc/PID/stat's flags, /proc/PID/status's pending masks; elsewhere
    False)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            stat = f.read()
        if int(stat[stat.rindex(")") + 2 :].split()[6]) & _PF_EXITING:
            return True
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith(("SigPnd:", "ShdPnd:")) and int(line.split()[1], 16) & (
                    _SIGKILL_BIT
                ):
                    return True
    except (OSError, ValueError, IndexError):
        pass
    return False


def new_run_dir() -> Path:
    """A fresh run folder under ``cache_dir()/runs``, created here so that no other server (in
    this process or another) gets it: the time (names sort by age), and ``-2``, ``-3``... for
    more in the same second. Short: vLLM's IPC sockets live in its ``tmp`` folder, and a socket
    path may not exceed 107 bytes."""
    root = cache_dir() / "runs"
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for count in itertools.count(1):
        path = root / (stamp if count == 1 else f"{stamp}-{count}")
        try:
            path.mkdir(mode=0o700)  # private: its log and traces hold prompts
        except FileExistsError:
            continue
        return path
    raise AssertionError("unreachable")


def prune_run_dirs(root: Path, keep: int = RUN_DIRS_KEPT, *, spare: Path | None = None) -> None:
    """Remove all but the newest ``keep`` run folders under ``root``; never ``spare``, the
    folder of a server that still runs, or a folder Quantdeck did not name."""
    try:
        dirs = sorted(
            p for p in root.iterdir() if _RUN_DIR_NAME.match(p.name) and not p.is_symlink()
        )
    except OSError:
        return
    busy = live_lease_dirs() | {spare}
    for d in dirs[: max(0, len(dirs) - keep)]:
        if d not in busy and d.is_dir():
            drop_engine_tmp(d)
            shutil.rmtree(d, ignore_errors=True)


# vLLM binds its ZMQ IPC sockets at $TMPDIR/<uuid4> (37 bytes more), and a Unix socket path
# may not exceed 107 bytes: a run folder deep in a long cache path (/check/work/main/.cache/...)
# gets its temp folder under a short private root instead, linked from the run folder.
_ENGINE_TMP_MAX = 107 - 38


def _short_tmp_path() -> Path:
    """Where the short TMPDIRs live: ``quantdeck-UID`` in the temp folder, or in /tmp where
    the temp folder's own path is long."""
    base = Path(tempfile.gettempdir())
    if len(os.fsencode(base)) > 32:
        base = Path("/tmp")
    return base / f"quantdeck-{os.getuid()}"


def _short_tmp_root() -> Path:
    """:func:`_short_tmp_path`, made 0700 if missing; one that is not a private folder of this
    user is refused, not used."""
    root = _short_tmp_path()
    try:
        root.mkdir(mode=0o700)
    except FileExistsError:
        pass
    st = root.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise ServerError(
            f"{root} is not a private folder of this user, so the server's sockets cannot "
            "live there: remove it, or set QUANTDECK_CACHE_DIR to a shorter path"
        )
    return root


def engine_tmp_dir(run_dir: Path) -> Path:
    """The server's TMPDIR, empty: ``run_dir/tmp``, or, where that path is too long for vLLM's
    sockets, a fresh folder under :func:`_short_tmp_root` that ``run_dir/tmp`` links to. A run
    folder used again (a restart) gets its ``tmp`` emptied of what the last server left (its
    IPC sockets), unless a live child of Quantdeck still works there."""
    tmp = run_dir / "tmp"
    if tmp.is_symlink():
        drop_engine_tmp(run_dir)
    if len(os.fsencode(tmp)) <= _ENGINE_TMP_MAX:
        if tmp.is_dir() and run_dir not in live_lease_dirs():
            shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(mode=0o700, parents=True, exist_ok=True)
        return tmp
    root = _short_tmp_root()
    _sweep_short_tmp(root)
    short = Path(tempfile.mkdtemp(prefix=f"run-{os.getpid()}-", dir=root))
    run_dir.mkdir(parents=True, exist_ok=True)
    tmp.symlink_to(short, target_is_directory=True)
    return short


_SHORT_TMP = re.compile(r"^run-(\d+)-")


def _sweep_short_tmp(root: Path) -> None:
    """Remove the short temp folders whose Quantdeck process is gone (killed before it could
    remove them): each is named after the process that made it."""
    for entry in root.iterdir():
        m = _SHORT_TMP.match(entry.name)
        if m and not psutil.pid_exists(int(m.group(1))) and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)


def drop_engine_tmp(run_dir: Path) -> None:
    """Remove the short temp folder ``run_dir/tmp`` links to (only one Quantdeck made: under
    its short root) and the link; a plain ``tmp`` folder goes with its run folder."""
    link = run_dir / "tmp"
    if not link.is_symlink():
        return
    target = Path(os.readlink(link))
    if target.parent == _short_tmp_path() and _SHORT_TMP.match(target.name):
        shutil.rmtree(target, ignore_errors=True)
    try:
        link.unlink()
    except OSError:
        pass


def process_tree(pid: int) -> set[int]:
    """``pid`` and its descendants, as they run now."""
    try:
        return {pid} | {c.pid for c in psutil.Process(pid).children(recursive=True)}
    except psutil.Error:
        return set()


def sweep_shm(shm: ShmLedger, pgid: int, wait: float = 10.0) -> None:
    """Once the server's group ``pgid`` is gone (at most ``wait`` seconds), remove what it
    left in /dev/shm (:meth:`ShmLedger.sweep`: only what its processes were seen to map)."""
    deadline = time.monotonic() + wait
    while group_pids(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    try:
        removed = shm.sweep()
    except OSError as e:  # no /proc to look into (not Linux): nothing is removed
        log.info("/dev/shm not swept: %s", e)
        return
    if removed:
        log.info("removed what the server left in /dev/shm: %s", ", ".join(removed))
