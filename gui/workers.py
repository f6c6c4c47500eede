"""The one way the GUI runs background work: superqt workers on the global QThreadPool.

* A plain blocking call (start a server, scan a cache) is a ``FunctionWorker``:
  :meth:`WorkerSet.start`.
* A generator (the Playground's token stream) is a ``GeneratorWorker``: also
  :meth:`WorkerSet.start`; ``quit()`` stops it at its next ``yield`` (``aborted``, never
  ``returned``).
* A blocking core job that reports events through a callback (a benchmark, the demo build) is a
  :class:`CallWorker`, started by :meth:`WorkerSet.follow`: the call runs in a plain thread that
  the worker's generator owns; its events come back through a thread-safe queue and the
  generator yields them in batches, so the GUI handles them in the ``yielded`` slot, on the GUI
  thread. ``quit()`` calls the job's own ``cancel`` and the worker ends with ``aborted``.

Workers only emit their signals: no Qt object is touched off the GUI thread. Every worker of a
panel is started through the panel's :class:`WorkerSet`, whose errors go one way (``errored`` →
one callback with a one-line message) and which the panel quits and waits for when it closes.

This module imports superqt (about 0.2 s): panels built before the window's first paint import
it where they first start a worker.
"""

from __future__ import annotations

import functools
import queue
import threading
import time
from collections.abc import Callable, Generator
from typing import Any, TypeVar

from PySide6.QtCore import QCoreApplication, QEventLoop
from superqt.utils import GeneratorWorker, WorkerBase, create_worker

from quantdeck.core.errors import QuantdeckError
from quantdeck.core.events import Event

R = TypeVar("R")
EventQueue = queue.SimpleQueue  # of core events, filled from any thread

_DONE = object()  # the call has returned or raised


class CallFailed(Exception):
    """A call's ``RuntimeError``, re-raised under another type: superqt's generator worker takes
    a ``RuntimeError`` for "the worker was deleted" and would drop it without ``errored``."""


def error_text(e: BaseException) -> str:
    """The one-line message of a worker's error: a Quantdeck error as it is, a bug with its
    type."""
    if isinstance(e, CallFailed) and e.__cause__ is not None:
        e = e.__cause__
    return str(e) if isinstance(e, QuantdeckError) else f"{type(e).__name__}: {e}"


def follow_call(
    call: Callable[[], R], events: EventQueue | None, tick_s: float | None
) -> Generator[list[Event], None, R]:
    """Run ``call()`` in a thread of its own; yield the events it puts in ``events`` meanwhile,
    in batches (whatever arrived together), then return its result or raise its error.

    Without ``tick_s`` the generator sleeps until an event or the end (nothing polls while a
    benchmark measures); with it, it also yields an empty batch every ``tick_s`` seconds, so that
    ``quit()`` ends the worker even when the call cannot be cancelled (the call's thread is a
    daemon and finishes on its own)."""
    q: EventQueue = events if events is not None else queue.SimpleQueue()
    outcome: dict[str, Any] = {}

    def body() -> None:
        try:
            outcome["result"] = call()
        except Exception as e:  # handed to the generator, which raises it in the worker
            outcome["error"] = e
        finally:
            q.put(_DONE)

    thread = threading.Thread(target=body, name="quantdeck-call", daemon=True)
    thread.start()
    while True:
        try:
            batch = [q.get(timeout=tick_s)]
        except queue.Empty:
            yield []  # a tick: the worker checks quit() here
            continue
        while True:
            try:
                batch.append(q.get_nowait())
            except queue.Empty:
                break
        done = any(x is _DONE for x in batch)
        batch = [x for x in batch if x is not _DONE]
        if done:
            thread.join()
            yield batch  # even empty: a quit() that came meanwhile ends it as aborted
            break
        yield batch
    if "error" in outcome:
        e = outcome["error"]
        if isinstance(e, RuntimeError):
            raise CallFailed(str(e)) from e
        raise e
    return outcome["result"]


class CallWorker(GeneratorWorker):
    """A generator worker over :func:`follow_call`; ``quit()`` also asks the call to stop."""

    def __init__(
        self,
        call: Callable[[], Any],
        events: EventQueue | None = None,
        *,
        cancel: Callable[[], None] | None = None,
        tick_s: float | None = None,
    ) -> None:
        super().__init__(follow_call, call, events, tick_s)
        self._cancel_call = cancel

    def quit(self) -> None:
        super().quit()
        if self._cancel_call is not None:
            self._cancel_call()  # thread-safe by contract (Bench.cancel, ABRun.cancel, …)


class WorkerSet:
    """The workers one panel started: their errors reach ``on_error`` as one line; ``quit()``
    and ``wait()`` when the panel closes."""

    def __init__(self, on_error: Callable[[str], None]) -> None:
        self._on_error = on_error
        self._running: set[WorkerBase] = set()

    def __len__(self) -> int:
        """The workers started and not yet finished (as seen on the GUI thread)."""
        return len(self._running)

    def _launch(self, worker: WorkerBase, slots: dict[str, Callable[..., Any] | None]) -> Any:
        for name, slot in slots.items():
            if slot is not None:
                getattr(worker, name).connect(slot)
        worker.errored.connect(lambda e: self._on_error(error_text(e)))
        self._running.add(worker)
        worker.finished.connect(functools.partial(self._running.discard, worker))
        worker.start()
        return worker

    def start(
        self,
        func: Callable[..., Any],
        *args: Any,
        returned: Callable[[Any], None] | None = None,
        yielded: Callable[[Any], None] | None = None,
        aborted: Callable[[], None] | None = None,
        finished: Callable[[], None] | None = None,
        **kwargs: Any,
    ) -> Any:
        """Run ``func(*args, **kwargs)``: a ``FunctionWorker``, or a ``GeneratorWorker`` when
        ``func`` is a generator function (``yielded``/``aborted`` then apply)."""
        worker = create_worker(func, *args, _start_thread=False, _ignore_errors=True, **kwargs)
        slots: dict[str, Callable[..., Any] | None] = {"returned": returned, "finished": finished}
        if isinstance(worker, GeneratorWorker):
            slots.update(yielded=yielded, aborted=aborted)
        return self._launch(worker, slots)

    def follow(
        self,
        call: Callable[[], Any],
        events: EventQueue | None = None,
        *,
        cancel: Callable[[], None] | None = None,
        tick_s: float | None = None,
        returned: Callable[[Any], None] | None = None,
        yielded: Callable[[list[Event]], None] | None = None,
        aborted: Callable[[], None] | None = None,
        finished: Callable[[], None] | None = None,
    ) -> CallWorker:
        """Run a blocking core job in a :class:`CallWorker`: ``yielded`` gets its events (from
        ``events``) in batches on the GUI thread, ``returned`` its result."""
        worker = CallWorker(call, events, cancel=cancel, tick_s=tick_s)
        slots = {"returned": returned, "yielded": yielded, "aborted": aborted, "finished": finished}
        return self._launch(worker, slots)

    def quit(self) -> None:
        """Ask every running worker to stop (generators at their next ``yield``)."""
        for w in list(self._running):
            w.quit()

    def wait(self, timeout_s: float = 30.0) -> bool:
        """Process events until every worker has finished (True) or the time is up (False)."""
        deadline = time.monotonic() + timeout_s
        while self._running and time.monotonic() < deadline:
            QCoreApplication.processEvents(QEventLoop.ProcessEventsFlag.AllEvents, 20)
            if self._running:
                time.sleep(0.005)
        return not self._running
