"""Fleets: check a fleet file, bring a fleet up behind vLLM's router, see it, take it down."""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantdeck.cli._common import (
    AddCommand,
    add_record_cap,
    positive_seconds,
    print_json,
    until_signal,
)
from quantdeck.core.errors import ConfigError, QuantdeckError, ServerError, mask_credentials
from quantdeck.core.events import (
    Event,
    InstanceEvent,
    LogEvent,
    MetricsEvent,
    StateEvent,
    TrialEvent,
)

if TYPE_CHECKING:
    from quantdeck.core.fleet.trial import TrialOptions
    from quantdeck.core.monitor import Recorder


def cmd_check(ns: argparse.Namespace) -> int:
    from quantdeck.core.fleet import check_fleet, load_fleet

    spec = load_fleet(ns.file)
    for text in check_fleet(spec):  # it runs, but slower than it could
        print(f"{spec.path}: warning: {text}")
    print(f"{spec.path}: {len(spec.instances)} instances, router on {spec.router.url}: ok")
    return 0


class FleetPrinter:
    """The fleet's events: JSON lines (``"instance"`` on each), or ``NAME: line`` for a person;
    log lines only with ``--logs``; URLs without their credentials.

    ``record``: makes the recording, called once the fleet has passed its checks (its first
    ``starting`` event: a refused fleet writes no file); the events before are kept until
    then. A recording that fails (a full disk) or reaches its cap says so in one line on
    stderr and stops; the fleet goes on."""

    def __init__(
        self, json_events: bool, logs: bool, record: Callable[[], Recorder] | None = None
    ) -> None:
        self.json_events, self.logs = json_events, logs
        self.recorder: Recorder | None = None
        self._record, self._early = record, list[Event]()
        self._lock = threading.Lock()
        self._rec_lock = threading.Lock()

    def _recorded(self, event: Event) -> None:
        """Record ``event`` (everything, log lines too), making the recording when due."""
        with self._rec_lock:
            try:
                if self.recorder is None and self._record is not None:
                    inner = event.event if isinstance(event, InstanceEvent) else event
                    self._early.append(event)
                    if not (isinstance(inner, StateEvent) and inner.state == "starting"):
                        return
                    make, self._record = self._record, None
                    self.recorder = make()
                    early, self._early = self._early, []
                    for e in early:
                        self.recorder.write(e)
                elif self.recorder is not None:
                    self.recorder.write(event)
            except QuantdeckError as e:  # raised once: the recording stops, the fleet goes on
                self._record = None
                self._say(e)

    @staticmethod
    def _say(e: QuantdeckError) -> None:
        from quantdeck.core.monitor import RecordingCapped

        what = "" if isinstance(e, RecordingCapped) else "error: "  # a note, not an error
        print(f"quantdeck: {what}{e}", file=sys.stderr, flush=True)

    def close(self) -> None:
        """Finish the recording; a failure is said in one line."""
        with self._rec_lock:
            try:
                if self.recorder is not None:
                    self.recorder.close()
            except QuantdeckError as e:
                self._say(e)

    def __call__(self, event: Event) -> None:
        if self._record is not None or self.recorder is not None:
            self._recorded(event)
        inner = event.event if isinstance(event, InstanceEvent) else event
        if isinstance(inner, LogEvent) and not self.logs:
            return
        if isinstance(inner, MetricsEvent) and not self.json_events:
            return  # a person reads the news; the figures are in the JSON and the recording
        if self.json_events:
            text = json.dumps(event.to_json(), default=str)
        elif isinstance(event, InstanceEvent):
            text = event.describe()  # NAME: line
        else:
            text = f"fleet: {event.describe()}"
        with self._lock:
            print(mask_credentials(text), flush=True)


def cmd_up(ns: argparse.Namespace) -> int:
    from quantdeck.core.fleet import Fleet, load_fleet
    from quantdeck.core.monitor import Recorder

    spec = load_fleet(ns.file)
    record = None
    if ns.record:
        Recorder.check_target(ns.record)  # refused before anything starts, made once it has
        max_bytes = ns.record_max_mib * 2**20 if ns.record_max_mib else None
        header = {"source": "fleet", "file": str(spec.path)}

        def record() -> Recorder:
            return Recorder(ns.record, header, max_bytes=max_bytes)

    from quantdeck.cli.runtime import say_leftovers

    say_leftovers()  # as serve: what an earlier Quantdeck left (its /dev/shm swept)
    fleet = Fleet(spec, startup_timeout=ns.startup_timeout)
    printer = FleetPrinter(ns.json_events, ns.logs, record)
    fleet.subscribe(printer)
    stop = threading.Event()
    until_signal(stop)  # as serve: a stop signal ends it cleanly, with exit code 0
    try:
        if fleet.serve(stop):
            return 0
        # never silent: why the fleet ended (its events said it too)
        print(f"quantdeck: fleet: {fleet.failure or 'an instance failed'}", file=sys.stderr)
        return 3
    finally:
        printer.close()


def cmd_replay(ns: argparse.Namespace) -> int:
    """A recording of ``fleet up --record``, as the Fleet tab replays it: the fleet's news
    with their times, then its rows as they ended."""
    from quantdeck.core.fleet.rows import event_line, recorded_rows
    from quantdeck.core.monitor import read_recording

    rec = read_recording(ns.file)
    rows = recorded_rows(rec)
    news = []
    for ev in rec.events:
        rows.apply(ev)
        line = event_line(ev) if isinstance(ev, InstanceEvent) else None
        if line is not None:
            news.append({"t": ev.when, "line": line})
    table = [{**r.describe(), "state": r.state_text(), "router": r.route_text()} for r in rows.rows]
    for d, r in zip(table, rows.rows, strict=True):
        d.update(kv_pct=r.kv_pct, running=r.running, waiting=r.waiting, tok_s=r.tok_s)
        d["ttft_p99_ms"] = r.ttft_p99_ms
    if ns.json:
        print_json({"file": ns.file, "duration_s": rec.duration_s, "news": news, "rows": table})
        return 0
    for n in news:
        t = n["t"]
        stamp = time.strftime("%H:%M:%S", time.localtime(t)) if isinstance(t, float) else "--"
        print(f"{stamp}  {n['line']}")
    print(f"\n{ns.file}: {rec.duration_s:.0f} s, as it ended:")
    for d in table:
        figures = " ".join(
            f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
            for k in ("kv_pct", "running", "tok_s", "ttft_p99_ms")
            if (v := d[k]) is not None
        )
        print(f"  {d['name']:<12} {d['role']:<8} {d['state']:<24} {figures} {d['router']}".rstrip())
    return 0


# `fleet status` with no fleet: LSB's "program is not running", as `systemctl status` says it,
# so that a script can ask `quantdeck fleet status || quantdeck fleet up FILE`
NOT_RUNNING = 3


def _running(ns: argparse.Namespace) -> dict[str, Any] | None:
    """The running fleet's state (None: none runs). ``ns.file``, when given, names the fleet
    meant: one that is not the running fleet's file (as its ``fleet up`` named it) is refused,
    so that a script never stops or reports another fleet than it started."""
    from quantdeck.core.fleet import running_fleet

    state = running_fleet()
    if state is None or ns.file is None:
        return state
    running = state.get("file")
    if not isinstance(running, str) or not _same_file(ns.file, running):
        raise ConfigError(f"{ns.file}: not the running fleet's file (that is {running})")
    return state


def _same_file(a: str, b: str) -> bool:
    try:
        return Path(a).expanduser().resolve() == Path(b).expanduser().resolve()
    except (OSError, RuntimeError):  # a loop of links, a name too long
        return False


def cmd_status(ns: argparse.Namespace) -> int:
    from quantdeck.core.fleet import probe

    state = _running(ns)
    if state is None:
        if ns.json:
            print_json({"running": False})
        else:
            print("no fleet running", file=sys.stderr)
        return NOT_RUNNING
    from quantdeck.core.fleet.health import fleet_health
    from quantdeck.core.fleet.rows import FleetRow

    rows = [{"name": "router", "url": state["router"], "role": "router"}, *state["instances"]]
    for row in rows:
        row["state"] = probe(str(row["url"]))
        row["url"] = mask_credentials(str(row["url"]))  # shown, in either form
    # the word the panel says, from what answers now (core/fleet/health.py)
    health = fleet_health(
        "serving",
        [
            FleetRow(str(r["name"]), str(r.get("role")), str(r["url"]), state=r["state"])
            for r in rows
        ],
    )
    if ns.json:
        print_json(
            {
                "running": True,
                "pid": state["pid"],
                "file": state.get("file"),
                "health": {"word": health.word, "why": health.why},
                "rows": rows,
            }
        )
    else:
        print(f"fleet {state.get('file')} (pid {state['pid']}): {health.line()}")
        for row in rows:
            print(f"  {row['name']:<16} {row['role']:<8} {row['state']:<6} {row['url']}")
    return 0


def running_instance(ns: argparse.Namespace) -> tuple[dict[str, Any], dict[str, Any]]:
    """The running fleet's state and its row of instance ``ns.instance`` (one Quantdeck starts:
    its launch knobs are in the row); refused in one line (exit 2) when no fleet runs, it is
    another file's, it takes no trials, or it has no such instance."""
    state = _running(ns)
    if state is None:
        raise ServerError("no fleet running: `quantdeck fleet up FILE` first")
    row = next((i for i in state["instances"] if i.get("name") == ns.instance), None)
    if row is None or not isinstance(row.get("knobs"), dict):
        names = ", ".join(str(i.get("name")) for i in state["instances"])
        raise ConfigError(
            f"no instance '{ns.instance}' that Quantdeck starts (the fleet has {names})"
        )
    if not isinstance(state.get("control"), str):
        raise ServerError("the running fleet takes no trials (an older Quantdeck runs it)")
    return state, row


def trial_options(ns: argparse.Namespace) -> TrialOptions:
    """The trial options of ``fleet try`` / ``tune --live`` (see :func:`add_trial_options`)."""
    from quantdeck.core.fleet.trial import TrialOptions, parse_slo

    return TrialOptions(
        goal=ns.goal,
        slo=parse_slo(ns.slo) if ns.slo else {},
        min_requests=ns.min_requests,
        max_duration_s=ns.max_duration,
        margin=ns.margin,
        decide=getattr(ns, "decide", "auto"),
        keep_s=ns.keep,
        probe=ns.probe,
    )


def trial_printer(json_events: bool, logs: bool = True) -> Callable[[dict[str, Any]], None]:
    """Print a trial's events as the fleet sends them: JSON lines, or ``NAME: line`` for a
    person (the candidate server's log lines only with ``logs``); URLs without credentials."""
    from quantdeck.core.events import from_json
    from quantdeck.core.fleet.rows import fleet_news

    def show(msg: dict[str, Any]) -> None:
        if json_events:
            print(mask_credentials(json.dumps(msg, default=str)), flush=True)
            return
        ev = from_json(msg)
        inner = ev.event if isinstance(ev, InstanceEvent) else ev
        if isinstance(inner, (LogEvent, MetricsEvent)) and not logs:
            return
        line = ev.describe()
        news = fleet_news(inner) if isinstance(inner, TrialEvent) else None
        if isinstance(ev, InstanceEvent) and news is not None:  # the knobs as every view says
            line = f"{ev.instance}: [{inner.kind}] {news.removeprefix('trial ')}"
        print(mask_credentials(line), flush=True)

    return show


def cmd_try(ns: argparse.Namespace) -> int:
    """A live trial of one instance of the running fleet (it runs there: this command sends
    the candidate and prints the trial's events until the decision is carried out)."""
    from quantdeck.core.fleet.control import request_trial
    from quantdeck.core.launch import knobs
    from quantdeck.core.launch.profiles import load_file

    opts = trial_options(ns)
    state, row = running_instance(ns)
    base = load_file(ns.profile) if ns.profile else knobs.from_dict(row["knobs"], where="the fleet")
    cfg = knobs.apply_cli_options(base, ns)

    def ask(decide: Callable[[str], None]) -> None:
        threading.Thread(target=_ask, args=(decide,), daemon=True).start()

    reply = request_trial(
        state["control"],
        ns.instance,
        cfg,
        opts,
        trial_printer(ns.json_events),
        on_open=ask if ns.decide == "ask" else None,
    )
    if reply.error:
        print(f"quantdeck: fleet try: {reply.error}", file=sys.stderr)
    elif not ns.json_events:
        print(f"fleet try: {reply.result}")
    return reply.code


def cmd_undo(ns: argparse.Namespace) -> int:
    """Undo the last promotion of an instance of the running fleet, without downtime."""
    from quantdeck.core.fleet.control import request_undo

    state, _row = running_instance(ns)
    reply = request_undo(state["control"], ns.instance, trial_printer(ns.json_events))
    if reply.error:
        print(f"quantdeck: fleet undo: {reply.error}", file=sys.stderr)
    elif not ns.json_events:
        print(f"fleet undo: {reply.result}")
    return reply.code


def _ask(decide: Callable[[str], None]) -> None:
    """``--decide ask``: the operator types promote or rollback (a line on stdin)."""
    for line in sys.stdin:
        word = line.strip().lower()
        if word in ("promote", "rollback"):
            decide(word)
            return
        print("type promote or rollback", file=sys.stderr)


def cmd_down(ns: argparse.Namespace) -> int:
    from quantdeck.core.fleet import stop_running_fleet

    if _running(ns) is None:
        print("no fleet running", file=sys.stderr)
        return 0
    if not stop_running_fleet(ns.timeout):
        raise ServerError(f"the fleet did not stop within {ns.timeout:g} s")
    print("fleet stopped", file=sys.stderr)
    return 0


ACTIONS = {
    "check": cmd_check,
    "up": cmd_up,
    "status": cmd_status,
    "down": cmd_down,
    "replay": cmd_replay,
    "try": cmd_try,
    "undo": cmd_undo,
}


def cmd_fleet(ns: argparse.Namespace) -> int:
    return ACTIONS[ns.action](ns)


_FILE_HELP = (
    "the fleet file it was brought up from: refused (exit 2) when the running fleet is "
    "another's (default: whichever runs)"
)


def register(add: AddCommand) -> None:
    sp = add("fleet", cmd_fleet, "several vLLM instances behind vLLM's router")
    sub = sp.add_subparsers(dest="action", required=True, metavar="ACTION")
    p = sub.add_parser("check", help="check a fleet file; start nothing")
    p.add_argument("file", help="the fleet file (YAML)")
    p = sub.add_parser("up", help="check, start the instances and the router; stop on a signal")
    p.add_argument("file", help="the fleet file (YAML)")
    p.add_argument("--json-events", action="store_true", help="one JSON object per line")
    p.add_argument("--logs", action="store_true", help="also print the instances' log lines")
    p.add_argument(
        "--record", metavar="OUT", help="record every event (JSONL) for `fleet replay` / the GUI"
    )
    add_record_cap(p)
    p.add_argument(
        "--startup-timeout",
        type=positive_seconds,
        default=None,
        metavar="S",
        help="an instance (a restart, a trial's candidate too) not ready after S seconds is "
        "crashed, and its restart policy applies (default: 1800)",
    )
    p = sub.add_parser(
        "status", help="the running fleet: router, instances and their health (exit 3: none)"
    )
    p.add_argument("file", nargs="?", help=_FILE_HELP)
    p.add_argument("--json", action="store_true")
    p = sub.add_parser("down", help="stop the running fleet (all its processes)")
    p.add_argument("file", nargs="?", help=_FILE_HELP)
    p.add_argument("--timeout", type=positive_seconds, default=120.0, metavar="S")
    _add_try(sub)
    p = sub.add_parser(
        "undo",
        help="undo an instance's last promotion without downtime: its launch from before "
        "back (woken up where it sleeps, else started beside), then promoted",
    )
    p.add_argument("file", help="the fleet file the running fleet was brought up from")
    p.add_argument("instance", help="the instance whose last promotion is undone")
    p.add_argument("--json-events", action="store_true", help="one JSON object per line")
    p = sub.add_parser("replay", help="a fleet recording: its news, then its rows as they ended")
    p.add_argument("file", help="a recording of `fleet up --record`")
    p.add_argument("--json", action="store_true")


def _add_try(sub: Any) -> None:
    from quantdeck.core.fleet.trial import DECIDE
    from quantdeck.core.launch import knobs

    p = sub.add_parser(
        "try",
        help="a live trial: a candidate launch beside an instance of the running fleet, on the "
        "same traffic; promoted or rolled back by the verdict",
        description="Start a candidate (the instance's running launch with the knobs given, or "
        "--profile) on a port of its own, add it to the router beside the incumbent, compare "
        "the two on the router's split of the live traffic, and promote it (the incumbent "
        "drained and stopped, the instance's profile saved, the one before kept) or roll it "
        "back. Nothing about the incumbent changes until the decision. Exit 0 once a decision "
        "was carried out, 3 when it was forced by an arm's failure (the candidate did not "
        "start or serve, or the incumbent crashed or hung), 2 when refused before anything "
        "started. Ctrl-C rolls back.",
    )
    p.add_argument("file", help="the fleet file the running fleet was brought up from")
    p.add_argument("instance", help="the instance to try a candidate for (a local primary)")
    p.add_argument(
        "--profile", metavar="F", help="the candidate's launch (default: the instance's)"
    )
    add_trial_options(p)
    p.add_argument(
        "--decide",
        choices=DECIDE,
        default="auto",
        help="auto, or ask: type promote or rollback (a breach still rolls back by itself)",
    )
    p.add_argument("--json-events", action="store_true", help="one JSON object per line")
    knobs.add_cli_options(p)


def add_trial_options(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """How a trial measures and decides (``fleet try``, and each trial of ``tune --live``)."""
    from quantdeck.core.fleet.trial import GOALS

    p.add_argument("--goal", choices=GOALS, default="ttft_p99", help="what the verdict is on")
    p.add_argument(
        "--slo",
        metavar="LIMITS",
        help="e.g. 'ttft_p99<=500ms,itl_p99<=50ms': a "
        "breach by the candidate rolls it back at once; goodput's limits",
    )
    p.add_argument(
        "--min-requests",
        type=int,
        default=30,
        metavar="N",
        help="per arm, before the first look [30]",
    )
    p.add_argument(
        "--max-duration",
        type=positive_seconds,
        default=300.0,
        metavar="S",
        help="measuring; an inconclusive trial then rolls back, saying so [300]",
    )
    p.add_argument(
        "--margin",
        type=float,
        default=0.10,
        metavar="SHARE",
        help="the smallest effect called a difference [0.10]",
    )
    p.add_argument(
        "--keep",
        type=float,
        default=600.0,
        metavar="S",
        help="after a promotion, an incumbent launched with sleep mode sleeps this long so "
        "that `fleet undo` is a wake-up (0: stop it at once; without sleep mode it stops) [600]",
    )
    p.add_argument(
        "--probe",
        action="store_true",
        help="a paired probe load: the same prompt sent to both arms, one right after the other, "
        "beside the live traffic; its pairs decide (each request's own figures), so the router's "
        "split cannot sway the verdict. Without it the probe starts by itself when the live "
        "traffic is too thin",
    )
