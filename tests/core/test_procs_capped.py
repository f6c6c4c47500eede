"""``run_capped``: a child's output read in chunks up to a cap, a time limit, and its whole
process group (and any descendant that left it) killed when it overruns or ends; its lease
gone once it is reaped."""

from __future__ import annotations

import sys
from pathlib import Path

import psutil
import pytest

from quantdeck.core import procs

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="os.waitid")

# prints its pid, starts a child (in its group, or in a session of its own) that prints its
# own pid and sleeps, then does what argv[1] says: "hang", "exit" or "flood"
FORKER = """
import os, sys, time
print(os.getpid(), flush=True)
if os.fork() == 0:
    if sys.argv[2] == "session":
        os.setsid()
    print(os.getpid(), flush=True)
    os.close(1)
    time.sleep(600)
    os._exit(0)
time.sleep(0.3)
if sys.argv[1] == "hang":
    time.sleep(600)
if sys.argv[1] == "flood":
    while True:
        sys.stdout.write("x" * 4096)
"""


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUANTDECK_CACHE_DIR", str(tmp_path / "cache"))


def gone(pids: list[int]) -> bool:
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                return False
        except psutil.NoSuchProcess:
            continue
    return True


def forker(then: str, child: str = "group", **kw: float) -> procs.CappedRun:
    cmd = [sys.executable, "-c", FORKER, then, child]
    return procs.run_capped(cmd, kind="test", **{"timeout": 30.0, "max_bytes": 2**20, **kw})


@pytest.mark.parametrize("child", ["group", "session"])
def test_past_the_limit_the_child_and_all_it_started_are_killed(child: str) -> None:
    r = forker("hang", child, timeout=2.0)
    assert r.stopped == "no answer within 2 s" and r.returncode == -9
    pids = [int(x) for x in r.stdout.split()]
    assert len(pids) == 2 and gone(pids)
    assert list(procs.lease_dir().glob("*.json")) == []


def test_past_the_cap_it_is_killed_and_the_output_cut_there() -> None:
    r = forker("flood", max_bytes=100_000)
    assert r.stopped == "over 100,000 bytes on stdout" and len(r.stdout) == 100_000
    assert gone([int(x) for x in r.stdout.split(b"x")[0].split()])


def test_a_child_that_ends_leaves_nothing_behind_and_its_status_is_kept() -> None:
    r = forker("exit")
    assert r.stopped is None and r.returncode == 0 and r.stderr == b""
    pids = [int(x) for x in r.stdout.split()]
    assert len(pids) == 2 and gone(pids)
