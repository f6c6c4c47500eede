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
