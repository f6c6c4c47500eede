"""The server: start and watch one (serve), or watch one running elsewhere (monitor)."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from quantdeck.cli._common import (
    AddCommand,
    EventPrinter,
    add_client_options,
    add_engine,
    add_model_and_knobs,
    add_record_cap,
    client_from,
    config_from,
    engine_from,
    fit_for_engine,
    positive_seconds,
    print_json,
    until_signal,
)
from quantdeck.core.errors import ConfigError
from quantdeck.core.events import Event, FactEvent, StateEvent
from quantdeck.core.launch import knobs


def _serve_behind_router(ns: argparse.Namespace, cfg: Any) -> int:
    """``serve --behind-router``: a fleet of one (core.fleet.spec.fleet_of_one) run as ``fleet
    up`` runs a fleet file, so that ``fleet try`` / ``fleet undo`` / ``tune --live`` change its
    knobs live while the URL clients use (the router's: the serve's port) stays."""
    from quantdeck.cli.fleet import cmd_up
    from quantdeck.core.fleet.spec import fleet_of_one
    from quantdeck.core.paths import cache_dir

    if ns.kv_capture:
        raise ConfigError("--kv-capture is not taken with --behind-router")
    path = fleet_of_one(cfg, cache_dir() / "fleet", engine=ns.engine)
    print(
        f"quantdeck: serving behind vLLM's router on {cfg.server.host}:{cfg.server.port}: a "
        f"fleet of one, instance 'serve' ({path}); `quantdeck fleet try {path} serve --KNOB V` "
        "tries a change on the live traffic",
        file=sys.stderr,
    )
    up = argparse.Namespace(
        file=str(path),
        json_events=ns.json_events,
        logs=ns.logs,
        record=ns.record,
        record_max_mib=ns.record_max_mib,
        startup_timeout=ns.startup_timeout,  # serve's own, for the instance (and its trials)
    )
    return int(cmd_up(up))


def cmd_serve(ns: argparse.Namespace) -> int:
    import threading

    from quantdeck.core.monitor import MetricsScraper, ProcessWatch, Recorder, Sampler
    from quantdeck.core.runtime import EngineEnv, ServerProcess, warm_up

    cfg = config_from(ns)
    engine = EngineEnv(engine_from(ns))
    if ns.profile or ns.engine is not None:  # fit for that engine's vLLM before anything starts
        cfg, notes = fit_for_engine(ns, cfg)
        for note in notes:
            print(f"quantdeck: note: {note}", file=sys.stderr)
    if ns.behind_router:
        return _serve_behind_router(ns, cfg)
    server = ServerProcess(cfg, engine=engine, startup_timeout=ns.startup_timeout)
    stop = threading.Event()
    until_signal(stop)  # serve's normal end: a stop signal ends it with exit code 0
    recorder = None
    if ns.record:
        recorder = Recorder(
            ns.record,
            {"source": "serve", "config": knobs.to_dict(cfg), "model": cfg.model.model},
            max_bytes=record_cap(ns),
        )
        from quantdeck.core.monitor import Timeline

        recorder.write(Timeline().launch(knobs.to_dict(cfg)))  # the timeline's launch marker
    out = EventPrinter(ns.json_events, recorder, ns.logs)
    server.subscribe(out)
    server.subscribe(
        lambda ev: stop.set() if isinstance(ev, StateEvent) and ev.state == "crashed" else None
    )
    kv = KvEvents(server, out, capture=ns.kv_capture)
    server.subscribe(kv.on_server_event)
    sampler = None
    say_leftovers()
    try:
        server.start()
        while not stop.is_set() and not server.wait_ready(0.5):
            if server.state in ("crashed", "stopped"):
                break
        if server.state == "ready" and not stop.is_set():
            if ns.warmup:
                warm_up(server, ns.warmup)
            scraper = MetricsScraper(server.url, api_key=cfg.server.api_key, window_s=ns.window)
            sampler = Sampler(hz=ns.hz, scraper=scraper, watch=ProcessWatch(server.pid))
            sampler.subscribe(lambda s: out(s.to_event()))
            sampler.start()
            stop.wait()
    finally:
        if sampler is not None:
            sampler.stop()
        crashed = server.state == "crashed"
        if server.running:
            server.stop()
        kv.stop()
        if recorder is not None:
            recorder.close()
    return 3 if crashed else 0


class KvEvents:
    """``serve --kv-events``: the KV-event subscriber of each start of ``server``
    (:class:`~quantdeck.core.monitor.kv_events.KvFeed`). It binds the endpoint vLLM's publisher
    connects to as soon as the server names it (its ``kv_events`` fact, before vLLM starts), so
    no batch waits for it; its ``kv`` events go to ``out`` once the server is ready."""

    def __init__(self, server: Any, out: Any, capture: str | None = None) -> None:
        self.server, self.out, self.capture = server, out, capture
        self.feed: Any = None  # made on the first kv_events fact: pyzmq loads only then

    @property
    def subscriber(self) -> Any:
        return self.feed.subscriber if self.feed is not None else None

    def on_server_event(self, ev: Event) -> None:
        if self.feed is None:
            if not (isinstance(ev, FactEvent) and ev.name == "kv_events"):
                return
            from quantdeck.core.monitor.kv_events import KvFeed

            self.feed = KvFeed(
                self.out,
                ready=lambda: self.server.state == "ready",
                on_error=lambda msg: print(f"quantdeck: error: {msg}", file=sys.stderr),
                capture=self.capture,
                api_key=self.server.cfg.server.api_key,  # /metrics may want it (open_metrics)
            )
        self.feed.on_server_event(ev)

    def stop(self) -> None:
        if self.feed is not None:
            self.feed.stop()


def cmd_monitor(ns: argparse.Namespace) -> int:
    import threading

    from quantdeck.core.monitor import MetricsScraper, Recorder, Sampler
    from quantdeck.core.runtime import AttachedServer

    client_from(ns)
    att = AttachedServer(ns.url, api_key=ns.api_key)
    models = att.check()
    stop = threading.Event()
    until_signal(stop)  # from here a stop signal ends it cleanly, with exit code 0
    recorder = (
        Recorder(
            ns.record,
            {"source": "monitor", "url": att.url, "models": models},
            max_bytes=record_cap(ns),
        )
        if ns.record
        else None
    )
    out = EventPrinter(ns.json_events, recorder)
    out(StateEvent("attached", url=att.url, models=models))
    sampler = Sampler(
        hz=ns.hz, scraper=MetricsScraper(att.url, api_key=ns.api_key, window_s=ns.window)
    )
    sampler.subscribe(lambda s: out(s.to_event()))
    sampler.start()
    try:
        stop.wait(ns.duration)
    finally:
        sampler.stop()
        if recorder is not None:
            recorder.close()
    return 0


def record_cap(ns: argparse.Namespace) -> int | None:
    """``--record-max-mib`` in bytes (None: the recorder's own cap)."""
    return ns.record_max_mib * 2**20 if ns.record_max_mib else None


def say_leftovers() -> None:
    """One line on stderr when processes an earlier Quantdeck started still run."""
    from quantdeck.core.procs import leftovers

    found = leftovers()
    if found:
        more = f" and {len(found) - 1} more" if len(found) > 1 else ""
        print(
            f"quantdeck: left running by an earlier Quantdeck: {found[0].describe()}{more}; "
            "`quantdeck leftovers --stop` stops them",
            file=sys.stderr,
        )


def cmd_leftovers(ns: argparse.Namespace) -> int:
    from quantdeck.core.procs import leftovers, stop_leftover

    found = leftovers()
    if ns.json:
        print_json([{**vars(x), "path": str(x.path)} for x in found])
    stuck = [x for x in found if ns.stop and not stop_leftover(x)]
    if not ns.json:
        for x in found:
            verb = "could not stop " if x in stuck else "stopped " if ns.stop else ""
            print(verb + x.describe())
        if found and not ns.stop:
            print("stop them with `quantdeck leftovers --stop`", file=sys.stderr)
        if not found:
            print("no leftovers", file=sys.stderr)
    return 1 if stuck else 0


def register(add: AddCommand) -> None:
    sp = add("serve", cmd_serve, "start vLLM, watch it, print events until SIGINT/SIGTERM/SIGHUP")
    add_model_and_knobs(sp)
    sp.add_argument(
        "--startup-timeout",
        type=positive_seconds,
        default=None,
        metavar="S",
        help="give up when the server is not ready after S seconds (default: 1800)",
    )
    sp.add_argument("--json-events", action="store_true", help="one JSON object per line")
    sp.add_argument("--record", metavar="FILE", help="record the session (JSONL) for replay")
    add_record_cap(sp)
    sp.add_argument("--hz", type=float, default=1.0, help="metrics events per second")
    sp.add_argument(
        "--window",
        type=float,
        default=60.0,
        metavar="S",
        help="sliding window of the latency percentiles",
    )
    sp.add_argument(
        "--warmup",
        type=int,
        default=0,
        metavar="N",
        help="warm-up requests after ready (reports first-request latency)",
    )
    add_engine(sp, "serves (Quantdeck need not be installed there)")
    sp.add_argument("--logs", action="store_true", help="also print the server's log lines")
    sp.add_argument(
        "--behind-router",
        action="store_true",
        help="serve as a fleet of one: vLLM's router on the port, the server beside it, so "
        "that `fleet try` changes knobs on the live traffic without a restart and the URL "
        "never changes (the fleet file is written to the cache folder)",
    )
    sp.add_argument(
        "--kv-capture",
        metavar="FILE",
        help="with --kv-events: keep vLLM's KV-event stream as it came, for "
        "benchmarks/kv_ingest.py",
    )

    sp = add("monitor", cmd_monitor, "watch a running vLLM server at URL without owning it")
    sp.add_argument("url")
    add_client_options(sp)
    sp.add_argument("--json-events", action="store_true")
    sp.add_argument("--duration", type=float, default=None, metavar="S")
    sp.add_argument("--record", metavar="FILE")
    add_record_cap(sp)
    sp.add_argument("--hz", type=float, default=1.0)
    sp.add_argument("--window", type=float, default=60.0, metavar="S")

    sp = add(
        "leftovers",
        cmd_leftovers,
        "list processes an earlier Quantdeck started and left running (--stop: stop them)",
    )
    sp.add_argument(
        "--stop",
        action="store_true",
        help="stop them (only processes whose start time matches: a reused pid is never hit)",
    )
    sp.add_argument("--json", action="store_true")
