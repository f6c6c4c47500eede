"""The Launch tab (:class:`LaunchTab`): the generated knob form fit for the chosen engine, the
live memory planner and the server actions.

One module a part: ``tab`` assembles them and holds the form, the engine's fit and the start;
``state`` the server actions and the state line they follow (a plain server, or behind the
router its fleet of one); ``profiles`` the saved profiles; ``planner`` the memory plan.
Its modules import each other directly, never through this face."""

from quantdeck.gui.launch.planner import MemoryBar, PlannerPanel
from quantdeck.gui.launch.profiles import ProfilesBar
from quantdeck.gui.launch.state import ROUTER_INSTANCE, STATE_NAMES, ServerActions
from quantdeck.gui.launch.tab import LaunchTab

__all__ = [
    "ROUTER_INSTANCE",
    "STATE_NAMES",
    "LaunchTab",
    "MemoryBar",
    "PlannerPanel",
    "ProfilesBar",
    "ServerActions",
]
