"""What separates two launch configs, knob by knob (A/B arms, live trials, timeline markers)."""

from __future__ import annotations

from typing import Any

from quantdeck.core.launch.config import LaunchConfig
from quantdeck.core.launch.knobs import iter_knobs


def knob_diff(base: LaunchConfig, cfg: LaunchConfig) -> dict[str, tuple[Any, Any]]:
    """The knobs whose value in ``cfg`` differs from ``base``: ``{knob: (base's, cfg's)}`` in
    the schema's order (secrets left out: they change nothing that is measured)."""
    return {
        k.name: (k.get(base), k.get(cfg))
        for k in iter_knobs()
        if not k.secret_env and k.get(base) != k.get(cfg)
    }
