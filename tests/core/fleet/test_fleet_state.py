"""The state file through which ``fleet status`` and ``fleet down`` find the running fleet."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from quantdeck.cli.main import main
from quantdeck.core.errors import ConfigError
from quantdeck.core.fleet import running_fleet, state_path, stop_running_fleet


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUANTDECK_CACHE_DIR", str(tmp_path / "cache"))


def _state(pid: int) -> dict[str, object]:
    state = {
        "pid": pid,
        "create_time": psutil.Process(pid).create_time(),
        "file": "fleet.yaml",
        "router": "http://127.0.0.1:9",
        "instances": [{"name": "a", "url": "http://127.0.0.1:9", "role": "primary"}],
    }
    state_path().parent.mkdir(parents=True, exist_ok=True)
    state_path().write_text(json.dumps(state))
    return state


def test_a_stale_state_file_is_no_fleet_and_goes() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    state = _state(proc.pid)
    assert running_fleet() == state
    proc.wait()
    assert running_fleet() is None and not state_path().exists()


def test_a_damaged_state_file_is_one_line() -> None:
    state_path().parent.mkdir(parents=True)
    state_path().write_text('{"pid": "x"}')
    with pytest.raises(ConfigError, match="'pid' must be an integer"):
        running_fleet()


def test_down_stops_the_fleet_process_and_status_shows_it(
    capsys: pytest.CaptureFixture[str],
) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        _state(proc.pid)
        assert main(["fleet", "status", "--json"]) == 0
        shown = json.loads(capsys.readouterr().out)
        assert shown["pid"] == proc.pid
        assert [(r["name"], r["state"]) for r in shown["rows"]] == [
            ("router", "down"),
            ("a", "down"),
        ]
        assert stop_running_fleet(timeout=10)
        assert running_fleet() is None  # its process ended (reaped by the wait)
        assert main(["fleet", "down"]) == 0  # nothing to stop is no error
        assert "no fleet running" in capsys.readouterr().err
        # a script can tell "none running" from a fleet that runs (0) and from bad input (2)
        assert main(["fleet", "status"]) == 3
        assert "no fleet running" in capsys.readouterr().err
        assert main(["fleet", "status", "--json"]) == 3
        assert json.loads(capsys.readouterr().out) == {"running": False}
    finally:
        proc.kill()
        proc.wait()
