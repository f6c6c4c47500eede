"""The running fleet's control socket: how ``fleet try`` in another shell reaches ``fleet up``.

A Unix socket in Linux's abstract namespace (no file to leave behind, no path-length limit
under a deep cache folder), named at random and written only in the fleet's private state
file. Every connection's peer must be this user (``SO_PEERCRED``): another user is refused
before a byte is read. The protocol is JSON lines: the client sends ``{"op": "try", "instance",
"profile", "options"}`` (or ``{"op": "undo", "instance"}``: the last promotion undone), the
fleet answers with the trial's events (``to_json``) as they come,
then ``{"op": "end", "result", "code"}``; meanwhile the client may send ``{"op": "decide",
"decision": "promote"|"rollback"}``. A client that goes away before the decision stops the
trial: the candidate is rolled back (nothing about the incumbent changes). The client end is
:func:`request_trial` (``fleet try``, ``tune --live``).
"""

from __future__ import annotations

import json
import logging
import os
import queue
import secrets
import socket
import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from quantdeck.core.errors import QuantdeckError
from quantdeck.core.events import Event, InstanceEvent, TrialEvent, from_json
from quantdeck.core.fleet.trial import TrialOptions
from quantdeck.core.launch import LaunchConfig
from quantdeck.core.launch.knobs import from_dict, to_dict

if TYPE_CHECKING:
    from quantdeck.core.fleet.live import LiveTrial
    from quantdeck.core.fleet.supervisor import Fleet

log = logging.getLogger(__name__)

MAX_LINE = 2**20  # a request is a profile and options: a few KB


def connect(address: str, timeout: float = 10.0) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.connect("\0" + address)
    s.settimeout(None)
    return s


ABORTED_CODE = 3  # the trial ended because an arm failed (LiveTrial.aborted)


@dataclass(frozen=True)
class TrialReply:
    """How a trial requested by :func:`request_trial` ended: ``code`` 0 (a decision was carried
    out: ``result`` promoted or rolled back), 3 (:data:`ABORTED_CODE`: carried out, but forced
    by an arm's failure: the candidate did not start or serve, or the incumbent failed), 2
    (refused before anything started: ``error`` says why) or 1 (the fleet went away before the
    decision); ``decided``: the trial's ``decided`` event (None: none came)."""

    code: int
    result: str | None = None
    error: str | None = None
    decided: TrialEvent | None = None


def request_trial(
    address: str,
    instance: str,
    cfg: LaunchConfig,
    opts: TrialOptions,
    on_message: Callable[[dict[str, Any]], None],
    on_open: Callable[[Callable[[str], None]], None] | None = None,
) -> TrialReply:
    """The client end: ask the fleet whose control socket is ``address`` for a trial of
    ``instance`` against the launch ``cfg``, hand each event of the trial (its JSON object, as
    the fleet sends it) to ``on_message`` until the decision is carried out, and say how it
    ended. ``on_open`` is called once the request is sent with a function that sends the
    operator's decision (``promote`` or ``rollback``; from any thread). Raises ``OSError``
    where the socket cannot be reached."""
    request = {
        "op": "try",
        "instance": instance,
        "profile": to_dict(cfg),
        "options": opts.to_json(),
    }
    return _request(address, request, on_message, on_open)


def request_undo(
    address: str, instance: str, on_message: Callable[[dict[str, Any]], None]
) -> TrialReply:
    """Ask the fleet to undo the last promotion of ``instance`` (``fleet undo``); its events
    go to ``on_message`` as :func:`request_trial`'s do."""
    return _request(address, {"op": "undo", "instance": instance}, on_message, None)


def _request(
    address: str,
    request: dict[str, Any],
    on_message: Callable[[dict[str, Any]], None],
    on_open: Callable[[Callable[[str], None]], None] | None,
) -> TrialReply:
    instance = request["instance"]
    sock = connect(address)
    lock = threading.Lock()
    decided: TrialEvent | None = None
    with sock, sock.makefile("rwb") as f:

        def decide(decision: str) -> None:
            if decision not in ("promote", "rollback"):
                raise ValueError(f"decision {decision!r}: promote or rollback")
            with lock:
                try:
                    _send(f, {"op": "decide", "decision": decision})
                except (OSError, ValueError):  # the trial ended meanwhile: nothing to decide
                    pass

        with lock:
            _send(f, request)
        if on_open is not None:
            on_open(decide)
        for line in f:
            msg = json.loads(line)
            if msg.get("op") == "end":
                code = int(msg.get("code", 1))
                error = msg.get("error")
                return TrialReply(code, msg.get("result"), error and str(error), decided)
            try:
                ev = from_json(msg)
            except ValueError:
                ev = None
            if (
                isinstance(ev, InstanceEvent)
                and isinstance(ev.event, TrialEvent)
                and ev.instance == instance
                and ev.event.phase == "decided"
            ):
                decided = ev.event
            on_message(msg)
    return TrialReply(1, error="the fleet went away before the decision", decided=decided)


class ControlServer:
    """The fleet's end of the socket (a thread accepting, one per connection)."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.address = f"quantdeck-fleet-{os.getpid()}-{secrets.token_hex(8)}"
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind("\0" + self.address)
        self._sock.listen(4)
        self._closed = False
        threading.Thread(target=self._accept, name="fleet-control", daemon=True).start()

    def close(self) -> None:
        self._closed = True
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            _pid, uid, _gid = struct.unpack("3i", creds)
            if uid != os.getuid():
                conn.close()  # another user: nothing read, nothing said
                continue
            threading.Thread(
                target=self._serve, args=(conn,), name="fleet-control-conn", daemon=True
            ).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            self._serve_one(conn)
        except OSError:
            pass  # the client went away (a flush at the end meets a broken pipe)

    def _serve_one(self, conn: socket.socket) -> None:
        with conn, conn.makefile("rwb") as f:
            try:
                line = f.readline(MAX_LINE)
                request = json.loads(line)
                if not isinstance(request, dict) or request.get("op") not in ("try", "undo"):
                    raise QuantdeckError("expected {'op': 'try' or 'undo', ...}")
                name = str(request.get("instance"))
                if request["op"] == "undo":
                    self._follow(name, lambda: self.fleet.undo(name), f)
                else:
                    cfg = from_dict(request.get("profile"), where="the candidate's profile")
                    opts = TrialOptions.from_json(dict(request.get("options") or {}))
                    self._follow(name, lambda: self.fleet.start_trial(name, cfg, opts), f)
            except (QuantdeckError, ValueError, TypeError) as e:
                _send(f, {"op": "end", "result": "refused", "code": 2, "error": str(e)})
            except OSError:
                pass  # the client went away

    def _follow(self, name: str, start: Callable[[], LiveTrial], f: Any) -> None:
        """Start the trial (or undo) and send its events until it is carried out."""
        events: queue.Queue[Event] = queue.Queue()
        label = name + "+try"

        def mine(ev: Event) -> None:
            if isinstance(ev, InstanceEvent) and ev.instance in (name, label):
                inner = ev.event
                if isinstance(inner, TrialEvent) or ev.instance == label:
                    events.put(ev)

        unsubscribe = self.fleet.subscribe(mine)
        try:
            trial = start()
            reader = threading.Thread(
                target=self._read_decisions,
                args=(f, trial),
                name="fleet-control-read",
                daemon=True,
            )
            reader.start()
            while not trial.done.is_set() or not events.empty():
                try:
                    ev = events.get(timeout=0.5)
                except queue.Empty:
                    continue
                _send(f, ev.to_json())
            code = ABORTED_CODE if trial.aborted else 0
            _send(f, {"op": "end", "result": trial.result, "code": code})
        except OSError:
            pass
        finally:
            unsubscribe()

    @staticmethod
    def _read_decisions(f: Any, trial: LiveTrial) -> None:
        """The operator's decisions; the end of the stream (the client gone) rolls back."""
        while not trial.done.is_set():
            try:
                line = f.readline(MAX_LINE)
            except (OSError, ValueError):
                line = b""
            if not line:
                trial.decide("rollback", "the trial's client went away")
                return
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if isinstance(msg, dict) and msg.get("op") == "decide":
                decision = msg.get("decision")
                if decision in ("promote", "rollback"):
                    trial.decide(str(decision), f"the operator chose {decision}")


def _send(f: Any, obj: dict[str, Any]) -> None:
    f.write(json.dumps(obj, default=str).encode() + b"\n")
    f.flush()
