"""The Fleet tab's table: its columns over :class:`~quantdeck.core.fleet.rows.FleetRow`, a row
per instance and one for the router."""

from __future__ import annotations

from typing import TYPE_CHECKING

from quantdeck.gui.style import GREEN, ORANGE, RED
from quantdeck.gui.table_model import Column

if TYPE_CHECKING:
    from quantdeck.core.fleet.rows import FleetRow

# the state column's colours: a crashed or hung row reads red, with its reason beside the state
STATE_COLORS = {
    "crashed": RED,
    "hung": RED,
    "ready": GREEN,
    "degraded": ORANGE,
    "starting": ORANGE,
}


def _num(value: float | None, fmt: str = "{:.0f}") -> str:
    return "" if value is None else fmt.format(value)


FLEET_COLUMNS: tuple[Column[FleetRow], ...] = (
    Column("instance", lambda r: r.name, tooltip=lambda r: r.url),
    Column("model", lambda r: r.model),
    Column("format", lambda r: r.format),
    Column("GPUs/CPUs", lambda r: r.placement),
    Column("state", lambda r: r.state_text(), color=lambda r: STATE_COLORS.get(r.state)),
    Column("KV %", lambda r: _num(r.kv_pct), value=lambda r: r.kv_pct),
    Column(
        "run/wait",
        lambda r: "" if r.running is None else f"{r.running}/{r.waiting}",
        align_right=True,
    ),
    Column("tok/s", lambda r: _num(r.tok_s, "{:.1f}"), align_right=True),
    Column("p99 TTFT ms", lambda r: _num(r.ttft_p99_ms), align_right=True),
    Column("role", lambda r: r.role),
    Column("router", lambda r: r.route_text()),
    Column("knobs", lambda r: r.knobs_text(), tooltip=lambda r: r.knobs_text().replace(", ", "\n")),
)
