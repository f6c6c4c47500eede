"""What serves, told once: the deployment model every view renders (issue 44).

A plain server, the Launch tab's fleet of one behind the router and a fleet of the Fleet tab are
one concept: a deployment. Its word, why, and the URL its clients use are derived here, once,
from the facts the views hold (the server's state, the fleet's phase, rows and health), and the
status bar, the Launch tab and the Fleet tab render the same :class:`Deployment`; before, each
derived "what serves" on its own, and a crashed fleet of one read "serving" in three of them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from quantdeck.core.fleet.health import DEGRADED, DOWN_WORD, SERVING, FleetHealth

if TYPE_CHECKING:
    from quantdeck.core.fleet.rows import FleetRow

# the phases of a fleet that runs (its process's), and the words of one that serves
RUNNING_PHASES = ("starting", "serving", "stopping")
ROUTER_WORDS = ("starting", SERVING, DEGRADED, DOWN_WORD, "stopping")
# how a word is coloured: good (green), bad (red), off (grey), busy (orange: on its way)
GOOD, BAD, OFF, BUSY = "good", "bad", "off", "busy"
_TONES = {
    "ready": GOOD,
    "attached": GOOD,
    SERVING: GOOD,
    "crashed": BAD,
    DOWN_WORD: BAD,
    "stopped": OFF,
}


def tone(word: str) -> str:
    """The colour class of a state word: :data:`GOOD`, :data:`BAD`, :data:`OFF` or
    :data:`BUSY` (starting, stopping, degraded, …)."""
    return _TONES.get(word, BUSY)


@dataclass(frozen=True)
class Deployment:
    """What the Launch tab serves now, and a fleet the Fleet tab runs beside it.

    ``word``: the server's state (starting, ready, attached, stopping, stopped, crashed) or,
    behind the router, its fleet of one's (starting, serving, degraded, down, stopping);
    ``why`` it is degraded or down; ``url``: the one clients use (the router's behind it);
    ``instance``: the instance's own state behind the router (its start's sub-stage);
    ``try_live``: why a live trial cannot start now ("": it can; behind the router only);
    ``fleet``: the health of a fleet of the Fleet tab that runs beside (None: none)."""

    word: str = "stopped"
    behind_router: bool = False
    url: str = ""
    instance: str = ""
    why: str = ""
    try_live: str = ""
    fleet: FleetHealth | None = None

    @property
    def tone(self) -> str:
        return tone(self.word)

    def line(self) -> str:
        """One line, as the status bar says it: ``ready``, ``down behind the router: serve
        crashed: engine exited``, ``stopped · fleet degraded: b hung; a serving``."""
        text = f"{self.word} behind the router" if self.behind_router else self.word
        if self.why:
            text += f": {self.why}"
        if self.fleet is not None:
            text += f" · fleet {self.fleet.line()}"
        return text


def of_server(state: str, url: str = "") -> Deployment:
    """A plain server's (or an attached one's) deployment; its URL only while it serves."""
    return Deployment(state, url=url if state in ("ready", "attached") else "")


def behind_the_router(
    phase: str | None,
    *,
    pending: bool = False,
    row: FleetRow | None = None,
    url: str = "",
    health: FleetHealth | None = None,
    trial_busy: bool = False,
) -> Deployment | None:
    """The Launch tab's fleet of one: its fleet's ``phase`` (None: it does not run, or the
    Fleet tab shows another fleet), ``pending`` (its file written, not yet read), its
    instance's ``row``, the router's ``url``, the fleet's ``health`` and whether a trial is
    under way. None where it neither runs nor is about to."""
    if phase is None and pending:
        phase = "starting"  # written and being read: the fleet has not started yet
    if phase is None:
        return None
    name = row.name if row is not None else "its instance"
    if phase != SERVING:
        blocked = f"the fleet of one is {phase}"
    elif trial_busy:
        blocked = "a trial is under way (its view is in the Fleet tab): one at a time"
    elif row is None or not row.serving:
        blocked = f"instance '{name}' is {row.state if row else 'gone'}"
    else:
        blocked = ""
    word, why = phase, ""
    if phase == SERVING and health is not None:  # the instances' word, not the job's
        word, why = health.word, health.why
    return Deployment(
        word,
        behind_router=True,
        url=url,
        instance=row.state if row is not None else "",
        why=why,
        try_live=blocked,
    )


def beside(deployment: Deployment, phase: str, health: FleetHealth) -> Deployment:
    """``deployment`` with the Fleet tab's fleet told beside it while that one runs (not when
    it is the Launch tab's own fleet of one, told as the deployment itself)."""
    if deployment.behind_router or phase not in RUNNING_PHASES:
        return deployment
    return replace(deployment, fleet=health)
