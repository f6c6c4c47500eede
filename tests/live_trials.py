"""Live trials as a fleet makes them, not started: the tests drive their steps through the
trial's own events (``trial._event(...)``) on a real :class:`Fleet`'s publisher."""

from __future__ import annotations

from quantdeck.core.fleet import Fleet
from quantdeck.core.fleet.live import LiveTrial
from quantdeck.core.fleet.trial import TrialOptions


def trial_of(
    fleet: Fleet,
    max_num_seqs: int,
    *,
    opts: TrialOptions | None = None,
    undo: str | None = None,
    saved: str = "saved",
) -> LiveTrial:
    """A trial of the fleet's first instance at ``max_num_seqs`` (``undo``: the undo of its
    last promotion, back to that value), its promotion saying ``saved``."""
    inst = fleet.spec.instances[0]
    assert inst.cfg is not None
    cfg = inst.cfg.copy()
    cfg.scheduler.max_num_seqs = max_num_seqs
    return LiveTrial(
        inst,
        cfg,
        opts or TrialOptions(),
        emit=fleet._events.emit,
        promote=lambda t: saved,
        routed_now=lambda url: False,
        undo=undo,
    )
