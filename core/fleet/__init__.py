"""Fleets: several vLLM instances, started or attached, behind vLLM's router."""

from quantdeck.core.fleet.router import FallbackJudge, RouterClient
from quantdeck.core.fleet.router_keeper import probe
from quantdeck.core.fleet.spec import (
    ROUTER,
    FallbackRule,
    FleetSpec,
    InstanceSpec,
    RouterSpec,
    check_fleet,
    load_fleet,
)
from quantdeck.core.fleet.supervisor import (
    Fleet,
    router_command,
    running_fleet,
    state_path,
    stop_running_fleet,
)

__all__ = [
    "check_fleet",
    "FallbackJudge",
    "FallbackRule",
    "Fleet",
    "FleetSpec",
    "InstanceSpec",
    "load_fleet",
    "probe",
    "ROUTER",
    "router_command",
    "RouterClient",
    "RouterSpec",
    "running_fleet",
    "state_path",
    "stop_running_fleet",
]
