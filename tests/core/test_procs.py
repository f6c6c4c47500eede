"""Children die with their parent, whatever thread started them; leases find the ones left
running and stop only them (never a process that reuses the pid)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest
from leftover import write_lease

from quantdeck.core import procs
from quantdeck.core.errors import QuantdeckError

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG")


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Leases in this test's folder only."""
    monkeypatch.setenv("QUANTDECK_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def wait_gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not running(pid)


def test_child_outlives_the_thread_that_started_it() -> None:
    """Linux sends the parent-death signal when the forking *thread* ends: a child started from
    a short-lived worker thread (the GUI's, A/B's) must not die with that thread."""
    box: dict[str, procs.Child] = {}
    t = threading.Thread(target=lambda: box.update(p=procs.spawn(["sleep", "30"], kind="test")))
    t.start()
    t.join()
    child = box["p"]
    try:
        time.sleep(0.5)
        assert child.poll() is None, "the child died with the thread that spawned it"
    finally:
        child.kill()
        child.wait()


def test_child_dies_when_its_parent_is_killed(tmp_path: Path) -> None:
    """kill -9 of the parent: the child (spawned from a worker thread that has ended) is gone
    within 5 s, its own session notwithstanding."""
    script = textwrap.dedent(
        """
        import threading, time
        from quantdeck.core import procs
        box = {}
        t = threading.Thread(target=lambda: box.update(p=procs.spawn(["sleep", "60"], kind="t")))
        t.start(); t.join()
        print(box["p"].pid, flush=True)
        time.sleep(60)
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        assert running(child) and os.getpgid(child) == child  # its own group
        parent.kill()
        parent.wait()
        assert wait_gone(child, 5.0), "the child outlived its parent"
    finally:
        parent.kill()
        parent.wait()


def test_lease_while_running_removed_once_reaped(_own_cache: Path) -> None:
    child = procs.spawn(["sleep", "30"], kind="vLLM server", port=8123, cwd=str(_own_cache.parent))
    try:
        path = _own_cache / "leases" / f"{child.pid}.json"
        lease = json.loads(path.read_text())
        assert lease["pid"] == lease["pgid"] == child.pid
        assert lease["create_time"] == psutil.Process(child.pid).create_time()
        assert lease["owner_pid"] == os.getpid() and lease["port"] == 8123
        assert lease["kind"] == "vLLM server"
        assert path.stat().st_mode & 0o777 == 0o600
        assert procs.leftovers() == []  # its owner (this process) runs
    finally:
        child.kill()
        child.wait()
    assert not path.exists()


def test_a_leftover_is_listed_and_stopped_with_its_group() -> None:
    # a process group (leader and member) whose owner died without a parent-death signal
    leader = subprocess.Popen(
        ["sh", "-c", "sleep 60 & wait"], start_new_session=True, stdout=subprocess.DEVNULL
    )
    try:
        time.sleep(0.3)
        members = {c.pid for c in psutil.Process(leader.pid).children()}
        path = write_lease(procs.lease_dir(), leader.pid)
        found = procs.leftovers()
        assert [x.pid for x in found] == [leader.pid]
        assert "vLLM server on port 8011" in found[0].describe()
        assert procs.stop_leftover(found[0], timeout=5)
        assert leader.wait(5) is not None
        assert all(wait_gone(m, 5) for m in members)
        assert not path.exists()
    finally:
        leader.kill()
        leader.wait()


def test_a_reused_pid_is_never_stopped() -> None:
    """A lease whose pid now belongs to another process (another start time) names nothing:
    not listed, not stopped, and its stale file goes."""
    other = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        path = write_lease(
            procs.lease_dir(), other.pid, create_time=psutil.Process(other.pid).create_time() - 100
        )
        stale = procs.read_leases()[0]
        assert procs.leftovers() == []
        assert not path.exists()
        assert procs.stop_leftover(stale)  # nothing of it runs
        assert other.poll() is None, "a process that reused the pid was killed"
    finally:
        other.kill()
        other.wait()


@pytest.mark.parametrize("text", ["{", "[]", '{"pid": "1"}', '{"pid": 1.5, "pgid": 1}'])
def test_an_unreadable_lease_is_dropped(text: str) -> None:
    path = procs.lease_dir() / "9.json"
    path.parent.mkdir(parents=True)
    path.write_text(text)
    assert procs.leftovers() == []
    assert not path.exists()


def test_run_child_stops_a_child_past_its_deadline() -> None:
    t0 = time.monotonic()
    with pytest.raises(QuantdeckError, match="quality check did not finish within 0.5 s"):
        procs.run_child(
            [sys.executable, "-c", "import time; print('x', flush=True); time.sleep(30)"],
            kind="quality check",
            timeout=0.5,
        )
    assert time.monotonic() - t0 < 5
    assert list(procs.lease_dir().glob("*.json")) == []  # reaped: no lease left


def test_run_child_returns_like_subprocess_run() -> None:
    r = procs.run_child(
        [sys.executable, "-c", "import sys; print('out'); print('err', file=sys.stderr)"],
        kind="t",
        timeout=30,
    )
    assert (r.returncode, r.stdout, r.stderr) == (0, "out\n", "err\n")


def test_signal_group_of_a_gone_group_is_quiet() -> None:
    p = subprocess.Popen(["true"], start_new_session=True)
    p.wait()
    procs.signal_group(p.pid, signal.SIGKILL)  # no ProcessLookupError
