"""A/B comparison: one load against several launch configs in turn.

Each arm is started, warmed, measured and stopped before the next starts, so the arms never
share the machine. The result keeps per arm: its config, the server's start-up facts (kernel,
KV tokens, ready time), the planner's figures, the benchmark result (per-request records too)
and, where the device's memory bandwidth is known, the batch-1 decode roofline
(weights bytes / bandwidth) with how close the measured per-sequence decode rate came to it.
"""

from __future__ import annotations

import argparse
import shlex
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantdeck.core.bench.client import Bench, LoadSpec
from quantdeck.core.bench.results import ABResult, ArmResult, BenchResult, RoundSummary, Spread
from quantdeck.core.errors import ConfigError, ServerError
from quantdeck.core.events import (
    ArmEvent,
    ArmServerEvent,
    BenchProgress,
    Event,
    ProgressEvent,
    Publisher,
    StateEvent,
)
from quantdeck.core.launch import LaunchConfig, knobs, profiles, to_dict, validate
from quantdeck.core.launch.diff import knob_diff
from quantdeck.core.runtime import EngineEnv, ServerProcess, free_port, warm_up

EventFn = Callable[[Event], None]


@dataclass
class Arm:
    """One arm of an A/B run: its label and the launch config it serves."""

    label: str
    config: LaunchConfig


class _ArmParser(argparse.ArgumentParser):
    """Parses one arm's options; a mistake is a ConfigError, not an exit."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise ConfigError(" ".join(message.split()))


def parse_arm(text: str, base: LaunchConfig) -> Arm:
    """``LABEL=OPTIONS``: the base config with a model path, --profile and knobs on top."""
    label, sep, opts = text.partition("=")
    if not sep or not label.strip():
        raise ConfigError(f"--arm {text!r}: expected LABEL=OPTIONS, e.g. eager=--enforce-eager")
    label = label.strip()
    ap = _ArmParser(prog="--arm", add_help=False)
    ap.add_argument("path", nargs="?")
    ap.add_argument("--profile")
    knobs.add_cli_options(ap)
    try:
        ns = ap.parse_args(shlex.split(opts))
    except (ConfigError, ValueError) as e:
        raise ConfigError(f"--arm {label}: {e}") from None
    cfg = base
    if ns.profile:
        p = Path(ns.profile)
        cfg = profiles.load_file(p) if p.exists() else profiles.load_profile(ns.profile)
    cfg = knobs.apply_cli_options(cfg, ns)
    if ns.path:
        cfg.model.model = ns.path
    return Arm(label, validate(cfg))


def check_arms(arms: list[Arm]) -> None:
    """Refuse arms that cannot be told apart: two labels alike, or two configs alike (their
    difference would be noise, shown as if it were an effect)."""
    labels = [a.label for a in arms]
    if len(set(labels)) != len(labels):
        raise ConfigError(f"arm labels must differ: {', '.join(labels)}")
    for i, a in enumerate(arms):
        for b in arms[i + 1 :]:
            if not knob_diff(a.config, b.config):
                raise ConfigError(
                    f"arms '{a.label}' and '{b.label}' have the same config: "
                    "their difference would be noise (give one an option that differs, "
                    "e.g. --enforce-eager against --no-enforce-eager)"
                )


def roofline(server: ServerProcess) -> dict[str, Any]:
    """Batch-1 decode ceiling: every token reads all weights once from device memory."""
    dev = server.device()
    bw = dev.memory_bandwidth_bytes_per_s
    weights = server.plan.weights_bytes if server.plan else None
    if not bw or not weights:
        return {}
    return {"weights_bytes": weights, "bandwidth_bytes_per_s": bw, "roofline_tok_s": bw / weights}


def attach_roofline(arm: ArmResult) -> None:
    """Measured decode rate per sequence (1000 / median TPOT) against the roofline."""
    roof, res = arm.roofline, arm.result
    tpot = res.median_tpot_ms if res is not None else None
    if roof is not None and roof.roofline_tok_s and tpot:
        rate = 1000.0 / tpot
        roof.decode_tok_s_per_seq = rate
        roof.fraction_of_roofline = rate / roof.roofline_tok_s


ROUND = "#"  # an arm's label in its round: LABEL#N


def abba(arms: list[Arm], rounds: int) -> list[Arm]:
    """The arms in ``rounds`` rounds, every other round in reverse (A B, B A, A B, ...), each
    labelled ``LABEL#N``: a drift of the machine over the run (a warming CPU, a filling page
    cache) then weighs on every arm alike instead of on the later one. One round: as given."""
    if rounds == 1:
        return list(arms)
    out = []
    for r in range(rounds):
        for arm in arms if r % 2 == 0 else reversed(arms):
            out.append(Arm(f"{arm.label}{ROUND}{r + 1}", arm.config))
    return out


def round_summary(results: list[ArmResult]) -> dict[str, RoundSummary]:
    """Per arm over its rounds: each figure's median, min and max (the spread), and how many
    rounds gave a result."""
    import statistics

    by: dict[str, list[BenchResult]] = {}
    for r in results:
        base = r.label.rsplit(ROUND, 1)[0]
        if r.result is not None and not r.error:
            by.setdefault(base, []).append(r.result)
        else:
            by.setdefault(base, [])
    out: dict[str, RoundSummary] = {}
    for base, runs in by.items():

        def spread(key: str, runs: list[BenchResult] = runs) -> Spread | None:
            values = [v for run in runs if (v := run.figure(key)) is not None]
            if not values:
                return None
            return Spread(median=statistics.median(values), min=min(values), max=max(values))

        out[base] = RoundSummary(
            rounds=len(runs),
            output_throughput=spread("output_throughput"),
            median_ttft_ms=spread("median_ttft_ms"),
            p99_ttft_ms=spread("p99_ttft_ms"),
            median_tpot_ms=spread("median_tpot_ms"),
        )
    return out


class ABRun:
    """Runs the arms in turn. ``run()`` blocks (call it from a worker); ``cancel()`` stops the
    arm in progress (its partial result is kept) and skips the rest."""

    def __init__(
        self,
        arms: list[Arm],
        spec: LoadSpec,
        *,
        slo: dict[str, float] | None = None,
        engine: EngineEnv | None = None,
        warmups: int = 2,
        ready_timeout: float = 900.0,
        on_event: EventFn | None = None,
        stop_when: Callable[[list[Any]], str | None] | None = None,
        rounds: int = 1,
    ) -> None:
        check_arms(arms)
        spec.check()
        if rounds < 1:
            raise ConfigError("--rounds must be at least 1")
        self.rounds = rounds
        self.arms = abba(arms, rounds)
        self.spec, self.slo = spec, dict(slo or {})
        self.engine, self.warmups, self.ready_timeout = engine, warmups, ready_timeout
        self._events: Publisher[Event] = Publisher("A/B run")
        if on_event is not None:
            self._events.subscribe(on_event)
        self.stop_when = stop_when
        self._cancel = threading.Event()
        self._bench: Bench | None = None

    def cancel(self) -> None:
        self._cancel.set()
        if self._bench is not None:
            self._bench.cancel()

    def subscribe(self, fn: EventFn) -> Callable[[], None]:
        """Call ``fn`` with every event of the run: :class:`ArmEvent`, :class:`BenchProgress`
        and the arms' server events as :class:`ArmServerEvent`."""
        return self._events.subscribe(fn)

    def _emit(self, ev: Event) -> None:
        self._events.emit(ev)

    def preflight(self) -> None:
        """Every arm's config is valid and its model readable, before the first start."""
        for arm in self.arms:
            ServerProcess(self._cfg(arm), engine=self.engine).preflight()

    def _cfg(self, arm: Arm) -> LaunchConfig:
        cfg = arm.config.copy()
        cfg.server.port = free_port(cfg.server.host)
        return cfg

    def run(self) -> ABResult:
        if len(self.arms) < 2:
            raise ConfigError("an A/B comparison needs at least two arms")
        self.preflight()
        results: list[ArmResult] = []
        for i, arm in enumerate(self.arms):
            if self._cancel.is_set():
                skipped = {"label": arm.label, "config": to_dict(arm.config)}
                results.append(ArmResult.from_json({**skipped, "skipped": "cancelled"}))
                continue
            self._emit(ArmEvent(i, len(self.arms), arm.label, "starting"))
            results.append(self.run_arm(arm, i))
        for r in results:
            attach_roofline(r)
        out: dict[str, Any] = {
            "kind": "ab",
            "date": time.strftime("%Y%m%d-%H%M%S"),
            "load": self.spec.__dict__,
            "slo_ms": self.slo or None,
            "arms": results,
            "cancelled": self._cancel.is_set(),
        }
        if self.rounds > 1:
            out["rounds"] = self.rounds
            out["summary"] = round_summary(results)
        return ABResult.from_json(out)  # in the order a run file was always written in

    def run_arm(self, arm: Arm, index: int) -> ArmResult:
        server = ServerProcess(self._cfg(arm), engine=self.engine)
        out: dict[str, Any] = {"label": arm.label, "config": to_dict(arm.config)}
        server.subscribe(
            lambda ev: (
                self._emit(ArmServerEvent(index, ev))
                if isinstance(ev, (StateEvent, ProgressEvent))
                else None
            )
        )
        t0 = time.time()
        try:
            server.start()
            deadline = time.time() + self.ready_timeout
            while not server.wait_ready(0.5):
                if (
                    self._cancel.is_set()
                    or server.state in ("crashed", "stopped")
                    or time.time() > deadline
                ):
                    break
            if self._cancel.is_set():
                out["error"] = "cancelled"
                return self._arm_done(out, server, index, arm)
            if server.state != "ready":
                out["error"] = (
                    f"server did not become ready ({server.state}): "
                    + " | ".join(list(server.log_tail)[-3:])
                )[:500]
                return self._arm_done(out, server, index, arm)
            out["ready_s"] = round(time.time() - t0, 1)
            out["warmup"] = warm_up(server, self.warmups)
            self._emit(ArmEvent(index, len(self.arms), arm.label, "measuring"))
            if self._cancel.is_set():
                out["error"] = "cancelled"
                return self._arm_done(out, server, index, arm)
            self._bench = Bench(
                server.url,
                server.served_name,
                self.spec,
                api_key=server.cfg.server.api_key,
                slo=self.slo,
                stop_when=self.stop_when,
                on_record=lambda rec, done, total: self._emit(
                    BenchProgress(
                        done, total, index=index, ttft_ms=rec.ttft * 1000 if rec.success else None
                    )
                ),
            )
            out["result"] = self._bench.run()
        except (ServerError, ConfigError) as e:
            out["error"] = str(e)
        except BaseException:
            self._arm_done(out, server, index, arm)
            raise
        return self._arm_done(out, server, index, arm)

    def _arm_done(
        self, out: dict[str, Any], server: ServerProcess, index: int, arm: Arm
    ) -> ArmResult:
        """The arm's end, however it came: its server's facts and plan, the server stopped."""
        self._bench = None
        out["facts"] = dict(server.facts)
        out["plan"] = server.plan.to_json() if server.plan else None
        out["roofline"] = roofline(server) if server.plan else {}
        if server.running:
            server.stop()
        self._emit(ArmEvent(index, len(self.arms), arm.label, "done", error=out.get("error")))
        return ArmResult.from_json(out)  # in the order a run file was always written in
