"""Fleets: check a fleet file, bring a fleet up behind vLLM's router, see it, take it down."""

from __future__ import annotations

import argparse
import json
import sys
import threading

from quantdeck.cli._common import (
    AddCommand,
    human_event,
    positive_seconds,
    print_json,
    until_signal,
)
from quantdeck.core.errors import ServerError
from quantdeck.core.events import Event, InstanceEvent, LogEvent


def cmd_check(ns: argparse.Namespace) -> int:
    from quantdeck.core.fleet import check_fleet, load_fleet

    spec = load_fleet(ns.file)
    check_fleet(spec)
    print(f"{spec.path}: {len(spec.instances)} instances, router on {spec.router.url}: ok")
    return 0


class FleetPrinter:
    """The fleet's events: JSON lines (``"instance"`` on each), or ``NAME: line`` for a person;
    log lines only with ``--logs``."""

    def __init__(self, json_events: bool, logs: bool) -> None:
        self.json_events, self.logs = json_events, logs
        self._lock = threading.Lock()

    def __call__(self, event: Event) -> None:
        inner = event.event if isinstance(event, InstanceEvent) else event
        if isinstance(inner, LogEvent) and not self.logs:
            return
        name = event.get("instance") or "fleet"
        text = (
            json.dumps(event.to_json(), default=str)
            if self.json_events
            else f"{name}: {inner.line if isinstance(inner, LogEvent) else human_event(inner)}"
        )
        with self._lock:
            print(text, flush=True)


def cmd_up(ns: argparse.Namespace) -> int:
    from quantdeck.core.fleet import Fleet, load_fleet

    fleet = Fleet(load_fleet(ns.file))
    fleet.subscribe(FleetPrinter(ns.json_events, ns.logs))
    stop = threading.Event()
    until_signal(stop)  # as serve: a stop signal ends it cleanly, with exit code 0
    return 0 if fleet.serve(stop) else 3


def cmd_status(ns: argparse.Namespace) -> int:
    from quantdeck.core.fleet import probe, running_fleet

    state = running_fleet()
    if state is None:
        if ns.json:
            print_json({"running": False})
        else:
            print("no fleet running", file=sys.stderr)
        return 0
    rows = [{"name": "router", "url": state["router"], "role": "router"}, *state["instances"]]
    for row in rows:
        row["state"] = probe(str(row["url"]))
    if ns.json:
        print_json({"running": True, "pid": state["pid"], "file": state.get("file"), "rows": rows})
    else:
        print(f"fleet {state.get('file')} (pid {state['pid']})")
        for row in rows:
            print(f"  {row['name']:<16} {row['role']:<8} {row['state']:<6} {row['url']}")
    return 0


def cmd_down(ns: argparse.Namespace) -> int:
    from quantdeck.core.fleet import running_fleet, stop_running_fleet

    if running_fleet() is None:
        print("no fleet running", file=sys.stderr)
        return 0
    if not stop_running_fleet(ns.timeout):
        raise ServerError(f"the fleet did not stop within {ns.timeout:g} s")
    print("fleet stopped", file=sys.stderr)
    return 0


ACTIONS = {"check": cmd_check, "up": cmd_up, "status": cmd_status, "down": cmd_down}


def cmd_fleet(ns: argparse.Namespace) -> int:
    return ACTIONS[ns.action](ns)


def register(add: AddCommand) -> None:
    sp = add("fleet", cmd_fleet, "several vLLM instances behind vLLM's router")
    sub = sp.add_subparsers(dest="action", required=True, metavar="ACTION")
    p = sub.add_parser("check", help="check a fleet file; start nothing")
    p.add_argument("file", help="the fleet file (YAML)")
    p = sub.add_parser("up", help="check, start the instances and the router; stop on a signal")
    p.add_argument("file", help="the fleet file (YAML)")
    p.add_argument("--json-events", action="store_true", help="one JSON object per line")
    p.add_argument("--logs", action="store_true", help="also print the instances' log lines")
    p = sub.add_parser("status", help="the running fleet: router, instances and their health")
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("down", help="stop the running fleet (all its processes)")
    p.add_argument("--timeout", type=positive_seconds, default=120.0, metavar="S")
