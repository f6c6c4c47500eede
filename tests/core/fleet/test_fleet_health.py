"""The fleet's word, derived once from its rows (core/fleet/health.py): what the status bar,
the Launch tab, the Fleet tab and `fleet status` say."""

from __future__ import annotations

import pytest

from quantdeck.core.fleet.health import fleet_health
from quantdeck.core.fleet.roles import TRIAL_CANDIDATE
from quantdeck.core.fleet.rows import FleetRow


def _rows(router: str = "ready", **states: str) -> list[FleetRow]:
    rows = [FleetRow("router", "router", "http://r", state=router)]
    for name, state in states.items():
        role = "backup" if name.startswith("backup") else "primary"
        if name.endswith("_try"):
            role = TRIAL_CANDIDATE
        reason = "engine exited" if state == "crashed" else ""
        rows.append(FleetRow(name, role, f"http://{name}", state=state, reason=reason))
    return rows


@pytest.mark.parametrize(
    "router, states, line",
    [
        ("ready", {"a": "ready", "b": "degraded"}, "serving"),
        ("ready", {"a": "crashed", "b": "ready"}, "degraded: a crashed: engine exited; b serving"),
        ("ready", {"a": "hung"}, "down: no instance serves (a hung)"),
        ("ready", {"a": "starting", "b": "ready"}, "degraded: a is starting; b serving"),
        ("ready", {"a": "crashed"}, "down: no instance serves (a crashed: engine exited)"),
        ("crashed", {"a": "ready"}, "down: the router crashed"),
        ("starting", {"a": "ready"}, "down: the router is starting"),
        # a backup waiting is not down; one serving keeps the fleet out of "down"
        ("ready", {"a": "ready", "backup1": "stopped"}, "serving"),
        (
            "ready",
            {"a": "crashed", "backup1": "ready"},
            "degraded: a crashed: engine exited; backup1 serving",
        ),
        # a trial's candidate is the trial's
        ("ready", {"a": "ready", "a_try": "crashed"}, "serving"),
    ],
)
def test_the_word_comes_from_the_instances(router: str, states: dict[str, str], line: str) -> None:
    health = fleet_health("serving", _rows(router, **states))
    assert health.line() == line
    assert health.serves == line.startswith(("serving", "degraded"))


def test_a_fleet_not_serving_says_its_phase() -> None:
    for phase in ("starting", "stopping", "stopped"):
        assert fleet_health(phase, _rows(a="crashed")).line() == phase
