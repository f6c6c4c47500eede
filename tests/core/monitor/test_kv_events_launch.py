"""The launch side of KV events: the ``kv_events`` knob (Quantdeck's own, never a vLLM flag),
its check against prefix caching, the endpoints a start picks, and ``serve``'s wiring of the
subscriber (cli/runtime.py KvEvents) fed by vLLM's own ZmqEventPublisher."""

from __future__ import annotations

import argparse
import threading
import time
from typing import Any

import pytest

from quantdeck.cli.runtime import KvEvents
from quantdeck.core.errors import ConfigError
from quantdeck.core.events import Event, FactEvent, KvEvent
from quantdeck.core.launch import LaunchConfig, knobs
from quantdeck.core.runtime.server import ServerProcess


def test_the_knob_is_quantdecks_own() -> None:
    parser = argparse.ArgumentParser()
    knobs.add_cli_options(parser)
    cfg = knobs.apply_cli_options(LaunchConfig(), parser.parse_args(["--kv-events"]))
    cfg.model.model = "/m"
    assert cfg.cache.kv_events is True
    assert not any("kv-events" in a for a in knobs.vllm_args(cfg))
    assert "kv-events" not in knobs.to_dict(cfg, for_vllm=True)
    assert knobs.to_dict(cfg)["kv-events"] is True  # profiles keep it
    assert knobs.from_dict(knobs.to_dict(cfg)).cache.kv_events is True
    assert knobs.knob_by_name("kv_events").title == "KV events"


def test_kv_events_need_prefix_caching() -> None:
    cfg = LaunchConfig()
    cfg.model.model = "/m"
    cfg.cache.kv_events = True
    cfg.cache.enable_prefix_caching = False
    with pytest.raises(ConfigError, match="cache.kv_events"):
        knobs.validate(cfg)
    cfg.cache.enable_prefix_caching = None  # vLLM's default: on
    knobs.validate(cfg)


def test_a_start_picks_two_loopback_endpoints() -> None:
    config = ServerProcess._kv_events_config()
    assert config["enable_kv_cache_events"] is True and config["publisher"] == "zmq"
    ep, replay = config["endpoint"], config["replay_endpoint"]
    assert ep.startswith("tcp://127.0.0.1:") and replay.startswith("tcp://127.0.0.1:")
    assert ep != replay


class _State:
    """What KvEvents reads of a server: its state, and its config's API key (its /metrics
    may want it)."""

    state = "starting"
    cfg = LaunchConfig()


@pytest.mark.vllm
def test_serve_wiring_binds_on_the_fact_and_prints_once_ready() -> None:
    vkv = pytest.importorskip("vllm.distributed.kv_events")
    config = ServerProcess._kv_events_config()
    server = _State()
    printed: list[Event] = []
    kv = KvEvents(server, printed.append)
    kv.on_server_event(FactEvent("kv_events", config))
    assert kv.subscriber is not None and kv.subscriber.endpoint == config["endpoint"]
    kv.subscriber.hz = 20.0
    pub = vkv.ZmqEventPublisher(
        data_parallel_rank=0,
        endpoint=config["endpoint"],
        replay_endpoint=config["replay_endpoint"],
    )
    try:
        time.sleep(0.5)
        assert printed == []  # not ready yet: nothing printed
        server.state = "ready"
        stored = vkv.BlockStored(
            block_hashes=[b"a" * 32, b"b" * 32],
            parent_block_hash=None,
            token_ids=list(range(8)),
            block_size=4,
            lora_id=None,
            medium="GPU",
            lora_name=None,
            group_idx=0,
        )
        pub.publish(vkv.KVEventBatch(ts=time.time(), events=[stored]))
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not _last_stored(printed):
            time.sleep(0.05)
    finally:
        pub.shutdown()
        kv.stop()
    assert _last_stored(printed) == 2
    assert all(isinstance(e, KvEvent) for e in printed)
    assert not [t for t in threading.enumerate() if t.name == "kv-events"]


def _last_stored(events: list[Any]) -> int:
    return events[-1].blocks_stored_total if events else 0
