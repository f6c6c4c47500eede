"""What a server leaves behind, without vLLM (issue 31): server.log private and rotated at its
cap, a run folder only for a start that was accepted (0700, its traces 0600), a reused run
folder's stale IPC files gone, and the /dev/shm segments of a killed server removed (only
those its processes were seen to map). The server here is a small Python script started by
the real ``ServerProcess.start`` in place of vLLM (its launch plan's command, after the real
preflight)."""

from __future__ import annotations

import dataclasses
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from multiprocessing import shared_memory
from pathlib import Path
from typing import Any

import pytest
from ckpt import TINY_LLAMA, write_checkpoint

from quantdeck.core.errors import ServerError
from quantdeck.core.launch import LaunchConfig, cpu_device, iter_knobs
from quantdeck.core.launch.command import KV_EVENTS_FLAG, PROFILER_FLAG
from quantdeck.core.paths import cache_dir
from quantdeck.core.procs import group_pids
from quantdeck.core.runtime.debris import process_tree
from quantdeck.core.runtime.engine import Capabilities
from quantdeck.core.runtime.server import CappedLog, ServerProcess, free_port
from quantdeck.core.shm import SHM_ROOT, ShmLedger

SHM = SHM_ROOT.is_dir()


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUANTDECK_CACHE_DIR", str(tmp_path / "cache"))


def mode(p: Path) -> int:
    return stat.S_IMODE(os.stat(p).st_mode)


def _server(tmp_path: Path, script: str | None = None, **kw: Any) -> ServerProcess:
    """A ServerProcess of a tiny checkpoint whose start runs ``script`` instead of vLLM (the
    real preflight when ``script`` is None)."""
    cfg = LaunchConfig()
    cfg.model.model = str(write_checkpoint(tmp_path / "tiny", TINY_LLAMA))
    cfg.server.port = free_port()
    flags = {k.flag: {} for k in iter_knobs()} | {"--compilation-config": {}}
    flags |= {KV_EVENTS_FLAG: {}, PROFILER_FLAG: {}}
    caps = Capabilities("0.32.0", "2.9", "cpu", "cli", options=flags)
    server = ServerProcess(cfg, capabilities=caps, device=cpu_device(), **kw)
    if script is not None:
        real = server.preflight

        def preflight() -> list[str]:
            real()
            assert server.launch is not None
            server.launch = dataclasses.replace(
                server.launch, command=(sys.executable, "-c", script)
            )
            return list(server.launch.argv)

        server.preflight = preflight  # type: ignore[method-assign]
    return server


def _log_thread_done(server: ServerProcess, timeout: float = 20) -> None:
    for t in server._threads:
        if t.name == "vllm-log":
            t.join(timeout)
            assert not t.is_alive()


def test_server_log_is_private_and_rotated_at_its_cap(tmp_path: Path) -> None:
    path = tmp_path / "server.log"
    path.write_text("from an older Quantdeck\n")
    path.chmod(0o644)
    log = CappedLog(path, max_bytes=1000)
    assert mode(path) == 0o600  # an older, readable log is made private
    for i in range(100):
        log.write(f"INFO line {i:03d} " + "x" * 30 + "\n")
    log.close()
    old = path.with_name("server.log.1")
    assert path.stat().st_size <= 1000 and old.stat().st_size <= 1000
    assert mode(path) == mode(old) == 0o600
    assert path.read_text().splitlines()[-1].startswith("INFO line 099")
    # the two files hold the newest lines, in order, none cut
    lines = old.read_text().splitlines() + path.read_text().splitlines()
    numbers = [int(line.split()[2]) for line in lines]
    assert numbers == list(range(100 - len(numbers), 100))
    assert not path.with_name("server.log.2").exists()


def test_a_refused_start_makes_no_run_folder(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        server = _server(tmp_path)
        server.cfg.server.port = taken.getsockname()[1]
        with pytest.raises(ServerError, match="already in use"):
            server.start()
    runs = cache_dir() / "runs"
    assert not runs.exists() or list(runs.iterdir()) == []
    assert not server.run_dir.exists()


def test_a_run_folder_its_log_and_traces_are_private(tmp_path: Path) -> None:
    """The run folder (0700) is made at the accepted start; server.log is 0600, and so is
    what the server writes (its umask: the profiler's traces in a 0700 folder)."""
    script = "open('profiles/trace.json.gz', 'w').write('{}'); print('INFO up')"
    server = _server(tmp_path, script)
    server.cfg.server.profiler = True
    before = server.run_dir
    server.start()
    server.wait_exit(20)
    _log_thread_done(server)
    run = server.run_dir
    assert run.parent == cache_dir() / "runs" and run.name.startswith(before.name[:8])
    assert mode(run) == 0o700 and mode(run.parent) == 0o700
    assert mode(run / "server.log") == 0o600
    assert "INFO up" in (run / "server.log").read_text()
    assert mode(run / "profiles") == 0o700
    assert mode(run / "profiles" / "trace.json.gz") == 0o600


def test_a_reused_run_folder_starts_with_an_empty_tmp(tmp_path: Path, short_tmp: Path) -> None:
    """A restart in the same run folder: the IPC files the last server left in its TMPDIR
    go before the next one starts. (``short_tmp``: a run folder short enough for its own
    ``tmp``, as under a short cache path.)"""
    server = _server(tmp_path, "print('INFO up')", run_dir=short_tmp / "run")
    server.start()
    server.wait_exit(20)
    tmp = server.run_dir / "tmp"
    assert not tmp.is_symlink()
    stale = tmp / "0b7c1a2e-0000-4000-8000-000000000000"
    stale.write_text("a socket of the last start")
    server.stop()
    server.start()
    server.wait_exit(20)
    assert tmp.is_dir() and not stale.exists()
    assert mode(tmp) == 0o700


# a server that makes what vLLM's engine makes: a shared-memory segment and a named semaphore
# (the spawn start method's, registered with a resource tracker), says so, and waits
_SHM_SERVER = """
import multiprocessing as mp, time
from multiprocessing import shared_memory
seg = shared_memory.SharedMemory(create=True, size=4096)
lock = mp.get_context("spawn").Lock()
print("INFO made", seg.name, "sem." + lock._semlock.name.lstrip("/"), flush=True)
time.sleep(2)
print("INFO Application startup complete.", flush=True)
time.sleep(120)
"""


@pytest.mark.skipif(not SHM, reason="no /dev/shm")
def test_the_shm_of_a_killed_server_is_removed_and_nothing_else(tmp_path: Path) -> None:
    server = _server(tmp_path, _SHM_SERVER)
    lines: list[str] = []
    server.subscribe(lambda ev: lines.append(getattr(ev, "line", "")))
    server.start()
    # someone else's segment, made while the server runs and not mapped by anyone
    other = shared_memory.SharedMemory(create=True, size=4096)
    other.close()
    try:
        deadline = time.monotonic() + 30
        while not any("startup complete" in x for x in lines) and time.monotonic() < deadline:
            time.sleep(0.1)
        made = next(x for x in lines if x.startswith("INFO made")).split()[2:]
        assert all((SHM_ROOT / n).exists() for n in made)
        os.killpg(server.pid, signal.SIGKILL)  # the server and its resource tracker
        server.wait_exit(20)
        _log_thread_done(server)
        assert not group_pids(server.pid)
        assert [n for n in made if (SHM_ROOT / n).exists()] == []
        assert (SHM_ROOT / other.name).exists()  # never seen in the server's hands: kept
    finally:
        server.stop()
        other.unlink()


_SHM_CHILD = """
from multiprocessing import shared_memory
import time
seg = shared_memory.SharedMemory(create=True, size=4096)
print(seg.name, flush=True)
time.sleep(120)
"""


@pytest.mark.skipif(not SHM, reason="no /dev/shm")
def test_a_segment_another_process_still_maps_is_kept(tmp_path: Path) -> None:
    """A segment the dead server made, but that a live process attached to, stays; one there
    before the server started stays too, even if the server mapped it."""
    older = shared_memory.SharedMemory(create=True, size=4096)
    ledger = ShmLedger()
    child = subprocess.Popen(
        [sys.executable, "-c", _SHM_CHILD],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert child.stdout is not None
    name = child.stdout.readline().strip()
    shared = shared_memory.SharedMemory(name=name)  # a live process attaches to it
    try:
        ledger.note(process_tree(child.pid) | {os.getpid()})  # we map `older`
        assert name in ledger.seen and older.name not in ledger.seen
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        assert ledger.sweep() == []
        assert (SHM_ROOT / name).exists() and (SHM_ROOT / older.name).exists()
    finally:
        shared.close()
        shared.unlink()
        older.close()
        older.unlink()


_WATCHER = """
import sys, time
from pathlib import Path
sys.path[:0] = sys.argv[1:3]
from test_debris import _SHM_SERVER, _server
server = _server(Path(sys.argv[3]), _SHM_SERVER)
lines = []
server.subscribe(lambda ev: lines.append(getattr(ev, "line", "")))
server.start()
while not any("startup complete" in x for x in lines):
    time.sleep(0.05)
time.sleep(0.5)  # (noted on that line)
made = next(x for x in lines if x.startswith("INFO made")).split()[2:]
print(server.pid, *made, flush=True)
time.sleep(120)
"""


@pytest.mark.skipif(not SHM, reason="no /dev/shm")
def test_the_shm_of_a_server_killed_with_its_watcher_goes_at_the_next_look(
    tmp_path: Path,
) -> None:
    """kill -9 of the Quantdeck that watched the server (the panel, `fleet up`) and of the
    server: nobody is left to sweep. What the server was seen mapping was kept beside its
    lease, and the next Quantdeck that reads the leases (``leftovers``: serve, the panel's
    start, `quantdeck leftovers`) removes it, and nothing else."""
    from quantdeck.core.procs import lease_dir, leftovers

    here = Path(__file__).parent
    watcher = subprocess.Popen(
        [sys.executable, "-c", _WATCHER, str(here.parent.parent), str(here), str(tmp_path)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    other = shared_memory.SharedMemory(create=True, size=4096)  # someone else's
    other.close()
    try:
        assert watcher.stdout is not None
        line = watcher.stdout.readline().split()
        assert line, "the watcher did not start its server"
        pid, made = int(line[0]), line[1:]
        assert made and all((SHM_ROOT / n).exists() for n in made)
        records = list(lease_dir().glob("*.shm"))
        assert [r.stem for r in records] == [str(pid)]
        # both die at once: the watcher held still first (else it sweeps, or the server's
        # parent-death SIGTERM lets its resource tracker clean up), then the server's group
        # (the server and its resource tracker), then the watcher
        os.kill(watcher.pid, signal.SIGSTOP)
        os.killpg(pid, signal.SIGKILL)
        os.killpg(watcher.pid, signal.SIGKILL)
        watcher.wait()
        deadline = time.monotonic() + 20
        while group_pids(pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not group_pids(pid)
        assert all((SHM_ROOT / n).exists() for n in made)  # nobody swept
        assert leftovers() == []
        assert [n for n in made if (SHM_ROOT / n).exists()] == []
        assert (SHM_ROOT / other.name).exists()
        assert list(lease_dir().iterdir()) == []  # the lease and its record gone
    finally:
        if watcher.poll() is None:
            os.killpg(watcher.pid, signal.SIGKILL)
        other.unlink()


def _segment(root: Path, name: str) -> int:
    path = root / name
    path.write_bytes(b"x")
    return path.stat().st_ino


def test_a_kept_record_removes_only_its_entries_as_they_were_seen(tmp_path: Path) -> None:
    from quantdeck.core.shm import sweep_record

    root, record = tmp_path / "shm", tmp_path / "123.shm"
    root.mkdir()
    seen = {n: _segment(root, n) for n in ("psm_0abc", "sem.mp-x1y2z3w4", "psm_1def")}
    replaced = _segment(root, "psm_new")  # the same name, another file now (made while the
    os.replace(root / "psm_new", root / "psm_1def")  # first lives: another inode)
    _segment(root, "notes.txt")
    ledger = ShmLedger(root, record=None)
    ledger.seen = {**seen, "notes.txt": 1}
    ledger.record = record
    ledger._keep()
    assert sweep_record(record, root) == ["psm_0abc", "sem.mp-x1y2z3w4"]
    assert sorted(p.name for p in root.iterdir()) == ["notes.txt", "psm_1def"]
    assert (root / "psm_1def").stat().st_ino == replaced
    assert not record.exists()


@pytest.mark.parametrize(
    "text", ["", "{", "[]", '{"seen": []}', '{"seen": {"psm_0": "1"}}', "x" * (2 << 20)]
)
def test_a_record_that_is_not_one_is_removed_and_nothing_else(tmp_path: Path, text: str) -> None:
    from quantdeck.core.shm import sweep_record

    root, record = tmp_path / "shm", tmp_path / "9.shm"
    root.mkdir()
    _segment(root, "psm_0")
    record.write_text(text)
    assert sweep_record(record, root) == []
    assert not record.exists() and (root / "psm_0").exists()
