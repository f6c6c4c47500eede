"""Talking to vLLM's router, and the fallback rule that decides when the backups serve.

:class:`RouterClient` is the router's HTTP API as vllm-router 0.1 has it: ``/list_workers``
(``{"urls": [...]}``), ``/get_loads`` (``{"workers": [{"worker", "load"}]}``), ``POST
/add_worker?url=`` and ``POST /remove_worker?url=`` (plain-text answers), and its Prometheus
exposition (``vllm_router_*``: requests, retries, errors, per-worker health and circuit state).

:class:`FallbackJudge` reads the primaries' windowed latency from the fleet's samples of its
instances (the Monitor's own scraper, over the rule's window) and says when the rule switches.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from quantdeck.core.errors import ServerError
from quantdeck.core.events import FallbackEvent, MetricsEvent
from quantdeck.core.fleet.spec import FleetSpec, InstanceSpec
from quantdeck.core.http import auth_headers
from quantdeck.core.snapshots import MetricsSnapshot

# vllm_router_cb_state's values, as the router's circuit breaker numbers its states
CIRCUIT_STATES = {0: "closed", 1: "open", 2: "half-open"}
MAX_BYTES = 4 * 2**20  # a router's exposition is a few KB per worker
# the figures a fallback rule may watch (spec.FALLBACK_METRICS), read from an instance's scrape
RULE_METRICS: dict[str, Callable[[MetricsSnapshot], float | None]] = {
    "ttft_p99_ms": lambda m: m.ttft_p99_ms,
    "ttft_p90_ms": lambda m: m.ttft_p90_ms,
    "itl_p99_ms": lambda m: m.itl_p99_ms,
    "e2e_p99_ms": lambda m: m.e2e_p99_ms,
    "queue_p99_ms": lambda m: m.queue_p99_ms,
}


class RouterClient:
    """The router's HTTP API; every failure is one ServerError line."""

    def __init__(self, url: str, api_key: str | None = None, timeout: float = 3.0) -> None:
        self.url = url.rstrip("/")
        self._headers = auth_headers(api_key)
        self.timeout = timeout

    def _call(self, method: str, path: str, **kw: Any) -> httpx.Response:
        try:
            r = httpx.request(
                method, self.url + path, headers=self._headers, timeout=self.timeout, **kw
            )
        except httpx.HTTPError as e:
            raise ServerError(f"router {path}: {type(e).__name__}") from None
        if r.status_code != 200:
            raise ServerError(f"router {path}: HTTP {r.status_code} {r.text[:200]!r}")
        return r

    def add_worker(self, url: str) -> None:
        self._call("POST", "/add_worker", params={"url": url})

    def remove_worker(self, url: str) -> None:
        self._call("POST", "/remove_worker", params={"url": url})

    def workers(self) -> list[str]:
        """The router's workers; [] when it does not answer."""
        try:
            data = self._call("GET", "/list_workers").json()
        except (ServerError, ValueError):
            return []
        urls = data.get("urls") if isinstance(data, dict) else None
        return sorted(str(u) for u in urls) if isinstance(urls, list) else []

    def loads(self) -> dict[str, float]:
        """Each worker's load as the router counts it (-1: not known to its policy)."""
        try:
            data = self._call("GET", "/get_loads").json()
        except (ServerError, ValueError):
            return {}
        rows = data.get("workers") if isinstance(data, dict) else None
        out = {}
        for row in rows if isinstance(rows, list) else []:
            if isinstance(row, dict) and isinstance(row.get("load"), int | float):
                out[str(row.get("worker"))] = float(row["load"])
        return out

    def facts(self, metrics_url: str) -> dict[str, Any]:
        """Requests, retries and errors so far, and per worker: health, load, circuit state.
        {} when the router's metrics cannot be read."""
        try:
            r = httpx.get(metrics_url, timeout=self.timeout)
            text = r.text[:MAX_BYTES] if r.status_code == 200 else ""
        except httpx.HTTPError:
            text = ""
        if not text:
            return {}
        return router_facts(text, self.workers(), self.loads())


def router_facts(text: str, workers: list[str], loads: dict[str, float]) -> dict[str, Any]:
    """The facts of :meth:`RouterClient.facts` from the router's exposition ``text``."""
    totals = {"requests": 0.0, "retries": 0.0, "errors": 0.0}
    names = {
        "vllm_router_requests": "requests",
        "vllm_router_retries": "retries",
        "vllm_router_request_errors": "errors",
    }
    per: dict[str, dict[str, Any]] = {w: {"url": w} for w in workers}
    try:
        families = list(text_string_to_metric_families(text))
    except (ValueError, KeyError, TypeError):
        return {}
    for fam in families:
        for sample in fam.samples:
            base = sample.name.removesuffix("_total")
            if base in names:
                totals[names[base]] += sample.value
            worker = sample.labels.get("worker")
            if worker not in per:
                continue
            if sample.name == "vllm_router_worker_health":
                per[worker]["healthy"] = sample.value == 1
            elif sample.name == "vllm_router_cb_state":
                per[worker]["circuit"] = CIRCUIT_STATES.get(int(sample.value), "unknown")
    for w, row in per.items():
        if w in loads:
            row["load"] = loads[w]
    return {**{k: int(v) for k, v in totals.items()}, "workers": list(per.values())}


class FallbackJudge:
    """The fleet's fallback rule over time: :meth:`judge` once a second with the worst
    primary's value of the rule's metric (:meth:`worst` of the instances' metrics); an event
    when the rule switches."""

    def __init__(self, spec: FleetSpec) -> None:
        assert spec.fallback is not None  # made only for a fleet with a rule
        self.rule = spec.fallback
        self.backups = [i.name for i in spec.instances if i.role == "backup"]
        self.active = False
        self.value_ms: float | None = None  # the worst primary's, at the last look
        self._over_since: float | None = None
        self._under_since: float | None = None

    def worst(
        self, primaries: list[InstanceSpec], samples: Mapping[str, MetricsEvent]
    ) -> float | None:
        """The highest value of the rule's metric among the primaries' samples (None: no
        request in any window, or none answered: the router's health checks see those)."""
        read = RULE_METRICS[self.rule.metric]
        values = []
        for inst in primaries:
            ev = samples.get(inst.name)
            v = None if ev is None or ev.metrics is None else read(ev.metrics)
            if isinstance(v, int | float) and not isinstance(v, bool):
                values.append(float(v))
        return max(values, default=None)

    def judge(self, value: float | None, now: float) -> FallbackEvent | None:
        """One look: ``value`` the worst primary's (None: no figure), ``now`` in seconds."""
        self.value_ms = v = value
        rule = self.rule
        if v is not None and v > rule.above_ms:
            self._over_since = self._over_since if self._over_since is not None else now
            self._under_since = None
        else:
            self._under_since = self._under_since if self._under_since is not None else now
            self._over_since = None
        if not self.active and self._over_since is not None:
            held = now - self._over_since
            if held >= rule.for_s:
                self.active = True
                return self._event(held)
        if self.active and self._under_since is not None:
            held = now - self._under_since
            if held >= rule.recover_s:
                self.active = False
                return self._event(held)
        return None

    def _event(self, held: float) -> FallbackEvent:
        return FallbackEvent(
            self.active,
            self.rule.metric,
            None if self.value_ms is None else round(self.value_ms, 1),
            self.rule.above_ms,
            round(held, 1),
            list(self.backups),
        )
