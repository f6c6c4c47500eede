"""``fleet up --record`` and ``fleet check`` leave nothing behind and say things in one line
(issue 31): a refused ``fleet up --record OUT`` writes no OUT; a full disk or the recording's
cap is one line on stderr, never a traceback, and the fleet goes on; a URL's credentials are
never shown."""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
import yaml
from conftest import metrics_event
from small_disk import small_disk

from quantdeck.cli.fleet import FleetPrinter
from quantdeck.cli.main import main
from quantdeck.core.errors import mask_credentials
from quantdeck.core.events import Event, InstanceEvent, LogEvent, Publisher, StateEvent
from quantdeck.core.fleet import state_path
from quantdeck.core.monitor import Recorder, read_recording


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUANTDECK_CACHE_DIR", str(tmp_path / "cache"))


def _fleet_file(path: Path, router_port: int, url: str) -> Path:
    doc = {"router": {"port": router_port}, "instances": [{"name": "far", "url": url}]}
    path.write_text(yaml.safe_dump(doc))
    return path


@pytest.mark.parametrize("refusal", ["a fleet already runs", "the router's port is taken"])
def test_a_refused_fleet_up_record_writes_no_file(
    refusal: str,
    tmp_path: Path,
    recorded_server: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = tmp_path / "out.jsonl"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        fleet = _fleet_file(tmp_path / "fleet.yaml", port, recorded_server)
        if refusal == "a fleet already runs":
            taken.close()
            other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
            state = {
                "pid": other.pid,
                "create_time": psutil.Process(other.pid).create_time(),
                "router": "http://127.0.0.1:9",
                "instances": [],
            }
            state_path().parent.mkdir(parents=True)
            state_path().write_text(json.dumps(state))
        try:
            assert main(["fleet", "up", str(fleet), "--record", str(out)]) == 2
        finally:
            if refusal == "a fleet already runs":
                other.kill()
                other.wait()
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("quantdeck: error: ")
    assert ("already" in err[0]) and ("router" in err[0] or "fleet" in err[0])
    assert not out.exists() and not out.with_name("out.jsonl.partial").exists()


def _fleet_events(n: int) -> list[Event]:
    """What a fleet's observers get: the fleet's news, an instance starting, then its lines
    and figures."""
    events: list[Event] = [InstanceEvent("router", StateEvent("starting", command=["r"]))]
    for i in range(n):
        events.append(InstanceEvent("a", LogEvent(f"INFO line {i}", "INFO")))
        events.append(InstanceEvent("a", metrics_event(float(i))))
    return events


def test_a_full_disk_under_record_is_one_line_and_the_fleet_goes_on(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    """Before: the recorder's error escaped the fleet's observer, and the publisher logged it
    with its traceback."""
    with small_disk(tmp_path / "disk", 256 * 1024) as disk:
        out = disk.path / "fleet.jsonl"
        printer = FleetPrinter(False, False, lambda: Recorder(out, {"source": "fleet"}))
        fleet: Publisher[Event] = Publisher("fleet")
        fleet.subscribe(printer)
        events = _fleet_events(2000)
        for ev in events[:20]:
            fleet.emit(ev)
        disk.fill()
        with caplog.at_level(logging.ERROR):
            for ev in events[20:]:
                fleet.emit(ev)
            fleet.emit(InstanceEvent("a", StateEvent("ready", url="http://127.0.0.1:1")))
        disk.restore()
        printer.close()
        assert not caplog.records  # no traceback
        err = capsys.readouterr()
        (line,) = err.err.splitlines()
        assert line.startswith("quantdeck: error: recording stopped: ")
        assert "No space left on device" in line or "File too large" in line
        assert "a: [state] ready" in err.out  # the fleet's news still printed
        assert read_recording(out.with_name("fleet.jsonl.partial")).events  # what it held


def test_the_recordings_cap_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "fleet.jsonl"
    printer = FleetPrinter(False, False, lambda: Recorder(out, max_bytes=32 * 1024))
    for ev in _fleet_events(1000):
        printer(ev)
    printer.close()
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("quantdeck: recording capped at 0.03125 MiB: nothing after ")
    assert read_recording(out).events[-1].kind == "marker"


def test_credentials_of_a_url_are_masked_in_the_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fleet = _fleet_file(tmp_path / "fleet.yaml", 18480, "http://alice:s3cret@127.0.0.1:1")
    assert main(["fleet", "check", str(fleet)]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert "s3cret" not in line and "alice" not in line
    assert "http://***@127.0.0.1:1" in line


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        ("http://alice:s3cret@h:8000/v1", "http://***@h:8000/v1"),
        ("https://tok3n@h/x and http://u:p@ss@h2:1", "https://***@h/x and http://***@h2:1"),
        ("'http://u:p@h' is bad", "'http://***@h' is bad"),
        ("http://h:8000/a@b, user@host", "http://h:8000/a@b, user@host"),  # no credentials
    ],
)
def test_mask_credentials(text: str, shown: str) -> None:
    assert mask_credentials(text) == shown
