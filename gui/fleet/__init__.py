"""The Fleet tab (:class:`FleetView`): several vLLM instances behind vLLM's router, as
``quantdeck fleet up`` runs them, in a table with a row for the router.

One module a part: ``view`` is the tab (the table, the fleet's lifecycle, its events, the
buttons); ``files`` reads what it shows (fleet files, recordings), ``trials`` runs its live
trials (Try live…, Undo promotion, the Trial view), ``chosen`` the instance the Monitor, Logs
and Playground follow, ``news`` the fleet's events as lines; ``edit_dialog`` is the fleet file
as a form, ``try_live`` a trial's candidate, ``columns`` the table's columns."""

from quantdeck.gui.fleet.columns import FLEET_COLUMNS, STATE_COLORS
from quantdeck.gui.fleet.edit_dialog import FleetEditDialog
from quantdeck.gui.fleet.files import read_fleet
from quantdeck.gui.fleet.try_live import TryLiveDialog, diff_text
from quantdeck.gui.fleet.view import FleetView

__all__ = [
    "FLEET_COLUMNS",
    "STATE_COLORS",
    "FleetEditDialog",
    "FleetView",
    "TryLiveDialog",
    "diff_text",
    "read_fleet",
]
