"""The server: start and watch one (serve), or watch one running elsewhere (monitor)."""

from __future__ import annotations

import argparse

from quantdeck.cli._common import (
    AddCommand,
    EventPrinter,
    add_model_and_knobs,
    config_from,
    until_signal,
)
from quantdeck.core.events import StateEvent
from quantdeck.core.launch import knobs


def cmd_serve(ns: argparse.Namespace) -> int:
    import threading

    from quantdeck.core.monitor import MetricsScraper, ProcessWatch, Recorder, Sampler
    from quantdeck.core.runtime import EngineEnv, ServerProcess, warm_up

    cfg = config_from(ns)
    engine = EngineEnv(ns.engine_python) if ns.engine_python else EngineEnv()
    server = ServerProcess(cfg, engine=engine)
    recorder = None
    if ns.record:
        recorder = Recorder(
            ns.record, {"source": "serve", "config": knobs.to_dict(cfg), "model": cfg.model.model}
        )
    out = EventPrinter(ns.json_events, recorder, ns.logs)
    server.subscribe(out)
    stop = threading.Event()
    until_signal(stop)
    server.subscribe(lambda ev: stop.set() if ev.get("state") == "crashed" else None)
    sampler = None
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
        if recorder is not None:
            recorder.close()
    return 3 if crashed else 0


def cmd_monitor(ns: argparse.Namespace) -> int:
    import threading

    from quantdeck.core.monitor import MetricsScraper, Recorder, Sampler
    from quantdeck.core.runtime import AttachedServer

    att = AttachedServer(ns.url, api_key=ns.api_key)
    models = att.check()
    recorder = (
        Recorder(ns.record, {"source": "monitor", "url": att.url, "models": models})
        if ns.record
        else None
    )
    out = EventPrinter(ns.json_events, recorder)
    out(StateEvent("attached", url=att.url, models=models))
    stop = threading.Event()
    until_signal(stop)
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


def register(add: AddCommand) -> None:
    sp = add("serve", cmd_serve, "start vLLM, watch it, print events until SIGINT/SIGTERM")
    add_model_and_knobs(sp)
    sp.add_argument("--json-events", action="store_true", help="one JSON object per line")
    sp.add_argument("--record", metavar="FILE", help="record the session (JSONL) for replay")
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
    sp.add_argument(
        "--engine-python", metavar="PY", help="the Python whose vLLM to run (default: this one)"
    )
    sp.add_argument("--logs", action="store_true", help="also print the server's log lines")

    sp = add("monitor", cmd_monitor, "watch a running vLLM server at URL without owning it")
    sp.add_argument("url")
    sp.add_argument("--api-key")
    sp.add_argument("--json-events", action="store_true")
    sp.add_argument("--duration", type=float, default=None, metavar="S")
    sp.add_argument("--record", metavar="FILE")
    sp.add_argument("--hz", type=float, default=1.0)
    sp.add_argument("--window", type=float, default=60.0, metavar="S")
