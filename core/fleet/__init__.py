"""Fleets: several vLLM instances, started or attached, behind vLLM's router.

The names below load their module on first use: what serves is told from the fleet's health
and rows (core/deployment.py) in a window that has started no fleet, and that must not load
the supervisor, the router's client and the trials (httpx, numpy, prometheus_client) for it.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from quantdeck.core.fleet.roles import ROUTER
    from quantdeck.core.fleet.router import FallbackJudge, RouterClient
    from quantdeck.core.fleet.router_keeper import probe
    from quantdeck.core.fleet.spec import (
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

_MODULES = {
    "router": ("FallbackJudge", "RouterClient"),
    "roles": ("ROUTER",),
    "router_keeper": ("probe",),
    "spec": (
        "FallbackRule",
        "FleetSpec",
        "InstanceSpec",
        "RouterSpec",
        "check_fleet",
        "load_fleet",
    ),
    "supervisor": ("Fleet", "router_command", "running_fleet", "state_path", "stop_running_fleet"),
}

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


def __getattr__(name: str) -> Any:
    for module, names in _MODULES.items():
        if name in names:
            return getattr(importlib.import_module(f"{__name__}.{module}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
