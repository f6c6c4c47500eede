"""vLLM's KV-cache events: a subscriber and the block index it keeps.

Started with ``--kv-events-config '{"enable_kv_cache_events": true, "publisher": "zmq", ...}'``,
vLLM's scheduler publishes, after each engine step that changed the prefix cache, one
``KVEventBatch`` (msgpack through msgspec) on a ZMQ PUB socket, as three frames:
``[topic, seq, payload]`` with ``seq`` an 8-byte big-endian counter from 0. With a replay
endpoint it also binds a ROUTER socket: a DEALER sends ``[b"", start_seq]`` (8 bytes, big
endian) and gets back every batch it still holds from ``start_seq`` on, as
``[b"", topic, seq, payload]``, then ``[b"", b"", -1, b""]``.

The msgspec structs below mirror ``vllm/distributed/kv_events.py`` (vLLM 0.32) field by field:
the batch is an array, the events are maps tagged with their class name, fields at their
default left out. Fields added by a later vLLM are ignored when decoding.

:class:`BlockIndex` keeps the resident blocks per KV-cache group and the figures; its
definitions are in docs/kv.md. :class:`KvEventSubscriber` feeds it from a background thread,
checks the sequence numbers, asks the replay endpoint for what a gap lost, reports what it could
not get back, and emits a :class:`~quantdeck.core.events.KvEvent` once per second, with vLLM's
own prefix-cache counters of the same server beside the index's figures
(:class:`PrefixCacheCounters`; docs/kv.md, "Two hit rates").
"""

from __future__ import annotations

import heapq
import logging
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx
import msgspec
import numpy as np
import zmq

from quantdeck.core.errors import QuantdeckError, ServerError
from quantdeck.core.events import ABSENT, Event, FactEvent, KvEvent, Publisher, StateEvent
from quantdeck.core.http import auth_headers, tls_verify
from quantdeck.core.monitor.kv_buckets import AGE_EDGES_S, REUSE_EDGES
from quantdeck.core.monitor.metrics import COUNTERS, parse_metrics
from quantdeck.core.payloads import KvGroupStats
from quantdeck.core.payloads import SharedPrefix as SharedPrefixStats

log = logging.getLogger("quantdeck.kv_events")

# -- the wire format: vllm/distributed/kv_events.py, mirrored --------------------------------

ExternalBlockHash = bytes | int  # sha256 bytes; an int with VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES


class KVCacheEvent(msgspec.Struct, omit_defaults=True, gc=False, tag=True):
    """Base of the three events (a map tagged ``"type": CLASS_NAME``)."""


class BlockStored(KVCacheEvent):
    """Full blocks entered the prefix cache: a chain of ``block_hashes`` that continues
    ``parent_block_hash`` (None: it starts a sequence), holding ``token_ids``."""

    block_hashes: list[ExternalBlockHash]
    parent_block_hash: ExternalBlockHash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None
    extra_keys: list[tuple[Any, ...] | None] | None = None
    group_idx: int | None = None
    kv_cache_spec_kind: str | None = None
    kv_cache_spec_sliding_window: int | None = None
    locality: str | None = None
    ownership: str | None = None
    session_id: str | None = None


class BlockRemoved(KVCacheEvent):
    """Blocks left the prefix cache (evicted to make room, or freed from it)."""

    block_hashes: list[ExternalBlockHash]
    medium: str | None
    group_idx: int | None = None
    locality: str | None = None
    ownership: str | None = None


class AllBlocksCleared(KVCacheEvent):
    """The prefix cache was reset."""


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    """One engine step's events."""

    ts: float  # time.time() in the engine when the step ended
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]
    data_parallel_rank: int | None = None


_decoder = msgspec.msgpack.Decoder(KVEventBatch)


def decode_batch(payload: bytes) -> KVEventBatch:
    """A batch from its msgpack payload; ``msgspec.DecodeError`` when it is not one."""
    return _decoder.decode(payload)


END_SEQ = -1  # the replay's last frame carries this sequence number


def hash_id(h: ExternalBlockHash) -> str:
    """A block hash as text (hex), for JSON."""
    return h.hex() if isinstance(h, bytes) else format(h, "x")


# -- the block index --------------------------------------------------------------------------

MAX_PREFIX_TOKENS = 4096  # token ids kept per reported shared prefix
EVICTIONS_KEPT = 1024


@dataclass(slots=True)
class _Block:
    parent: ExternalBlockHash | None
    depth: int  # blocks before this one in its chain (as far as the index knows the chain)
    stored_at: float  # the batch's ts (engine clock)
    tokens: list[int]
    copies: int = 1  # stores minus removals: vLLM may cache one hash in several blocks
    children: int = 0  # resident blocks whose parent this is
    hits: int = 0  # later chains that branched off right after this block


@dataclass(frozen=True)
class Eviction:
    """A block that left the cache: when (engine clock), how long it had been resident."""

    t: float
    group: int
    block: str
    lifetime_s: float
    depth: int


@dataclass(frozen=True)
class SharedPrefix:
    """A resident chain that later chains branched off from: ``hits`` of them, each reusing its
    ``blocks`` blocks; ``tokens`` are its token ids (up to :data:`MAX_PREFIX_TOKENS`, from the
    first block the index knows of)."""

    id: str
    group: int
    blocks: int
    hits: int
    tokens: list[int]


@dataclass
class GroupStats:
    """The figures of one KV-cache group (one attention type: full, sliding window...)."""

    blocks: dict[ExternalBlockHash, _Block] = field(default_factory=dict)
    block_size: int | None = None
    spec_kind: str | None = None
    sliding_window: int | None = None
    medium: str | None = None
    stored: int = 0  # block hashes in BlockStored events (duplicates included)
    duplicates: int = 0  # of those, hashes already resident (computed again, same content)
    removed: int = 0  # block hashes in BlockRemoved events
    removed_unknown: int = 0  # of those, hashes the index did not hold
    reused: int = 0  # blocks reused by branching chains (docs/kv.md)
    age_sum: float = 0.0  # sum of stored_at over resident blocks
    evicted: int = 0
    lifetime_sum: float = 0.0
    branches: dict[ExternalBlockHash, _Block] = field(default_factory=dict)  # hits > 0

    @property
    def resident(self) -> int:
        return len(self.blocks)

    @property
    def hit_rate(self) -> float | None:
        seen = self.reused + self.stored
        return self.reused / seen if seen else None


class BlockIndex:
    """The blocks vLLM's prefix cache holds, as its events tell: per group, each resident
    block's parent, depth, store time and tokens; counts of what was stored, removed, reused
    and evicted. Not thread-safe: :class:`KvEventSubscriber` holds a lock around it."""

    def __init__(self) -> None:
        self.groups: dict[int, GroupStats] = {}
        self.cleared = 0
        self.batches = 0
        self.events = 0
        self.evictions: deque[Eviction] = deque(maxlen=EVICTIONS_KEPT)

    def group(self, idx: int) -> GroupStats:
        g = self.groups.get(idx)
        if g is None:
            g = self.groups[idx] = GroupStats()
        return g

    def apply(self, batch: KVEventBatch) -> None:
        """Take one batch's events, in order."""
        self.batches += 1
        self.events += len(batch.events)
        ts = batch.ts
        for ev in batch.events:
            if isinstance(ev, BlockStored):
                self._stored(ev, ts)
            elif isinstance(ev, BlockRemoved):
                self._removed(ev, ts)
            else:
                self.clear()
                self.cleared += 1

    def _stored(self, ev: BlockStored, ts: float) -> None:
        g = self.group(ev.group_idx or 0)
        if g.block_size is None or ev.block_size > g.block_size:
            g.block_size = ev.block_size  # a partial block's event carries its own length
        if ev.kv_cache_spec_kind is not None:
            g.spec_kind = ev.kv_cache_spec_kind
            g.sliding_window = ev.kv_cache_spec_sliding_window
        g.medium = ev.medium
        blocks = g.blocks
        hashes = ev.block_hashes
        parent_hash = ev.parent_block_hash
        parent = blocks.get(parent_hash) if parent_hash is not None else None
        if parent is not None and parent.children and hashes and hashes[0] not in blocks:
            # a new chain branches off a resident one: its first parent.depth + 1 blocks
            # came from the cache (a chain that only extends a tail is not counted: docs/kv.md)
            g.reused += parent.depth + 1
            parent.hits += 1
            g.branches[parent_hash] = parent  # type: ignore[index]  # parent_hash is set
        depth = parent.depth + 1 if parent is not None else 0
        tokens = ev.token_ids
        bs = ev.block_size
        n = len(hashes)
        for i in range(n):
            h = hashes[i]
            b = blocks.get(h)
            if b is not None:
                b.copies += 1
                g.duplicates += 1
            else:
                b = blocks[h] = _Block(parent_hash, depth, ts, tokens[i * bs : (i + 1) * bs])
                g.age_sum += ts
                if parent is not None:
                    parent.children += 1
            parent, parent_hash, depth = b, h, b.depth + 1
        g.stored += n

    def _removed(self, ev: BlockRemoved, ts: float) -> None:
        g = self.group(ev.group_idx or 0)
        blocks = g.blocks
        for h in ev.block_hashes:
            g.removed += 1
            b = blocks.get(h)
            if b is None:
                g.removed_unknown += 1
                continue
            b.copies -= 1
            if b.copies > 0:
                continue
            del blocks[h]
            g.branches.pop(h, None)
            g.age_sum -= b.stored_at
            life = max(0.0, ts - b.stored_at)
            g.evicted += 1
            g.lifetime_sum += life
            self.evictions.append(Eviction(ts, ev.group_idx or 0, hash_id(h), life, b.depth))
            if b.parent is not None:
                p = blocks.get(b.parent)
                if p is not None and p.children > 0:
                    p.children -= 1

    def clear(self) -> None:
        """Every block gone (AllBlocksCleared, or a restart); counts are kept."""
        for g in self.groups.values():
            g.blocks.clear()
            g.branches.clear()
            g.age_sum = 0.0

    # -- reading ------------------------------------------------------------------------------
    @property
    def stored(self) -> int:
        return sum(g.stored for g in self.groups.values())

    @property
    def removed(self) -> int:
        return sum(g.removed for g in self.groups.values())

    @property
    def resident(self) -> int:
        return sum(g.resident for g in self.groups.values())

    @property
    def reused(self) -> int:
        return sum(g.reused for g in self.groups.values())

    @property
    def prefix_hit_rate(self) -> float | None:
        """Blocks reused / (blocks reused + blocks stored), over every group (docs/kv.md)."""
        seen = self.reused + self.stored
        return self.reused / seen if seen else None

    def tokens_of(
        self, group: int, h: ExternalBlockHash, limit: int = MAX_PREFIX_TOKENS
    ) -> list[int]:
        """The token ids of the chain ending at block ``h``, from its first known block."""
        blocks = self.groups[group].blocks
        parts: list[list[int]] = []
        n = 0
        b = blocks.get(h)
        while b is not None and n < limit:
            parts.append(b.tokens)
            n += len(b.tokens)
            b = blocks.get(b.parent) if b.parent is not None else None
        out = [t for part in reversed(parts) for t in part]
        return out[-limit:] if len(out) > limit else out

    def top_prefixes(self, n: int = 5) -> list[SharedPrefix]:
        """The ``n`` shared prefixes branched off most often (then the longest)."""
        cands = (
            (b.hits, b.depth + 1, gi, h)
            for gi, g in self.groups.items()
            for h, b in g.branches.items()
        )
        best = heapq.nlargest(n, cands, key=lambda c: (c[0], c[1]))
        return [
            SharedPrefix(hash_id(h), gi, blocks, hits, self.tokens_of(gi, h))
            for hits, blocks, gi, h in best
        ]

    def reuse_counts(self, group: int) -> dict[ExternalBlockHash, int]:
        """How often each resident block of ``group`` was reused: the hits of every branch
        point at or after it in its chain (blocks no chain reused are left out)."""
        g = self.groups[group]
        out: dict[ExternalBlockHash, int] = {}
        for h, p in g.branches.items():
            hits = p.hits
            cur: ExternalBlockHash | None = h
            b: _Block | None = p
            while b is not None and cur is not None:
                out[cur] = out.get(cur, 0) + hits
                cur = b.parent
                b = g.blocks.get(cur) if cur is not None else None
        return out

    def cells(self, group: int, now: float) -> list[list[int]]:
        """The block map of ``group``: its resident blocks as runs ``[age bucket, reuse
        bucket, count]`` (:data:`AGE_EDGES_S`, :data:`REUSE_EDGES`), the oldest first and,
        within an age, the least reused first. vLLM's events carry no block ids, so the map
        orders blocks by age, not by where they lie in the pool."""
        g = self.groups.get(group)
        n = g.resident if g is not None else 0
        if g is None or not n:
            return []
        stored_at = np.fromiter((b.stored_at for b in g.blocks.values()), float, n)
        age = np.searchsorted(AGE_EDGES_S, now - stored_at, side="right")
        reuse = self.reuse_counts(group)
        if reuse:
            counts = np.fromiter((reuse.get(h, 0) for h in g.blocks), np.int64, n)
            rb = np.searchsorted(REUSE_EDGES, counts, side="right")
        else:
            rb = np.zeros(n, np.int64)
        nr = len(REUSE_EDGES) + 1
        joint = np.bincount(age * nr + rb, minlength=(len(AGE_EDGES_S) + 1) * nr)
        joint = joint.reshape(-1, nr)[::-1]  # the oldest first
        top = len(AGE_EDGES_S)
        return [
            [top - int(a), int(r), int(joint[a, r])]
            for a, r in zip(*np.nonzero(joint), strict=True)
        ]

    def ages(self, now: float) -> tuple[float | None, float | None]:
        """Mean and largest age (s) of the resident blocks."""
        n = self.resident
        if not n:
            return None, None
        mean = now - sum(g.age_sum for g in self.groups.values()) / n
        oldest = min(
            next(iter(g.blocks.values())).stored_at for g in self.groups.values() if g.blocks
        )
        return max(0.0, mean), max(0.0, now - oldest)


# -- captures: a stream kept as it came, for the ingest benchmark -----------------------------

_FRAME = struct.Struct(">qI")  # seq (signed: END_SEQ), payload length


def write_frame(f: IO[bytes], seq: int, payload: bytes) -> None:
    f.write(_FRAME.pack(seq, len(payload)))
    f.write(payload)


def read_capture(path: str | Path) -> Iterator[tuple[int, bytes]]:
    """The ``(seq, payload)`` frames a subscriber's ``capture`` file holds."""
    with open(path, "rb") as f:
        while head := f.read(_FRAME.size):
            if len(head) < _FRAME.size:
                return  # cut short
            seq, n = _FRAME.unpack(head)
            payload = f.read(n)
            if len(payload) < n:
                return
            yield seq, payload


# -- vLLM's own counters -----------------------------------------------------------------------

_PREFIX_COUNTERS = ("prefix_cache_hits", "prefix_cache_queries")  # metrics.COUNTERS' keys
# ?name[]=... for the two families only (both spellings): a few hundred bytes to parse
_PREFIX_FILTER = [
    ("name[]", n + suffix)
    for key in _PREFIX_COUNTERS
    for n in COUNTERS[key]
    for suffix in ("", "_total")
]


@dataclass(frozen=True)
class PrefixCacheCounts:
    """vLLM's prefix-cache counters at one moment, in tokens since the server started."""

    hit_tokens: int
    query_tokens: int

    @property
    def hit_rate(self) -> float | None:
        return self.hit_tokens / self.query_tokens if self.query_tokens else None


class PrefixCacheCounters:
    """Reads ``vllm:prefix_cache_hits`` and ``vllm:prefix_cache_queries`` (tokens, cumulative)
    from a server's /metrics, as :class:`~quantdeck.core.monitor.metrics.MetricsScraper` parses
    them: only the two families (prometheus_client's ``/metrics/?name[]=``), or the plain
    ``/metrics`` where the filtered path does not carry them. vLLM asks no API key for
    /metrics; one is sent when given (a proxy may want it). Not thread-safe: one thread reads."""

    def __init__(self, url: str, *, api_key: str | None = None, timeout: float = 2.0) -> None:
        self.url = url.rstrip("/")
        headers = {**auth_headers(api_key), "Accept-Encoding": "identity"}
        self._client = httpx.Client(
            base_url=self.url, timeout=timeout, headers=headers, verify=tls_verify(self.url)
        )
        self.filtered = True  # False once the filtered path lacked the counters

    def read(self) -> PrefixCacheCounts | None:
        """The counters now; None when the server exports none. A server that cannot be read
        is a :class:`ServerError`."""
        if self.filtered:
            counts = self._read("/metrics/", _PREFIX_FILTER)
            if counts is not None:
                return counts
            self.filtered = False
        return self._read("/metrics", None)

    def _read(self, path: str, params: Any) -> PrefixCacheCounts | None:
        try:
            r = self._client.get(path, params=params)
        except httpx.HTTPError as e:
            raise ServerError(f"{self.url}/metrics: {type(e).__name__}") from None
        if r.status_code != 200:
            if params is not None:
                return None  # the plain path next
            raise ServerError(f"{self.url}/metrics: HTTP {r.status_code}")
        try:
            c = parse_metrics(r.text).counters
        except (ValueError, KeyError, TypeError, OverflowError) as e:
            raise ServerError(
                f"{self.url}/metrics: not a Prometheus exposition ({type(e).__name__})"
            ) from None
        if not all(k in c for k in _PREFIX_COUNTERS):
            return None
        return PrefixCacheCounts(round(c["prefix_cache_hits"]), round(c["prefix_cache_queries"]))

    def close(self) -> None:
        self._client.close()


# -- the subscriber ---------------------------------------------------------------------------


@dataclass
class StreamStats:
    """What the subscriber saw of the sequence numbers."""

    last_seq: int | None = None
    gaps: int = 0  # times a sequence number was skipped
    replayed: int = 0  # batches the replay endpoint gave back
    lost: int = 0  # batches neither received nor replayed: the index may be wrong since
    duplicates: int = 0  # batches received twice (skipped)
    undecodable: int = 0  # payloads that were not a KVEventBatch (skipped, counted lost)


class KvEventSubscriber:
    """Subscribes to a vLLM KV-event publisher and keeps a :class:`BlockIndex`.

    ``endpoint``: the publisher's PUB address. ``bind``: this side binds it and vLLM connects,
    as vLLM does for any endpoint without a wildcard (``tcp://127.0.0.1:0`` binds a free port,
    read back from :attr:`endpoint`). The socket is made and bound here, so that nothing vLLM
    sends is lost before :meth:`start`; from then on only the thread uses it.
    ``replay_endpoint``: vLLM's ROUTER for catch-up after a gap (None: a gap is lost).
    ``expect_first``: the first sequence number due (0 from a server's start; None: whatever
    comes first). ``capture``: a file that receives every batch in order (:func:`read_capture`).
    An endpoint that cannot be bound or connected is a :class:`ServerError`.
    ``metrics_url``: the server whose prefix-cache counters each event carries beside the
    index's figures (:meth:`read_counters_from`; None: not yet, or never).
    """

    def __init__(
        self,
        endpoint: str,
        *,
        bind: bool = False,
        replay_endpoint: str | None = None,
        topic: str = "",
        hz: float = 1.0,
        expect_first: int | None = 0,
        replay_timeout_s: float = 2.0,
        capture: str | Path | None = None,
        metrics_url: str | None = None,
        api_key: str | None = None,
    ) -> None:
        self.replay_endpoint = replay_endpoint
        self.index = BlockIndex()
        self.stats = StreamStats()
        self.hz = hz
        self.replay_timeout_s = replay_timeout_s
        self._next = expect_first
        self._events: Publisher[Event] = Publisher("kv events")
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.instance()
        self._sub = self._ctx.socket(zmq.SUB)
        self._sub.setsockopt(zmq.LINGER, 0)
        self._sub.setsockopt(zmq.RCVHWM, 0)  # never drop here; vLLM's PUB has its own limit
        self._sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
        try:
            if bind:
                self._sub.bind(endpoint)
                endpoint = self._sub.getsockopt_string(zmq.LAST_ENDPOINT)
            else:
                self._sub.connect(endpoint)
        except zmq.ZMQError as e:
            self._sub.close(linger=0)
            verb = "bind" if bind else "connect to"
            raise ServerError(f"KV events: cannot {verb} {endpoint} ({e})") from None
        self.endpoint = endpoint
        self._capture: IO[bytes] | None = open(capture, "wb") if capture else None  # noqa: SIM115
        self._sent_prefixes: set[str] = set()
        self._last_emit: tuple[float, int, int] | None = None
        self._counters: PrefixCacheCounters | None = None  # used by the thread only
        self._readers: list[PrefixCacheCounters] = []  # every one made: closed with the socket
        self._counts: PrefixCacheCounts | None = None  # the latest read; None: none (yet)
        self._counters_failed = False  # a failure was logged; logged again after a success
        if metrics_url is not None:
            self.read_counters_from(metrics_url, api_key=api_key)

    @classmethod
    def for_server_config(cls, config: dict[str, Any], **kw: Any) -> KvEventSubscriber:
        """The subscriber for a vLLM started with ``--kv-events-config`` ``config`` (the
        ``kv_events`` fact of ``ServerProcess``): binds its ``endpoint``, where vLLM's
        publisher connects (its endpoint has no wildcard), and uses its replay endpoint."""
        return cls(
            config["endpoint"],
            bind=True,
            replay_endpoint=config.get("replay_endpoint"),
            topic=config.get("topic", ""),
            **kw,
        )

    def subscribe(self, fn: Callable[[Event], None]) -> Callable[[], None]:
        """Call ``fn`` with each ``kv`` event (in the subscriber's thread)."""
        return self._events.subscribe(fn)

    def read_counters_from(self, url: str | None, *, api_key: str | None = None) -> None:
        """From now on, read vLLM's prefix-cache counters from the server at ``url`` before
        each ``kv`` event (:meth:`read_counters`; None: no longer, e.g. a server stopping).
        The counters count since the server started and the subscriber binds before vLLM
        spawns, so they cover the same requests as the index; the server answers /metrics only
        once it is up (serve: on its ready state)."""
        with self._lock:
            if url is None or self._sub.closed:  # closed: nothing would close a reader made now
                self._counters, self._counts = None, None
                return
            reader = PrefixCacheCounters(url, api_key=api_key)
            self._readers.append(reader)
            self._counters = reader

    def read_counters(self) -> PrefixCacheCounts | None:
        """One read of vLLM's counters, which the next :meth:`snapshot` carries (the thread
        calls it before each event). A server that cannot be read leaves them out of the
        events until it can be again; the failure is logged once."""
        reader = self._counters
        if reader is None:
            self._counts = None
            return None
        try:
            counts = reader.read()
        except ServerError as e:
            counts = None
            if not self._counters_failed:
                log.warning("KV events: vLLM's prefix-cache counters not read: %s", e)
            self._counters_failed = True
        else:
            if counts is None and not self._counters_failed:
                log.warning("KV events: %s/metrics has no prefix-cache counters", reader.url)
            self._counters_failed = counts is None
        self._counts = counts
        return counts

    # -- lifecycle ----------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="kv-events", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the thread and close the sockets (the index stays readable)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.error("the KV-event subscriber did not stop within %g s", timeout)
                return
        self._close()

    def _close(self) -> None:
        with self._lock:
            if not self._sub.closed:
                self._sub.close(linger=0)
            for reader in self._readers:
                reader.close()
        if self._capture is not None and not self._capture.closed:
            self._capture.close()

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    # -- the thread -----------------------------------------------------------------------------
    def _run(self) -> None:
        period = 1.0 / self.hz if self.hz > 0 else None
        next_emit = time.monotonic() + (period or 0)
        poller = zmq.Poller()
        poller.register(self._sub, zmq.POLLIN)
        try:
            while not self._stop.is_set():
                if poller.poll(100):
                    self._drain()
                if period is not None and time.monotonic() >= next_emit:
                    next_emit += period
                    self.read_counters()
                    self._events.emit(self.snapshot())
        except Exception:
            log.exception("the KV-event subscriber failed")
        finally:
            self._close()

    def _drain(self) -> None:
        while True:
            try:
                frames = self._sub.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(frames) != 3:
                log.warning("KV events: a message of %d frames (expected 3), skipped", len(frames))
                continue
            self.receive(int.from_bytes(frames[1], "big", signed=True), frames[2])

    def receive(self, seq: int, payload: bytes) -> None:
        """One published batch: gaps before it are caught up (or reported), then it is
        applied. Called by the thread; public for replaying a capture through the checks."""
        expected = self._next
        if expected is not None and seq < expected:
            self.stats.duplicates += 1
            return
        if expected is not None and seq > expected:
            self.stats.gaps += 1
            self._catch_up(expected, seq)
        self._apply(seq, payload)

    def _apply(self, seq: int, payload: bytes) -> None:
        try:
            batch = decode_batch(payload)
        except msgspec.DecodeError as e:
            self.stats.undecodable += 1
            self.stats.lost += 1
            log.warning("KV events: batch %d is not a KVEventBatch (%s): lost", seq, e)
        else:
            with self._lock:
                self.index.apply(batch)
        if self._capture is not None:
            write_frame(self._capture, seq, payload)
        self.stats.last_seq = seq
        self._next = seq + 1

    def _catch_up(self, start: int, upto: int) -> None:
        """Ask the replay endpoint for batches ``start`` .. ``upto - 1`` and apply what it
        gives back; the rest is counted lost and logged (never hidden)."""
        pos = start
        if self.replay_endpoint is not None:
            pos = self._replay(start, upto)
        if pos < upto:
            self._lost(
                pos,
                upto,
                "no replay endpoint"
                if self.replay_endpoint is None
                else "not in the replay buffer",
            )
        self._next = upto

    def _lost(self, first: int, end: int, why: str) -> None:
        self.stats.lost += end - first
        log.warning(
            "KV events: batches %d..%d were lost (%s); the block index may hold blocks vLLM "
            "no longer has",
            first,
            end - 1,
            why,
        )

    def _replay(self, start: int, upto: int) -> int:
        """Apply the replayed batches ``start`` .. ``upto - 1`` (the endpoint sends from the
        oldest it still holds); a hole before one is lost. Returns the next sequence number
        still missing (``upto`` when the replay covered the rest)."""
        assert self.replay_endpoint is not None
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        pos = start
        try:
            sock.connect(self.replay_endpoint)
            sock.send_multipart([b"", start.to_bytes(8, "big")])
            deadline = time.monotonic() + self.replay_timeout_s
            while (left := deadline - time.monotonic()) > 0:
                if not sock.poll(int(left * 1000) + 1):
                    log.warning("KV events: the replay endpoint did not finish in time")
                    break
                frames = sock.recv_multipart()
                if len(frames) != 4:
                    continue
                seq = int.from_bytes(frames[2], "big", signed=True)
                if seq == END_SEQ:
                    break
                if seq < pos or seq >= upto:
                    continue  # taken already, or still to come from the live socket
                if seq > pos:
                    self._lost(pos, seq, "not in the replay buffer")
                self._apply(seq, frames[3])
                self.stats.replayed += 1
                pos = seq + 1
        finally:
            sock.close(linger=0)
        return pos

    # -- the figures ----------------------------------------------------------------------------
    def snapshot(self, now: float | None = None) -> KvEvent:
        """The index's figures as one ``kv`` event (rates since the previous snapshot)."""
        now = time.time() if now is None else now
        with self._lock:
            idx = self.index
            stored, removed = idx.stored, idx.removed
            prev = self._last_emit
            dt = now - prev[0] if prev else 0.0
            stored_rate = (stored - prev[1]) / dt if prev and dt > 0 else 0.0
            removed_rate = (removed - prev[2]) / dt if prev and dt > 0 else 0.0
            self._last_emit = (now, stored, removed)
            age_mean, age_max = idx.ages(now)
            evicted = sum(g.evicted for g in idx.groups.values())
            lifetime = sum(g.lifetime_sum for g in idx.groups.values())
            groups = [
                _group_stats(gi, g, idx.cells(gi, now)) for gi, g in sorted(idx.groups.items())
            ]
            top = idx.top_prefixes()
            new_tokens = {p.id: p.tokens for p in top if p.id not in self._sent_prefixes}
            self._sent_prefixes.update(new_tokens)
            counts = self._counts
            return KvEvent(
                blocks_stored_total=stored,
                blocks_removed_total=removed,
                blocks_resident=idx.resident,
                prefix_hit_rate=_round(idx.prefix_hit_rate, 4),
                blocks_reused_total=idx.reused,
                vllm_prefix_hit_rate=ABSENT if counts is None else _round(counts.hit_rate, 4),
                vllm_prefix_hit_tokens_total=ABSENT if counts is None else counts.hit_tokens,
                vllm_prefix_query_tokens_total=ABSENT if counts is None else counts.query_tokens,
                stored_per_s=round(stored_rate, 2),
                removed_per_s=round(removed_rate, 2),
                evicted_total=evicted,
                evicted_lifetime_mean_s=_round(lifetime / evicted if evicted else None, 3),
                resident_age_mean_s=_round(age_mean, 3),
                resident_age_max_s=_round(age_max, 3),
                cleared_total=idx.cleared,
                seq=self.stats.last_seq,
                gaps=self.stats.gaps,
                batches_replayed=self.stats.replayed,
                batches_lost=self.stats.lost,
                groups=groups,
                top_prefixes=[SharedPrefixStats(p.id, p.group, p.blocks, p.hits) for p in top],
                prefix_tokens=new_tokens,
                t=now,
            )


def _round(v: float | None, nd: int) -> float | None:
    return None if v is None else round(v, nd)


def _group_stats(gi: int, g: GroupStats, cells: list[list[int]]) -> KvGroupStats:
    return KvGroupStats(
        group=gi,
        kind=g.spec_kind,
        sliding_window=g.sliding_window,
        block_size=g.block_size,
        medium=g.medium,
        resident=g.resident,
        stored=g.stored,
        removed=g.removed,
        reused=g.reused,
        duplicates=g.duplicates,
        removed_unknown=g.removed_unknown,
        evicted=g.evicted,
        prefix_hit_rate=_round(g.hit_rate, 4),
        cells=cells,
    )


def ingest(index: BlockIndex, frames: Iterable[tuple[int, bytes]]) -> int:
    """Decode and apply captured frames in order; the number of block events taken (each block
    hash of a stored or removed event, and each clear, counts one)."""
    n = 0
    for _seq, payload in frames:
        batch = decode_batch(payload)
        index.apply(batch)
        for ev in batch.events:
            n += len(ev.block_hashes) if not isinstance(ev, AllBlocksCleared) else 1
    return n


class KvFeed:
    """The KV-event subscriber of each start of a server, as ``serve`` and the panel run it.

    Give it the server's events (:meth:`on_server_event`): on its ``kv_events`` fact (emitted
    before vLLM is spawned) it binds and starts a :class:`KvEventSubscriber`, so that no batch
    waits for it; the subscriber's ``kv`` events go to ``out`` (in its thread) while ``ready()``
    says the server is ready; a stopped or crashed server stops it. On the ready state the
    subscriber starts reading vLLM's prefix-cache counters from the state's ``url`` (with
    ``api_key``: the server's /metrics wants it where open_metrics is off), so each event
    carries vLLM's hit rate beside the index's. An endpoint that cannot be bound goes to
    ``on_error`` as one line, and the server serves on without KV events."""

    def __init__(
        self,
        out: Callable[[Event], None],
        *,
        ready: Callable[[], bool],
        on_error: Callable[[str], None],
        capture: str | Path | None = None,
        api_key: str | None = None,
    ) -> None:
        self.out, self.ready, self.on_error, self.capture = out, ready, on_error, capture
        self.api_key = api_key
        self.subscriber: KvEventSubscriber | None = None
        self._lock = threading.Lock()  # the server's threads and the owner's call in

    def on_server_event(self, ev: Event) -> None:
        match ev:
            case StateEvent(state="stopped" | "crashed"):
                self.stop()
            case StateEvent(state="ready", url=str(url)):
                if (sub := self._current()) is not None:
                    sub.read_counters_from(url, api_key=self.api_key)
            case StateEvent(state="stopping"):  # /metrics goes away: no failed reads logged
                if (sub := self._current()) is not None:
                    sub.read_counters_from(None)
            case FactEvent(name="kv_events", value=dict(config)):
                self._start(config)

    def _current(self) -> KvEventSubscriber | None:
        with self._lock:
            return self.subscriber

    def _start(self, config: dict[str, Any]) -> None:
        self.stop()
        try:
            sub = KvEventSubscriber.for_server_config(config, capture=self.capture)
        except QuantdeckError as e:  # the port was taken meanwhile: serve on, say so
            self.on_error(f"{e}; serving without KV events")
            return
        sub.subscribe(lambda e: self.out(e) if self.ready() else None)
        sub.start()
        with self._lock:
            self.subscriber = sub

    def stop(self) -> None:
        """Stop the subscriber (its thread ends, its sockets close), if one runs."""
        with self._lock:
            sub, self.subscriber = self.subscriber, None
        if sub is not None:
            sub.stop()
