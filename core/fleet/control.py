"""The running fleet's control socket: how ``fleet try`` in another shell reaches ``fleet up``.

A Unix socket in Linux's abstract namespace (no file to leave behind, no path-length limit
under a deep cache folder), named at random and written only in the fleet's private state
file. Every connection's peer must be this user (``SO_PEERCRED``): another user is refused
before a byte is read. The protocol is JSON lines: the client sends ``{"op": "try", "instance",
"profile", "options"}``, the fleet answers with the trial's events (``to_json``) as they come,
then ``{"op": "end", "result", "code"}``; meanwhile the client may send ``{"op": "decide",
"decision": "promote"|"rollback"}``. A client that goes away before the decision stops the
trial: the candidate is rolled back (nothing about the incumbent changes).
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
from typing import TYPE_CHECKING, Any

from quantdeck.core.errors import QuantdeckError
from quantdeck.core.events import Event, InstanceEvent, TrialEvent
from quantdeck.core.fleet.trial import TrialOptions
from quantdeck.core.launch.knobs import from_dict

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
        with conn, conn.makefile("rwb") as f:
            try:
                line = f.readline(MAX_LINE)
                request = json.loads(line)
                if not isinstance(request, dict) or request.get("op") != "try":
                    raise QuantdeckError("expected {'op': 'try', ...}")
                self._try(request, f)
            except (QuantdeckError, ValueError, TypeError) as e:
                _send(f, {"op": "end", "result": "refused", "code": 2, "error": str(e)})
            except OSError:
                pass  # the client went away

    def _try(self, request: dict[str, Any], f: Any) -> None:
        name = str(request.get("instance"))
        cfg = from_dict(request.get("profile"), where="the candidate's profile")
        opts = TrialOptions.from_json(dict(request.get("options") or {}))
        events: queue.Queue[Event] = queue.Queue()
        label = name + "+try"

        def mine(ev: Event) -> None:
            if isinstance(ev, InstanceEvent) and ev.instance in (name, label):
                inner = ev.event
                if isinstance(inner, TrialEvent) or ev.instance == label:
                    events.put(ev)

        unsubscribe = self.fleet.subscribe(mine)
        try:
            trial = self.fleet.start_trial(name, cfg, opts)
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
            _send(f, {"op": "end", "result": trial.result, "code": 0})
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
