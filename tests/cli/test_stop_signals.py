"""SIGINT, SIGTERM and SIGHUP stop every command the same way; `quantdeck leftovers`, and the
one line `serve` says about them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import ROOT
from leftover import leftover

from quantdeck.cli._common import Stopped, StopSignals, stop_signals_raise

STOP = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP]


@pytest.fixture
def restore_handlers() -> Iterator[None]:
    before = {s: signal.getsignal(s) for s in STOP}
    yield
    for s, h in before.items():
        signal.signal(s, h)


@pytest.mark.parametrize("sig", STOP)
def test_the_first_stop_signal_asks_a_clean_stop(restore_handlers, sig: int) -> None:
    called = threading.Event()
    stops = StopSignals(called.set)
    os.kill(os.getpid(), sig)
    assert stops.event.wait(5) and called.wait(5)
    assert stops.exit_code(0) == 128 + sig
    with pytest.raises(Stopped):  # a second one: stop waiting
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1)


def test_without_a_signal_the_exit_code_is_the_commands(restore_handlers) -> None:
    assert StopSignals().exit_code(3) == 3


@pytest.mark.parametrize("sig", STOP)
def test_other_commands_end_on_any_stop_signal(sig: int) -> None:
    before = signal.getsignal(signal.SIGHUP)
    with pytest.raises(Stopped) as e, stop_signals_raise():
        os.kill(os.getpid(), sig)
        time.sleep(1)
    assert e.value.exit_code == 128 + sig
    assert signal.getsignal(signal.SIGHUP) is before


def quantdeck(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "quantdeck.cli", *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        **kw,
    )


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGTERM])
def test_monitor_stops_cleanly_on_a_closed_terminal(recorded_server: str, sig: int) -> None:
    """Before: SIGHUP (the terminal closed) killed the command where it stood (exit -1). Now:
    a clean stop, exit 0 (its normal end, as for serve)."""
    proc = quantdeck("monitor", recorded_server, "--json-events")
    try:
        first = json.loads(proc.stdout.readline())
        assert first["state"] == "attached"
        proc.send_signal(sig)
        assert proc.wait(20) == 0, proc.stderr.read()
    finally:
        proc.kill()
        proc.wait()


def cli(*args: str, cache: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "quantdeck.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=dict(os.environ, QUANTDECK_CACHE_DIR=str(cache)),
        timeout=60,
    )


def test_leftovers_lists_and_stops_them(tmp_path: Path) -> None:
    left = leftover(tmp_path / "leases")
    try:
        listed = cli("leftovers", "--json", cache=tmp_path)
        assert listed.returncode == 0, listed.stderr
        assert [x["pid"] for x in json.loads(listed.stdout)] == [left.pid]
        stopped = cli("leftovers", "--stop", cache=tmp_path)
        assert stopped.returncode == 0, stopped.stderr
        assert stopped.stdout.startswith(f"stopped vLLM server on port 8011: pid {left.pid}")
        assert left.wait(5) == -signal.SIGTERM
        again = cli("leftovers", cache=tmp_path)
        assert again.returncode == 0 and "no leftovers" in again.stderr
    finally:
        left.kill()
        left.wait()


def test_serve_says_one_line_about_leftovers(tmp_path: Path) -> None:
    left = leftover(tmp_path / "leases")
    try:
        r = cli("serve", str(tmp_path / "no-such-model"), cache=tmp_path)
    finally:
        left.kill()
        left.wait()
    lines = r.stderr.splitlines()
    assert r.returncode == 2 and len(lines) == 2, r.stderr
    assert lines[0].startswith("quantdeck: left running by an earlier Quantdeck: vLLM server")
    assert lines[0].endswith("`quantdeck leftovers --stop` stops them")
