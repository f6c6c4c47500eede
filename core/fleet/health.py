"""What a fleet serves, in one word and one line, derived once from its rows: what the status
bar, the Launch tab, the Fleet tab and ``fleet status`` all say (issue 44).

Before, a fleet whose only instance crashed read "fleet: serving" (the fleet's process ran),
"● serving behind the router" and "serving … Stop" while the router had no worker and clients
got nothing. The word comes from the instances instead:

- ``serving``: the router is up and every primary instance serves;
- ``degraded``: the router is up and some primary serves, but another is down or hung (which,
  and why, in the line);
- ``down``: the fleet runs but clients get nothing: the router is down, or no instance serves
  (the line says why: "serve crashed: engine process exited");
- else the fleet's own phase: ``starting``, ``stopping``, ``stopped``.

Backups are not expected to serve (they wait for the fallback rule), and a live trial's
candidate is the trial's: neither counts, except that a serving backup keeps a fleet out of
``down``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from quantdeck.core.fleet.roles import ROUTER, TRIAL_CANDIDATE

if TYPE_CHECKING:
    from quantdeck.core.fleet.rows import FleetRow

SERVING, DEGRADED, DOWN_WORD = "serving", "degraded", "down"
# the instance states that serve (degraded: slow, kept routed)
SERVES = ("ready", "degraded")


@dataclass(frozen=True)
class FleetHealth:
    """The fleet's word (:data:`SERVING`, :data:`DEGRADED`, :data:`DOWN_WORD`, or its phase)
    and why, with the instances that serve and those that do not."""

    word: str
    why: str = ""
    serving: tuple[str, ...] = ()
    down: tuple[str, ...] = ()  # "a crashed: engine process exited", each

    @property
    def serves(self) -> bool:
        """Clients of the router are answered (serving or degraded)."""
        return self.word in (SERVING, DEGRADED)

    def line(self) -> str:
        """``down: serve crashed: engine process exited``; ``serving``."""
        return f"{self.word}: {self.why}" if self.why else self.word


def _state(row: FleetRow) -> str:
    """``a crashed: engine exited``, ``a hung``, ``a is starting``."""
    verb = f"is {row.state}" if row.state in ("starting", "stopping") else row.state
    return f"{row.name} {verb}" + (f": {row.reason}" if row.reason else "")


def fleet_health(phase: str, rows: Iterable[FleetRow]) -> FleetHealth:
    """The health of a fleet in ``phase`` (the fleet process's: starting, serving, stopping,
    stopped) whose rows are ``rows`` (the router's among them)."""
    if phase != SERVING:
        return FleetHealth(phase)
    rows = list(rows)
    router = next((r for r in rows if r.role == ROUTER), None)
    primaries = [r for r in rows if r.role not in (ROUTER, TRIAL_CANDIDATE, "backup")]
    backups = [r for r in rows if r.role == "backup"]
    serving = tuple(r.name for r in primaries + backups if r.state in SERVES)
    down = tuple(_state(r) for r in primaries if r.state not in SERVES)
    if router is not None and router.state not in SERVES:
        return FleetHealth(DOWN_WORD, f"the {_state(router)}", serving, down)
    if not serving:
        why = "no instance serves" + (f" ({'; '.join(down)})" if down else "")
        return FleetHealth(DOWN_WORD, why, serving, down)
    if down:
        return FleetHealth(
            DEGRADED, f"{'; '.join(down)}; {', '.join(serving)} serving", serving, down
        )
    return FleetHealth(SERVING, "", serving, down)
