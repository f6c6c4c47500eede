"""ServerProcess hands the API key to vLLM in its environment, never in argv or the ``starting``
event; an exposed server without a key is refused before anything is spawned."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from ckpt import TINY_LLAMA, write_checkpoint

from quantdeck.core.errors import ConfigError, ServerError
from quantdeck.core.events import StateEvent
from quantdeck.core.launch import LaunchConfig, cpu_device, iter_knobs
from quantdeck.core.runtime import server as server_mod
from quantdeck.core.runtime.engine import Capabilities
from quantdeck.core.runtime.server import ServerProcess, free_port

KEY = "s3cret-KEY-42"
TINY = TINY_LLAMA


def _server(tmp_path: Path, **server: Any) -> ServerProcess:
    cfg = LaunchConfig()
    cfg.model.model = str(write_checkpoint(tmp_path / "tiny", TINY))
    cfg.server.port = free_port()
    for name, value in server.items():
        setattr(cfg.server, name, value)
    flags = {k.flag: {} for k in iter_knobs()} | {"--compilation-config": {}}
    caps = Capabilities("0.32.0", "2.9", "cpu", "cli", options=flags)
    return ServerProcess(cfg, capabilities=caps, device=cpu_device(), run_dir=tmp_path / "run")


def test_key_reaches_vllm_through_its_environment(tmp_path: Path, monkeypatch) -> None:
    spawned: list[tuple[list[str], dict[str, str]]] = []

    def spawn(cmd: list[str], **kw: Any) -> Any:
        spawned.append((cmd, kw["env"]))
        raise OSError(2, "not spawned in this test")

    monkeypatch.setattr(server_mod, "spawn", spawn)
    monkeypatch.setenv("VLLM_API_KEY", "the-users-own")
    srv = _server(tmp_path, api_key=KEY)
    events: list[Any] = []
    srv.subscribe(events.append)
    with pytest.raises(ServerError):
        srv.start()
    ((cmd, env),) = spawned
    assert env["VLLM_API_KEY"] == KEY
    assert not any(KEY in w for w in cmd)
    (starting,) = [e for e in events if isinstance(e, StateEvent) and e.state == "starting"]
    assert isinstance(starting.command, list) and not any(KEY in w for w in starting.command)
    # no key: the server gets an empty one, not the user's own that Quantdeck does not know
    spawned.clear()
    with pytest.raises(ServerError):
        _server(tmp_path, api_key=None).start()
    assert spawned[0][1]["VLLM_API_KEY"] == ""


def test_open_server_without_key_is_refused_before_spawning(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(server_mod, "spawn", lambda *a, **k: pytest.fail("spawned"))
    with pytest.raises(ConfigError, match="no API key"):
        _server(tmp_path, host="0.0.0.0").start()
