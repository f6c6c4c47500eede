"""What separates two launch configs, knob by knob (A/B arms, live trials, timeline markers)."""

from __future__ import annotations

from typing import Any

from quantdeck.core.launch.config import LaunchConfig
from quantdeck.core.launch.engine_args import is_secret
from quantdeck.core.launch.knobs import iter_knobs


def knob_diff(base: LaunchConfig, cfg: LaunchConfig) -> dict[str, tuple[Any, Any]]:
    """The knobs whose value in ``cfg`` differs from ``base``: ``{knob: (base's, cfg's)}`` in
    the schema's order, then the engine's other options (``extra_args``, set with
    ``--vllm-arg`` or the All engine options page) that differ, by vLLM's name for them
    (``scheduling-policy``; ``None`` on the side that does not set one). Secrets are left out:
    they change nothing that is measured."""
    out = {
        k.name: (k.get(base), k.get(cfg))
        for k in iter_knobs()
        if not k.secret_env and k.get(base) != k.get(cfg)
    }
    a, b = base.extra_args, cfg.extra_args
    for name in sorted(set(a) | set(b)):
        if is_secret(name, a.get(name)) or is_secret(name, b.get(name)):
            continue
        if a.get(name) != b.get(name):
            out[name] = (a.get(name), b.get(name))
    return out


def live_candidate(running: LaunchConfig, cfg: LaunchConfig) -> LaunchConfig:
    """``cfg``'s knobs as a candidate of the instance running ``running``: its model, host,
    port and API key are the instance's (the fleet's to give)."""
    out = cfg.copy()
    out.model.model = running.model.model
    out.server.host, out.server.port = running.server.host, running.server.port
    out.server.api_key = running.server.api_key
    return out


def live_changes(running: LaunchConfig, cfg: LaunchConfig) -> dict[str, tuple[Any, Any]]:
    """The knobs a live trial of ``cfg`` would change on the instance running ``running``
    (``{knob: (running's, cfg's)}``; the model, host, port and key are not a trial's)."""
    return {
        k: v
        for k, v in knob_diff(running, live_candidate(running, cfg)).items()
        if k not in ("host", "port")
    }
