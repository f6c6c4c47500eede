"""Instances that share a GPU start one after the other (vLLM sizes its KV cache from the memory
it finds free while it starts); the others start side by side. What is tested is the fleet's
order of starts: each server's start is recorded instead of run (no GPU here; the real starts
are in tests/cli/test_fleet_server.py)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import yaml
from ckpt import TINY_LLAMA, write_checkpoint

from quantdeck.core.fleet import Fleet, load_fleet


@pytest.fixture
def fleet(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Fleet, list[str]]:
    monkeypatch.setenv("QUANTDECK_CACHE_DIR", str(tmp_path / "cache"))
    model = write_checkpoint(tmp_path / "model", TINY_LLAMA)
    inst = [
        ("a", [0]),  # first on GPU 0
        ("b", [1]),  # alone on GPU 1: with a
        ("c", [0, 1]),  # shares with a and b: after both
        ("d", [2]),  # alone: with a
        ("e", [0]),  # shares with a and c: after c
    ]
    doc = {
        "router": {"port": 18080},
        "instances": [
            {"name": n, "port": 18001 + k, "gpus": g, "profile": {"model": str(model)}}
            for k, (n, g) in enumerate(inst)
        ],
    }
    path = tmp_path / "fleet.yaml"
    path.write_text(yaml.safe_dump(doc))
    fleet = Fleet(load_fleet(path))
    started: list[str] = []
    for name, server in fleet.servers.items():
        server.start = lambda name=name, server=server: (  # type: ignore[method-assign]
            started.append(name),
            setattr(server, "state", "starting"),
        )
    return fleet, started


def test_gpu_sharing_instances_wait_for_their_elders(fleet: tuple[Fleet, list[str]]) -> None:
    f, started = fleet
    f.start_instances()
    assert started == ["a", "b", "d"]
    f.servers["a"].state = "ready"
    f._start_due()
    assert started == ["a", "b", "d"]  # c waits for b too
    f.servers["b"].state = "ready"
    f._start_due()
    assert started == ["a", "b", "d", "c"]
    f.servers["c"].state = "ready"
    f.servers["d"].state = "ready"
    assert f.wait_ready(threading.Event(), timeout=0.3) is False  # e started, not ready yet
    assert started == ["a", "b", "d", "c", "e"]


def test_a_crashed_elder_fails_the_start_and_its_follower_never_starts(
    fleet: tuple[Fleet, list[str]],
) -> None:
    f, started = fleet
    f.start_instances()
    f.servers["a"].state = "crashed"
    assert f.wait_ready(threading.Event(), timeout=5) is False
    assert "c" not in started and "e" not in started
