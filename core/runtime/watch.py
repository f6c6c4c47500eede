"""A server watched to its end: ready once ``/health`` answers 200 and ``/v1/models`` lists the
model from a listener of its own; crashed when it exits, an engine process vanishes, something
else answers on its port, or it is not ready by the start-up deadline. A part of
:class:`~.server.ServerProcess`."""

from __future__ import annotations

import collections
import logging
import signal
import subprocess
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import psutil

import quantdeck.core.runtime.server_log as sl
from quantdeck.core.events import Event, FactEvent
from quantdeck.core.http import auth_headers, tls_verify
from quantdeck.core.launch import LaunchConfig
from quantdeck.core.procs import Child, group_pids, signal_group
from quantdeck.core.runtime.debris import alive_pids, drop_engine_tmp, process_tree
from quantdeck.core.runtime.log_reading import SHM_NOTE_S
from quantdeck.core.runtime.ports import listens
from quantdeck.core.shm import ShmLedger

log = logging.getLogger("quantdeck.server")
# something else answering on the port this long, before ours did: the start has failed
FOREIGN_S = 10.0


class Watching:
    """The watcher of :class:`~.server.ServerProcess` (the names below are the server's)."""

    cfg: LaunchConfig
    state: str
    facts: dict[str, Any]
    log_tail: collections.deque[str]
    exit_code: int | None
    crash_reason: str
    run_dir: Path
    startup_timeout: float
    started_at: float | None
    _proc: Child | None
    _shm: ShmLedger | None
    _ready: threading.Event
    _done: threading.Event
    _stop_requested: bool
    _engine_pids: set[int]
    _foreign_since: float | None
    _threads: list[threading.Thread]

    if TYPE_CHECKING:

        @property
        def url(self) -> str: ...

        @property
        def served_name(self) -> str: ...

        @property
        def running(self) -> bool: ...

        def _emit(self, ev: Event) -> None: ...

        def _set_state(self, state: str, *, unless: tuple[str, ...] = (), **extra: Any) -> None: ...

    def _models_ok(self, client: httpx.Client) -> bool:
        r = client.get("/v1/models")
        data = r.json() if r.status_code == 200 else None
        models = data.get("data") if isinstance(data, dict) else None
        return isinstance(models, list) and any(
            isinstance(m, dict) and m.get("id") == self.served_name for m in models
        )

    def _watch(self) -> None:
        """Watch the server to its end. Whatever stops the watching (the start-up deadline,
        an engine process gone, an error of the watcher itself) brings the server down as
        crashed with that reason: a server nobody watches would leave ``serve`` waiting."""
        assert self._proc is not None
        try:
            reason = self._watch_running()
        except Exception as e:  # a bug, or a URL httpx refuses: logged, and the server goes
            log.exception("the watcher of the server at %s failed", self.url)
            reason = f"the watcher failed: {type(e).__name__}: {e}"
        if reason is not None:
            self._crashed(reason)
            drop_engine_tmp(self.run_dir)
            return
        if not self._stop_requested and group_pids(self._proc.pid):
            # what is left of a server that died (multiprocessing's resource tracker...) keeps
            # its log pipe open: the log reader would wait for it, and the crash with it
            self._kill_group(signal.SIGKILL)
        for t in self._threads:
            if t is not threading.current_thread() and t.name == "vllm-log":
                t.join(timeout=5 if self._stop_requested else 1)
        self.exit_code = self._proc.returncode
        if self._stop_requested:
            self._set_state(sl.STOPPED, exit_code=self.exit_code)
        else:
            self._crashed(f"server exited with code {self.exit_code}")
        drop_engine_tmp(self.run_dir)
        self._done.set()

    def _watch_running(self) -> str | None:
        """Poll until ready, then for a vanished engine process, while the server runs: None
        once it has exited, else why it must be brought down."""
        assert self._proc is not None
        with httpx.Client(
            base_url=self.url,
            timeout=2.0,
            headers=auth_headers(self.cfg.server.api_key),
            verify=tls_verify(self.url),
        ) as client:
            noted = 0.0
            while self._proc.poll() is None:
                if not self._ready.is_set():
                    if self._shm is not None and time.monotonic() - noted >= SHM_NOTE_S:
                        # while it starts, whether or not it logs: a start killed between
                        # two lines leaves nothing it was seen to map (the log reader notes
                        # only as lines come)
                        self._shm.note(process_tree(self._proc.pid))
                        noted = time.monotonic()
                    if self._check_ready(client):
                        continue
                    foreign = self._foreign_since
                    if foreign is not None and time.monotonic() - foreign > FOREIGN_S:
                        port = self.cfg.server.port
                        return (
                            f"port {port} answers, but from another process: this server did "
                            "not bind it (two servers started on one port?)"
                        )
                    late = time.time() - (self.started_at or 0) > self.startup_timeout
                    if late and not self._stop_requested:
                        limit = self.startup_timeout
                        return f"did not become ready in {limit:g} s (start-up limit)"
                elif not self._stop_requested and self._engine_pids:
                    gone = sorted(self._engine_pids - alive_pids(self._engine_pids))
                    if gone:
                        return f"engine process {gone[0]} exited"
                time.sleep(0.25)
        return None

    def _check_ready(self, client: httpx.Client) -> bool:
        """One poll of /health and /v1/models; True (and the state ready) once both answer
        and the port's listener is this server's own (something else answering there, e.g.
        a second server started on the same port, is not this one being ready)."""
        try:
            if client.get("/health").status_code != 200 or not self._models_ok(client):
                return False
        except (httpx.HTTPError, ValueError):
            return False
        if not listens(self._group_pids(), self.cfg.server.port):  # (else: another's)
            self._foreign_since = self._foreign_since or time.monotonic()
            return False
        self._engine_pids = self._children()
        self.facts["ready_s"] = round(time.time() - (self.started_at or 0), 2)
        self._emit(FactEvent("ready_s", self.facts["ready_s"]))
        self._ready.set()
        self._set_state(sl.READY, url=self.url)
        return True

    def _children(self) -> set[int]:
        if self._proc is None:
            return set()
        try:
            return {c.pid for c in psutil.Process(self._proc.pid).children(recursive=True)}
        except psutil.Error:
            return set()

    def _crashed(self, reason: str) -> None:
        if self.state in (sl.CRASHED, sl.STOPPED):
            return
        self.crash_reason = reason
        self._set_state(
            sl.CRASHED, exit_code=self.exit_code, reason=reason, log_tail=list(self.log_tail)
        )
        if self.running:  # a half-dead server: take the rest of the group down
            assert self._proc is not None  # running means a process was started
            self._kill_group(signal.SIGKILL)
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            self.exit_code = self._proc.returncode
        elif self._proc is not None and group_pids(self._proc.pid):
            self._kill_group(signal.SIGKILL)  # vLLM's engine core outlives its API server
        self._done.set()

    # -- wait / stop -------------------------------------------------------------------------
    def wait_ready(self, timeout: float = 300.0) -> bool:
        """Block until ready (True), or crashed/stopped/timeout (False)."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self._ready.is_set() and self.state == sl.READY:
                return True
            if self._done.is_set() or self.state in (sl.CRASHED, sl.STOPPED):
                return False
            time.sleep(0.1)
        return False

    def wait_exit(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout)

    def _group_pids(self) -> set[int]:
        pids = set(self._engine_pids)
        if self._proc is not None:
            pids.add(self._proc.pid)
            pids |= self._children()
        return pids

    def _kill_group(self, sig: int) -> None:
        if self._proc is not None:
            signal_group(self._proc.pid, sig)
