"""What serves, told once (core/deployment.py): the word, why and URL the status bar and the
Launch tab both render, for a plain server, the Launch tab's fleet of one, and a fleet beside."""

from __future__ import annotations

import pytest

from quantdeck.core.deployment import (
    BAD,
    BUSY,
    GOOD,
    OFF,
    Deployment,
    behind_the_router,
    beside,
    of_server,
)
from quantdeck.core.fleet.health import fleet_health
from quantdeck.core.fleet.rows import FleetRow

pytestmark = pytest.mark.fast

ROUTER_URL = "http://127.0.0.1:18000"


def _rows(instance: str, router: str = "ready") -> list[FleetRow]:
    reason = "engine process exited" if instance == "crashed" else ""
    return [
        FleetRow("router", "router", ROUTER_URL, state=router),
        FleetRow("serve", "primary", "http://127.0.0.1:18101", state=instance, reason=reason),
    ]


@pytest.mark.parametrize(
    "state, url, word, shown_url, tone",
    [
        ("ready", "http://s", "ready", "http://s", GOOD),
        ("attached", "http://s", "attached", "http://s", GOOD),
        ("starting", "http://s", "starting", "", BUSY),  # no URL until it serves
        ("crashed", "http://s", "crashed", "", BAD),
        ("stopped", "", "stopped", "", OFF),
    ],
)
def test_a_plain_server_is_its_state(state, url, word, shown_url, tone) -> None:
    d = of_server(state, url)
    assert (d.word, d.url, d.tone, d.behind_router) == (word, shown_url, tone, False)
    assert d.line() == word


def test_a_crashed_fleet_of_one_is_down_not_serving() -> None:
    """The case of the issue: the fleet's process serves, its only instance crashed; the
    word is the instances' (down, red, why), Try live… off with the instance's state."""
    rows = _rows("crashed")
    d = behind_the_router(
        "serving", row=rows[1], url=ROUTER_URL, health=fleet_health("serving", rows)
    )
    assert d is not None
    assert (d.word, d.tone, d.url) == ("down", BAD, ROUTER_URL)
    assert d.why == "no instance serves (serve crashed: engine process exited)"
    assert d.line() == f"down behind the router: {d.why}"
    assert d.try_live == "instance 'serve' is crashed"


def test_a_serving_fleet_of_one_can_try_live_unless_a_trial_runs() -> None:
    rows = _rows("ready")
    health = fleet_health("serving", rows)
    d = behind_the_router("serving", row=rows[1], url=ROUTER_URL, health=health)
    assert d is not None and (d.word, d.why, d.try_live) == ("serving", "", "")
    busy = behind_the_router("serving", row=rows[1], url=ROUTER_URL, health=health, trial_busy=True)
    assert busy is not None and busy.try_live.startswith("a trial is under way")


def test_a_fleet_of_one_written_but_not_read_is_starting_with_its_instance_stage() -> None:
    assert behind_the_router(None) is None
    pending = behind_the_router(None, pending=True)
    assert pending is not None and pending.word == "starting"
    assert pending.try_live == "the fleet of one is starting"
    rows = _rows("loading_weights", router="starting")
    starting = behind_the_router("starting", row=rows[1], url=ROUTER_URL)
    assert starting is not None and starting.instance == "loading_weights"


def test_a_fleet_beside_is_told_after_the_server_and_not_for_the_fleet_of_one() -> None:
    rows = _rows("crashed")
    health = fleet_health("serving", rows)
    d = beside(of_server("stopped"), "serving", health)
    assert d.fleet is health
    assert d.line().startswith("stopped · fleet down: no instance serves")
    assert beside(of_server("stopped"), "stopped", fleet_health("stopped", rows)).fleet is None
    own = Deployment("serving", behind_router=True, url=ROUTER_URL)
    assert beside(own, "serving", health) is own  # told as the deployment itself
