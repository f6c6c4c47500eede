"""The server supervisor without a server: a child that never becomes ready meets the start-up
deadline, a URL httpx refuses or a /health that never answers cannot leave it hanging, the log
reader keeps draining when server.log cannot be written, IPv6 hosts, run folders pruned, a
deep run folder's TMPDIR kept short for vLLM's sockets."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from quantdeck.core import procs
from quantdeck.core.errors import ServerError
from quantdeck.core.events import AdviceEvent, Event, LogEvent, StateEvent
from quantdeck.core.launch import LaunchConfig
from quantdeck.core.runtime import debris, ports
from quantdeck.core.runtime.debris import prune_run_dirs
from quantdeck.core.runtime.ports import base_url
from quantdeck.core.runtime.server import ServerProcess


@pytest.fixture(autouse=True)
def _own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUANTDECK_CACHE_DIR", str(tmp_path / "cache"))


def supervised(cmd: list[str], host: str, port: int, tmp_path: Path, **kw) -> ServerProcess:
    """A ServerProcess watching ``cmd`` as if it were vLLM (started as start() does)."""
    cfg = LaunchConfig()
    cfg.server.host, cfg.server.port = host, port
    server = ServerProcess(cfg, run_dir=tmp_path / "run", **kw)
    server.run_dir.mkdir()
    server.events: list[Event] = []
    server.subscribe(server.events.append)
    server.started_at = time.time()
    server.state = "starting"
    server._proc = procs.spawn(
        cmd, kind="test", stdout=subprocess.PIPE, text=True, errors="replace"
    )
    return server


def gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize(
    ("host", "url"),
    [
        ("127.0.0.1", "http://127.0.0.1:8000"),
        ("0.0.0.0", "http://127.0.0.1:8000"),
        ("::1", "http://[::1]:8000"),
        ("[::1]", "http://[::1]:8000"),
        ("::", "http://[::1]:8000"),
        ("fe80::1", "http://[fe80::1]:8000"),
        ("gpu-box.local", "http://gpu-box.local:8000"),
    ],
)
def test_ipv6_hosts_get_brackets(host: str, url: str) -> None:
    cfg = LaunchConfig()
    cfg.server.host = host
    assert base_url(cfg) == url


def test_free_port_on_ipv6_loopback() -> None:
    if not socket.has_ipv6:
        pytest.skip("no IPv6")
    try:
        port = ports.free_port("::1")
    except OSError:
        pytest.skip("no IPv6 loopback here")
    assert ports.port_free("::1", port)


def test_a_host_that_is_not_here_is_one_clear_error() -> None:
    from quantdeck.core.errors import ConfigError

    with pytest.raises(ConfigError, match="host 'no such host.invalid' is not an address here"):
        ports.port_free("no such host.invalid", 8000)


def test_startup_deadline_brings_a_silent_server_down(tmp_path: Path) -> None:
    """A /health that accepts connections and never answers: crashed at the deadline with
    the reason, the child's group killed (serve would otherwise wait for ever)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(16)  # accepted by the kernel, never answered
        port = listener.getsockname()[1]
        server = supervised(["sleep", "60"], "127.0.0.1", port, tmp_path, startup_timeout=1)
        t0 = time.monotonic()
        server._watch()
    assert server.state == "crashed"
    assert time.monotonic() - t0 < 10
    reason = [e.reason for e in server.events if isinstance(e, StateEvent) and e.state == "crashed"]
    assert reason == ["did not become ready in 1 s (start-up limit)"]
    assert gone(server.pid) and server.wait_exit(0)


def test_a_url_httpx_refuses_does_not_kill_the_watcher(tmp_path: Path) -> None:
    """Before: httpx.InvalidURL escaped the watcher thread; the state stayed 'starting' and
    `serve` waited for ever. Now: crashed, with the error, and the child stopped."""
    server = supervised(["sleep", "60"], "zz::1", 8000, tmp_path)
    server._watch()
    assert server.state == "crashed"
    reason = next(
        e.reason for e in server.events if isinstance(e, StateEvent) and e.state == "crashed"
    )
    assert reason.startswith("the watcher failed: InvalidURL")
    assert gone(server.pid)


def test_log_reader_keeps_draining_when_the_log_cannot_be_written(tmp_path: Path) -> None:
    """server.log on a full disk (/dev/full: every write fails with ENOSPC): every line is
    still read (nothing blocks vLLM), log_tail keeps the last ones, the failure is said once."""
    n = 5000
    script = f"for i in range({n}): print('INFO line', i)"
    server = supervised([sys.executable, "-c", script], "127.0.0.1", 1, tmp_path)
    server.log_path = Path("/dev/full")
    server._read_log()
    assert server._proc.wait(10) == 0
    assert server.log_tail[-1] == f"INFO line {n - 1}"
    logs = [e for e in server.events if isinstance(e, LogEvent)]
    assert sum(e.line.startswith("INFO line") for e in logs) == n
    errors = [e for e in logs if e.level == "ERROR"]
    advice = [e for e in server.events if isinstance(e, AdviceEvent)]
    assert len(errors) == 1 and len(advice) == 1
    assert "No space left on device" in advice[0].finding["message"]


def test_run_folders_are_pruned_to_the_newest(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    names = [f"202612{d:02d}-120000" for d in range(1, 25)] + ["20261224-120000-2"]
    for n in names:
        (root / n).mkdir(parents=True)
    (root / "notes").mkdir()  # not a run folder: kept
    busy = root / names[0]  # the oldest, of a server that still runs: kept
    child = procs.spawn(["sleep", "30"], kind="test", cwd=str(busy))
    try:
        prune_run_dirs(root, keep=20, spare=root / names[1])
    finally:
        child.kill()
        child.wait()
    left = sorted(p.name for p in root.iterdir())
    assert left == sorted([names[0], names[1], *names[-20:], "notes"])


def test_run_folder_names_are_unique() -> None:
    assert debris.new_run_dir() != debris.new_run_dir()
    # short: vLLM's IPC socket paths under <run>/tmp may not exceed 107 bytes
    assert len(debris.new_run_dir().name) <= len("20261203-124839-99")
    assert debris.new_run_dir().parent.name == "runs"


def test_a_deep_run_folder_gets_a_short_private_tmpdir(tmp_path: Path, short_tmp: Path) -> None:
    # a shallow run folder under the test's own short root (tmp_path is as deep as the
    # user's TMPDIR makes it)
    shallow = short_tmp / "r"
    assert debris.engine_tmp_dir(shallow) == shallow / "tmp"
    assert (shallow / "tmp").is_dir() and not (shallow / "tmp").is_symlink()

    deep = tmp_path / ("deep-folder-" * 8) / "run"
    tmpdir = debris.engine_tmp_dir(deep)
    # room for vLLM's socket names (ipc://$TMPDIR/<uuid4>) within 107 bytes
    assert len(str(tmpdir / str(uuid.uuid4()))) <= 107
    assert tmpdir.parent == short_tmp / f"quantdeck-{os.getuid()}"
    assert tmpdir.parent.stat().st_mode & 0o777 == 0o700
    assert (deep / "tmp").resolve() == tmpdir  # the run folder says where it went
    (tmpdir / "sock").write_text("x")
    debris.drop_engine_tmp(deep)
    assert not tmpdir.exists() and not (deep / "tmp").exists()
    assert tmpdir.parent.exists()  # the root stays for the next server


def test_pruning_a_run_folder_removes_its_short_tmpdir(tmp_path: Path, short_tmp: Path) -> None:
    root = tmp_path / ("deep-folder-" * 8) / "runs"
    names = [f"202612{d:02d}-120000" for d in range(1, 4)]
    short = [debris.engine_tmp_dir(root / n) for n in names]
    prune_run_dirs(root, keep=1)
    assert [s.exists() for s in short] == [False, False, True]


@pytest.mark.parametrize("plant", ["symlink", "open-mode"])
def test_a_short_root_that_is_not_ours_is_refused(
    tmp_path: Path, short_tmp: Path, plant: str
) -> None:
    root = short_tmp / f"quantdeck-{os.getuid()}"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    if plant == "symlink":
        root.symlink_to(elsewhere)
    else:
        root.mkdir(mode=0o755)
        root.chmod(0o755)
    with pytest.raises(ServerError, match="not a private folder"):
        debris.engine_tmp_dir(tmp_path / ("deep-folder-" * 8) / "run")
    assert list(elsewhere.iterdir()) == []


def test_short_tmpdirs_of_a_dead_quantdeck_are_swept(tmp_path: Path, short_tmp: Path) -> None:
    """A Quantdeck killed -9 cannot remove its servers' short TMPDIRs: the next start does."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    root = short_tmp / f"quantdeck-{os.getuid()}"
    root.mkdir(mode=0o700)
    gone = root / f"run-{dead.pid}-abcd"
    alive = root / f"run-{os.getpid()}-efgh"
    other = root / "not-ours"
    for d in (gone, alive, other):
        d.mkdir()
    tmpdir = debris.engine_tmp_dir(tmp_path / ("deep-folder-" * 8) / "run")
    assert tmpdir.name.startswith(f"run-{os.getpid()}-")
    assert not gone.exists() and alive.exists() and other.exists()
