"""Supervising our own subprocesses: how they start, how they die with us, the leases that let
the next start find any left behind, their environment and the reader side of the workers'
line protocol (:mod:`quantdeck.core.workers.protocol`).

Every long-lived child (a vLLM server, a conversion, the demo build, the quality check) starts
through :func:`spawn`: in a session of its own (its whole group can be signalled) and, on Linux,
with a parent-death signal, so that a Quantdeck killed with -9, crashed or closed with its
terminal takes its children along. Linux sends that signal when the *thread* that forked the
child ends, so :func:`spawn` forks from a thread that lives as long as the process. Each child
also gets a lease file (pid, its start time, owner) until it is reaped; a lease whose owner is
dead but whose process still runs is a leftover that :func:`leftovers` lists and
:func:`stop_leftover` stops (never a process that merely reuses the pid).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import psutil

from quantdeck.core.errors import QuantdeckError
from quantdeck.core.events import Event, LogEvent, from_json
from quantdeck.core.paths import cache_dir, write_atomic
from quantdeck.core.shm import sweep_record

# A child learns its owner's pid here (the engine worker watches it: see workers/engine.py).
OWNER_PID_ENV = "QUANTDECK_OWNER_PID"
PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
T = TypeVar("T")
# The signals that ask the CLI and the panel to stop cleanly: Ctrl-C, kill (or a service
# manager), and a closed terminal.
STOP_SIGNALS: tuple[signal.Signals, ...] = tuple(
    getattr(signal, n) for n in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, n)
)


def subprocess_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for a worker or engine subprocess: ours, plus ``extra``."""
    return {**os.environ, **(extra or {})}


# The workers that need only the standard library and vLLM: another interpreter (an engine
# without Quantdeck, another Python version) runs them from their file. ``runpy.run_path``
# runs a file without putting its folder on sys.path (``python FILE`` would, and the workers'
# folder would then shadow top-level modules named like them).
STANDALONE_WORKERS = frozenset({"engine", "probe", "router"})
CORE_DIR = Path(__file__).resolve().parent
WORKERS_DIR = CORE_DIR / "workers"
RUN_FILE = "import runpy, sys; runpy.run_path(sys.argv.pop(1), run_name='__main__')"
# The other workers (conversion, quality, the demo build) need Quantdeck's core: another
# interpreter runs them with a folder holding only ``quantdeck/core`` first on its sys.path.
RUN_MODULE = (
    "import runpy, sys; sys.path.insert(0, sys.argv.pop(1)); m = sys.argv.pop(1); "
    "runpy.run_module(m, run_name='__main__', alter_sys=True)"
)
NO_PYTHON = (
    "this Quantdeck is a standalone bundle, without a Python of its own: "
    "it runs vLLM and its jobs in an engine (quantdeck engines add PATH, a Python with vLLM)"
)


def frozen() -> bool:
    """This process is a standalone bundle (PyInstaller): ``sys.executable`` is the app, no
    Python that could run a worker."""
    return bool(getattr(sys, "frozen", False))


def own_python() -> str:
    """This process's interpreter, for a worker that no engine was named for; a bundle has
    none (one :class:`QuantdeckError` line that says what to do)."""
    if frozen():
        raise QuantdeckError(NO_PYTHON)
    return sys.executable


def core_path() -> Path:
    """A folder holding only ``quantdeck/core`` (a link to this package's folder, made once in
    the cache), to put first on another interpreter's sys.path: there the workers import
    Quantdeck's core and nothing else of this installation (a bundle's or a venv's compiled
    packages are for this Python, not that one)."""
    digest = hashlib.sha256(str(CORE_DIR).encode()).hexdigest()[:16]
    root = cache_dir() / "core-path" / digest
    link = root / "quantdeck" / "core"
    if link.is_symlink() and link.resolve() == CORE_DIR:
        return root
    link.parent.mkdir(parents=True, exist_ok=True)
    tmp = link.parent / f".core.{os.getpid()}.{threading.get_ident()}.tmp"
    tmp.unlink(missing_ok=True)  # ours: a name only this process and thread use, in our cache
    tmp.symlink_to(CORE_DIR, target_is_directory=True)
    os.replace(tmp, link)  # a link renamed over a link: readers see the old one or the new
    return root


def worker_command(module: str, *args: str, python: str | None = None) -> list[str]:
    """``python -m quantdeck.core.workers.MODULE ARGS`` in this interpreter. In another one (an
    engine, where Quantdeck need not be installed): a stand-alone worker from its file,
    ``python -c RUN_FILE .../workers/MODULE.py ARGS``; any other with :func:`core_path` first
    on its sys.path, ``python -c RUN_MODULE PATH quantdeck.core.workers.MODULE ARGS``."""
    exe = python or own_python()
    if frozen() or os.path.abspath(exe) != os.path.abspath(sys.executable):
        if module in STANDALONE_WORKERS:
            return [exe, "-c", RUN_FILE, str(WORKERS_DIR / f"{module}.py"), *args]
        return [exe, "-c", RUN_MODULE, str(core_path()), f"quantdeck.core.workers.{module}", *args]
    return [exe, "-m", f"quantdeck.core.workers.{module}", *args]


# -- children that die with us -----------------------------------------------------------------
def _libc_prctl() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _libc_prctl()  # looked up once: nothing is loaded between fork and exec


def die_with_parent_hook(sig: int) -> Callable[[], None] | None:
    """A pre-exec hook that gives the child the parent-death signal ``sig`` (None off Linux).
    Should the parent have died before the hook ran, the child exits at once."""
    if _PRCTL is None:
        return None
    parent, signum = os.getpid(), int(sig)  # nothing computed between fork and exec

    def hook() -> None:
        _PRCTL(PR_SET_PDEATHSIG, signum, 0, 0, 0)
        if os.getppid() != parent:
            os._exit(128 + signum)

    return hook


_spawner: ThreadPoolExecutor | None = None
_spawner_pid = 0
_spawner_lock = threading.Lock()


def _on_long_lived_thread(fn: Callable[[], T]) -> T:
    """Run ``fn`` on the main thread or on one thread kept for the life of the process: the
    parent-death signal fires when the forking thread ends, and GUI workers are short-lived."""
    global _spawner, _spawner_pid
    if threading.current_thread() is threading.main_thread():
        return fn()
    with _spawner_lock:
        if _spawner is None or _spawner_pid != os.getpid():  # (a forked copy has no thread)
            _spawner = ThreadPoolExecutor(1, thread_name_prefix="quantdeck-spawn")
            _spawner_pid = os.getpid()
        spawner = _spawner
    return spawner.submit(fn).result()


class Child(subprocess.Popen[Any]):
    """A child started by :func:`spawn`: its lease goes once it has been reaped."""

    lease: Path | None = None

    def poll(self) -> int | None:
        rc = super().poll()
        if rc is not None:
            self.release()
        return rc

    def wait(self, timeout: float | None = None) -> int:
        rc = super().wait(timeout)
        self.release()
        return rc

    def release(self) -> None:
        lease, self.lease = self.lease, None
        if lease is not None:
            lease.unlink(missing_ok=True)


def spawn(
    cmd: list[str],
    *,
    kind: str,
    port: int | None = None,
    deathsig: int = signal.SIGKILL,
    env: dict[str, str] | None = None,
    **popen: Any,
) -> Child:
    """Start ``cmd`` as a long-lived child: its own session, the parent-death signal
    ``deathsig``, a lease under :func:`lease_dir` (``kind`` and ``port`` say what it is);
    ``popen`` are :class:`subprocess.Popen`'s other arguments."""
    env = {**(os.environ if env is None else env), OWNER_PID_ENV: str(os.getpid())}
    hook = die_with_parent_hook(deathsig)
    proc = _on_long_lived_thread(
        lambda: Child(cmd, env=env, start_new_session=True, preexec_fn=hook, **popen)
    )
    try:
        proc.lease = write_lease(proc.pid, kind, port=port, cwd=popen.get("cwd"))
    except (OSError, psutil.Error):
        pass  # no lease (a read-only cache): the child still dies with us
    return proc


def signal_group(pid: int, sig: int) -> None:
    """``sig`` to the process group that ``pid`` leads (gone or not ours: nothing)."""
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def run_child(
    cmd: list[str], *, kind: str, timeout: float, **popen: Any
) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` through :func:`spawn` to its end, its output captured as text (as
    ``subprocess.run``). Past ``timeout`` seconds its group is killed and
    :class:`QuantdeckError` says so."""
    with spawn(
        cmd, kind=kind, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **popen
    ) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            signal_group(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise QuantdeckError(
                f"the {kind} did not finish within {timeout:g} s and was stopped"
            ) from None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


@dataclass(frozen=True)
class CappedRun:
    """What :func:`run_capped` read of a child: its output (each stream at most the cap) and
    its exit status; ``stopped`` says why it was killed before it ended on its own."""

    returncode: int
    stdout: bytes
    stderr: bytes
    stopped: str | None = None  # "no answer within 60 s", "over 1 MiB on stdout"


_READ_CHUNK = 64 * 1024
_DRAIN_S = 2.0  # after the kill: what is still in the pipes is read for at most this long


def run_capped(
    cmd: list[str], *, kind: str, timeout: float, max_bytes: int, **popen: Any
) -> CappedRun:
    """Run ``cmd`` through :func:`spawn` (its own process group, dead with us, leased) to its
    end, reading stdout and stderr as bytes in chunks. The whole group is killed (SIGKILL)
    once either stream passes ``max_bytes``, once ``timeout`` seconds have passed, and also
    when the child ends, so that nothing it started outlives it (a child that holds its
    pipes open then ends the read too). Memory stays within twice the cap; OSError: it could
    not be started."""
    deadline = time.monotonic() + timeout
    pipe = subprocess.PIPE
    proc = spawn(cmd, kind=kind, stdin=subprocess.DEVNULL, stdout=pipe, stderr=pipe, **popen)
    assert proc.stdout is not None and proc.stderr is not None
    names = {proc.stdout.fileno(): "stdout", proc.stderr.fileno(): "stderr"}
    got: dict[str, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}
    stopped: str | None = None
    killed_at: float | None = None
    try:
        with selectors.DefaultSelector() as sel:
            for fd in names:
                sel.register(fd, selectors.EVENT_READ)
            while sel.get_map():
                now = time.monotonic()
                if killed_at is None and (_ended(proc.pid) or now >= deadline):
                    if not _ended(proc.pid):
                        stopped = f"no answer within {timeout:g} s"
                    _kill_group(proc.pid)  # ended: what it left behind goes too
                    killed_at = now
                if killed_at is not None and now - killed_at > _DRAIN_S:
                    break  # a process out of the group holds a pipe: read no more
                limit = deadline if killed_at is None else killed_at + _DRAIN_S
                for key, _ in sel.select(max(0.0, min(0.2, limit - now))):
                    chunk = os.read(key.fd, _READ_CHUNK)
                    if not chunk:
                        sel.unregister(key.fd)
                        continue
                    name = names[key.fd]
                    got[name] += chunk
                    if len(got[name]) > max_bytes and stopped is None:
                        stopped = f"over {_size(max_bytes)} on {name}"
                        del got[name][max_bytes:]
                        _kill_group(proc.pid)
                        killed_at = time.monotonic()
                        sel.unregister(key.fd)  # read no more of it
        while killed_at is None and not _ended(proc.pid):  # its pipes closed, it still runs
            if time.monotonic() >= deadline:
                stopped = f"no answer within {timeout:g} s"
                break
            time.sleep(0.02)
    finally:
        _kill_group(proc.pid)  # ended or not: the group goes before the leader is reaped
        proc.stdout.close()
        proc.stderr.close()
        returncode = proc.wait()
    return CappedRun(returncode, bytes(got["stdout"]), bytes(got["stderr"]), stopped)


def _size(n: int) -> str:
    return f"{n // 2**20} MiB" if n % 2**20 == 0 else f"{n:,} bytes"


def _ended(pid: int) -> bool:
    """True once the child ``pid`` has ended; it is not reaped (its pid, which names its
    process group, stays ours until :meth:`Child.wait`)."""
    try:
        return os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True


def _kill_group(pid: int) -> None:
    """SIGKILL to the group ``pid`` leads, and to any descendant that left the group."""
    try:
        strays = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        strays = []
    signal_group(pid, signal.SIGKILL)
    for p in strays:
        with contextlib.suppress(psutil.Error):
            p.kill()


# -- leases ------------------------------------------------------------------------------------
def lease_dir() -> Path:
    """Where the leases of running children live."""
    return cache_dir() / "leases"


@dataclass(frozen=True)
class Lease:
    """A child Quantdeck started: enough to find it again, and to know it is the same process
    (``create_time``, psutil's, differs for a process that reuses the pid)."""

    pid: int
    pgid: int
    create_time: float
    kind: str  # what it is: "vLLM server", "conversion", ...
    owner_pid: int
    owner_create_time: float
    started: float  # wall clock
    port: int | None = None
    cwd: str | None = None
    path: Path | None = field(default=None, compare=False)  # the lease file (not written)

    def describe(self) -> str:
        port = f" on port {self.port}" if self.port else ""
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(self.started))
        return f"{self.kind}{port}: pid {self.pid}, started {when} by pid {self.owner_pid}"


def _create_time(pid: int) -> float:
    return float(psutil.Process(pid).create_time())


def _is_process(pid: int, create_time: float) -> bool:
    """True if ``pid`` runs and is the process that started at ``create_time``."""
    try:
        p = psutil.Process(pid)
        return abs(p.create_time() - create_time) < 0.05 and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def write_lease(pid: int, kind: str, *, port: int | None = None, cwd: str | None = None) -> Path:
    me = os.getpid()
    lease = Lease(
        pid=pid,
        pgid=os.getpgid(pid),
        create_time=_create_time(pid),
        kind=kind,
        owner_pid=me,
        owner_create_time=_create_time(me),
        started=time.time(),
        port=port,
        cwd=None if cwd is None else str(cwd),
    )
    path = lease_dir() / f"{pid}.json"
    data = {k: v for k, v in asdict(lease).items() if k != "path"}
    write_atomic(path, json.dumps(data))
    return path


def read_leases() -> list[Lease]:
    """Every lease on file; an unreadable one is removed (it can name no process)."""
    out = []
    for path in sorted(lease_dir().glob("*.json")):
        try:
            lease = Lease(**json.loads(path.read_text(encoding="utf-8")), path=path)
            ids = (lease.pid, lease.pgid, lease.owner_pid)
            times = (lease.create_time, lease.owner_create_time, lease.started)
            if not all(type(x) is int and x > 0 for x in ids) or not all(
                isinstance(x, (int, float)) for x in times
            ):
                raise TypeError("not a lease")
            out.append(lease)
        except (OSError, ValueError, TypeError):
            path.unlink(missing_ok=True)
    return out


def lease_pids(lease: Lease) -> set[int]:
    """The running processes of the lease's group: none when its leader's pid now belongs to
    another process (while a group has members, Linux does not hand out its number)."""
    try:
        leader = psutil.Process(lease.pid)
        if abs(leader.create_time() - lease.create_time) >= 0.05:
            return set()  # the pid was reused: ours is long gone
    except psutil.NoSuchProcess:
        pass
    except psutil.Error:
        return set()
    return group_pids(lease.pgid)


def group_pids(pgid: int) -> set[int]:
    """The running processes (zombies count as gone) of the process group ``pgid``."""
    out = set()
    for pid in psutil.pids():
        try:
            if os.getpgid(pid) == pgid and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.add(pid)
        except (OSError, psutil.Error):
            pass
    return out


SHM_RECORD_SUFFIX = ".shm"  # beside a lease: what its server mapped in /dev/shm (core/shm)
ORPHAN_RECORD_S = 60.0  # a record whose lease went this long ago: its server's sweep never came


def shm_record(lease: Path) -> Path:
    """Where the /dev/shm ledger of the child leased by ``lease`` is kept."""
    return lease.with_suffix(SHM_RECORD_SUFFIX)


def _gone(lease: Lease) -> None:
    """A lease whose processes all ended: what they left in /dev/shm (when the Quantdeck that
    watched them died before it could look), then the lease."""
    if lease.path is not None:
        sweep_record(shm_record(lease.path))
        lease.path.unlink(missing_ok=True)


def leftovers() -> list[Lease]:
    """Children whose owner is gone and which still run; stale leases are removed, with what
    their children left in /dev/shm."""
    out = []
    leases = read_leases()
    for lease in leases:
        if not lease_pids(lease):
            _gone(lease)
        elif not _is_process(lease.owner_pid, lease.owner_create_time):
            out.append(lease)
    # records without a lease: the child was reaped, then its owner died before its sweep
    kept = {lease.path for lease in leases if lease.path is not None}
    for record in lease_dir().glob("*" + SHM_RECORD_SUFFIX):
        try:
            old = time.time() - record.stat().st_mtime >= ORPHAN_RECORD_S
        except OSError:
            continue
        if old and record.with_suffix(".json") not in kept:
            sweep_record(record)
    return out


def stop_leftover(lease: Lease, timeout: float = 10.0) -> bool:
    """SIGTERM, then SIGKILL, to a leftover's group; True once nothing of it runs."""
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        if not lease_pids(lease):
            break
        signal_group(lease.pgid, sig)
        deadline = time.monotonic() + wait
        while lease_pids(lease) and time.monotonic() < deadline:
            time.sleep(0.1)
    gone = not lease_pids(lease)
    if gone:
        _gone(lease)
    return gone


def live_lease_dirs() -> set[Path]:
    """The working folders of children that still run (their run folders are not pruned)."""
    return {Path(x.cwd) for x in read_leases() if x.cwd and lease_pids(x)}


# -- the workers' line protocol ----------------------------------------------------------------
def json_lines(lines: Iterable[str]) -> Iterator[dict[str, Any]]:
    """The JSON objects among a worker's stdout lines; anything else becomes a ``log`` event."""
    for line in lines:
        line = line.strip()
        if not line:
            continue
        try:
            ev = json.loads(line)
        except ValueError:
            ev = None
        yield ev if isinstance(ev, dict) else {"event": "log", "line": line}


def worker_events(lines: Iterable[str], *, stamp: bool = True) -> Iterator[Event]:
    """A worker's stdout as typed events, each (with ``stamp``) stamped with the time it arrived
    unless the worker stamped it; a line that is not an event becomes a :class:`LogEvent`."""
    for data in json_lines(lines):
        if stamp:
            data.setdefault("t", time.time())
        try:
            yield from_json(data)
        except ValueError:
            yield LogEvent(json.dumps(data))
