"""What separates two launch configs, knob by knob (A/B arms, live trials, timeline markers)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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


# -- one wording of knobs and their changes (issue 44: the trial UI said "max_num_seqs", "Max
# sequences" and "max-num-seqs", and a size as 67108864 in one place and 64MiB in another) -----


def _knob(name: str) -> Any:
    """The knob named ``name`` (its field name, ``max_num_seqs``, or its flag's,
    ``max-num-seqs``); None for an engine option of ``extra_args``."""
    from quantdeck.core.launch.knobs import iter_knobs

    return next((k for k in iter_knobs() if name in (k.name, k.yaml_key)), None)


def knob_name(name: str) -> str:
    """A knob as every view names it: vLLM's flag without its dashes (``max-num-seqs``), as an
    operator types it after ``vllm serve``; an engine option (``extra_args``) by its own."""
    knob = _knob(name)
    return knob.yaml_key if knob is not None else name


def knob_value(name: str, value: Any) -> str:
    """A knob's value as every view says it: sizes in bytes in binary units (``64MiB``, as
    the form and ``--kv-cache-memory-bytes`` take them; or
    the count where it is not a whole number of KiB), booleans on/off, unset by
    its name (``auto``)."""
    knob = _knob(name)
    unit = knob.unit if knob is not None else None
    if value is None:  # a knob's unset value by its name; an engine option not set
        return knob.shown(None) if knob is not None else "default"
    if isinstance(value, bool):
        return "on" if value else "off"
    if unit == "bytes" and isinstance(value, int) and value and value % 1024 == 0:
        for size, word in ((2**40, "TiB"), (2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
            if value % size == 0:
                return f"{value // size}{word}"  # as the form and the CLI read it back
    return str(value)


def change_text(changes: Mapping[str, Sequence[Any]], sep: str = ", ") -> str:
    """``max-num-seqs 8 → 16, kv-cache-memory-bytes 64 MiB → 128 MiB`` (``{knob: (before,
    after)}``, as :func:`knob_diff` and a trial's event give them; an engine option not set on
    one side is ``default`` there)."""
    return sep.join(
        f"{knob_name(k)} {knob_value(k, a)} → {knob_value(k, b)}" for k, (a, b) in changes.items()
    )


def after_text(changes: Mapping[str, Sequence[Any]]) -> str:
    """``max-num-seqs 16, enforce-eager off``: where a change goes (what a promotion serves
    now, what an undo goes back to)."""
    return ", ".join(f"{knob_name(k)} {knob_value(k, b)}" for k, (_, b) in changes.items())


def knobs_text(knobs: Mapping[str, Any], sep: str = ", ") -> str:
    """``max-num-seqs=16, enforce-eager=on`` (the knobs a launch sets)."""
    return sep.join(f"{knob_name(k)}={knob_value(k, v)}" for k, v in knobs.items())
