"""One fleet per cache folder, under a lock (issue 31): of two ``fleet up`` that both found no
fleet running, only one writes the state file; the other is refused and leaves it alone. The
fleet's folder is private, its router log too."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from quantdeck.core.errors import ServerError
from quantdeck.core.fleet import Fleet, load_fleet, running_fleet, state_path

# a `fleet up` reduced to its check and its write: both racers find no fleet running (the
# check in Fleet.serve), say so, wait for the test's "go" (sent once both have: however slowly
# a starved machine imports them), then write the state
_RACER = """
import sys, time
from quantdeck.core.errors import ServerError
from quantdeck.core.fleet import Fleet, load_fleet, running_fleet
fleet = Fleet(load_fleet(sys.argv[1]))
assert running_fleet() is None
print("ready", flush=True)
sys.stdin.readline()
try:
    fleet.write_state()
except ServerError as e:
    print("refused:", e, flush=True)
    sys.exit(0)
print("wrote", flush=True)
time.sleep(3)  # the fleet runs a while, holding its lock
fleet.clear_state()
"""


@pytest.fixture
def fleet_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("QUANTDECK_CACHE_DIR", str(tmp_path / "cache"))
    doc = {"router": {"port": 18380}, "instances": [{"name": "far", "url": "http://127.0.0.1:9"}]}
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_two_fleet_ups_racing_one_writes_the_state(fleet_file: Path) -> None:
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", _RACER, str(fleet_file)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    assert [r.stdout.readline().strip() for r in racers if r.stdout] == ["ready", "ready"]
    for r in racers:  # go: both at once
        assert r.stdin is not None
        r.stdin.write("go\n")
        r.stdin.flush()
    first = [r.stdout.readline().strip() for r in racers if r.stdout is not None]
    try:
        assert sorted(x.split(":")[0] for x in first) == ["refused", "wrote"], first
        assert "a fleet already runs from this cache folder" in " ".join(first)
        winner = racers[[x == "wrote" for x in first].index(True)]
        state = running_fleet()  # the winner's, left alone by the loser
        assert state is not None and state["pid"] == winner.pid
    finally:
        for r in racers:
            r.wait(30)
    assert running_fleet() is None and not state_path().exists()


def test_a_second_fleet_is_refused_until_the_first_is_gone(fleet_file: Path) -> None:
    first = Fleet(load_fleet(fleet_file))
    first.write_state()
    second = Fleet(load_fleet(fleet_file))
    with pytest.raises(ServerError, match="a fleet already runs"):
        second.write_state()
    second.clear_state()  # refused: it removes nothing
    assert json.loads(state_path().read_text())["pid"] == os.getpid()
    first.clear_state()
    second.write_state()  # the lock went with the first fleet
    second.clear_state()


def test_the_fleet_folder_and_router_log_are_private(fleet_file: Path) -> None:
    fleet = Fleet(load_fleet(fleet_file))
    fleet.router_log.parent.mkdir(parents=True)
    fleet.router_log.parent.chmod(0o755)
    fleet.router_log.write_text("an older router's log\n")
    fleet.router_log.chmod(0o644)
    fleet.write_state()
    try:
        for path, mode in ((fleet.router_log.parent, 0o700), (fleet.router_log, 0o600)):
            assert stat.S_IMODE(path.stat().st_mode) == mode, path
        assert stat.S_IMODE(state_path().stat().st_mode) == 0o600
        # start_router opens it "w" (a restart "a"): the mode stays
        with open(fleet.router_log, "w") as f:
            f.write("a router line\n")
        assert stat.S_IMODE(fleet.router_log.stat().st_mode) == 0o600
    finally:
        fleet.clear_state()
