"""A fleet recording written as ``quantdeck fleet up --record`` writes one (its own Recorder,
its typed events), for the replay tests of the Fleet tab and ``fleet replay``; the real
fleet's recording is replayed in tests/cli/test_fleet_server.py."""

from __future__ import annotations

from pathlib import Path

from quantdeck.core.events import (
    Event,
    FactEvent,
    FallbackEvent,
    InstanceEvent,
    MetricsEvent,
    RestartEvent,
    RouteEvent,
    StateEvent,
)
from quantdeck.core.fleet import FleetSpec
from quantdeck.core.fleet.rows import FleetRows
from quantdeck.core.monitor import Recorder

T0 = 1_800_000_000.0
SECONDS = 30  # of metrics: a one a second, b half a second later


def write_fleet_recording(path: Path, spec: FleetSpec) -> Path:
    """Instances a and b of ``spec`` serve for SECONDS s (a's KV 10..39 %, b's 5 %), the
    fallback goes on, then a is killed and its restart planned."""
    rec = Recorder(path, {"source": "fleet", "file": str(spec.path)})

    def w(name: str, ev: Event) -> None:
        rec.write(InstanceEvent(name, ev))

    w("router", FactEvent("fleet", FleetRows(spec).describe(), t=T0))
    w("a", StateEvent("ready", t=T0 + 1))
    w("b", StateEvent("ready", t=T0 + 1))
    w("router", StateEvent("ready", url=spec.router.url, t=T0 + 2))
    w("router", FactEvent("workers", [spec.instances[0].url], t=T0 + 2))
    for i in range(SECONDS):
        a = {"running": 2, "waiting": i % 3, "kv_usage_pct": 10.0 + i, "ttft_p99_ms": 100.0 + i}
        w("a", MetricsEvent.from_values(T0 + 3 + i, {**a, "generation_tokens_per_s": 50.0}))
        b = {"running": 1, "waiting": 0, "kv_usage_pct": 5.0, "ttft_p99_ms": 80.0}
        w("b", MetricsEvent.from_values(T0 + 3.5 + i, {**b, "generation_tokens_per_s": 20.0}))
    w("router", FallbackEvent(True, "ttft_p99_ms", 812.0, 500.0, 2.0, ["b"], t=T0 + 34))
    w("router", RouteEvent("add", spec.instances[1].url, "fallback", t=T0 + 34))
    w("a", StateEvent("crashed", reason="exit code -9", t=T0 + 40))
    w("a", RestartEvent(1, 1.0, t=T0 + 40))
    rec.close()
    return path
