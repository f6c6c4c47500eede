"""Bad values reaching the launch layer are one ConfigError (or PlanError) line: shapes with
zero or negative counts never plan as "fits", NaN and infinity never pass a float knob, a
profile name is one line, and any profile YAML gives a config or one error."""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from ckpt import TINY_LLAMA, write_checkpoint
from fuzz import fuzz_settings, mutated, one_line_error
from hypothesis import given
from hypothesis import strategies as st

from quantdeck.core.errors import ConfigError, PlanError, QuantdeckError
from quantdeck.core.launch import (
    LaunchConfig,
    advise,
    check_value,
    cpu_device,
    cuda_device,
    from_yaml,
    iter_knobs,
    plan,
    validate,
    vllm_args,
)
from quantdeck.core.launch.profiles import load_file, profile_path
from quantdeck.core.models import ModelInfo, inspect_model

TINY = TINY_LLAMA


@pytest.fixture
def info(tmp_path: Path) -> ModelInfo:
    return inspect_model(write_checkpoint(tmp_path / "m", TINY))


@pytest.mark.parametrize(
    "field, value",
    [
        ("max_position_embeddings", -5),
        ("max_position_embeddings", 0),
        ("num_kv_heads", 0),
        ("num_layers", -1),
        ("head_dim", 0),
    ],
)
def test_nonpositive_shapes_are_refused_not_planned(
    info: ModelInfo, field: str, value: int
) -> None:
    """Before: max_position_embeddings -5 planned as "fits" with negative concurrency."""
    bad = dataclasses.replace(info, **{field: value})
    for device in (cpu_device(), cuda_device(80)):
        with pytest.raises(PlanError, match=f"{field} is {value}, not a positive integer"):
            plan(LaunchConfig(), bad, device)
        findings = advise(LaunchConfig(), bad, device)
        assert [f.level for f in findings] == ["error"] and field in findings[0].message


FLOAT_KNOBS = [k for k in iter_knobs() if k.base is float]


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_float_knobs_refuse_nan_and_infinity(value: float) -> None:
    assert FLOAT_KNOBS
    for k in FLOAT_KNOBS:
        with pytest.raises(ConfigError, match="not a finite number"):
            check_value(k, value)


def test_nan_in_a_profile_is_refused() -> None:
    with pytest.raises(ConfigError, match="gpu_memory_utilization: nan is not a finite number"):
        validate(from_yaml("gpu-memory-utilization: .nan\nmodel: m\n"))


@pytest.mark.parametrize(
    "levels, message",
    [
        (4, "lora_modules: expected a list of str"),
        # a million items once expanded: refused before they are built (as a fleet file's)
        (6, "line 6: its YAML aliases expand to over 100,000 values"),
    ],
)
def test_an_error_shows_a_short_value_however_large(levels: int, message: str) -> None:
    """A shared profile's list of YAML aliases, a million items once expanded, was written out
    whole into the error line."""
    items = ["  - &l0 [x, x, x, x, x, x, x, x, x, x]"]
    items += [f"  - &l{i} [{', '.join([f'*l{i - 1}'] * 10)}]" for i in range(1, levels)]
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match=message) as e:
        from_yaml("lora-modules:\n" + "\n".join(items) + "\n")
    assert len(str(e.value)) < 300 and time.monotonic() - t0 < 1


@pytest.mark.parametrize("name", ["good\n", "a\nb", "", ".hidden", "x" * 81, "a/b"])
def test_profile_names_are_one_line_of_plain_characters(name: str) -> None:
    with pytest.raises(ConfigError, match="profile name"):
        profile_path(name)
    assert profile_path("good name-1.2").name == "good name-1.2.yaml"


@pytest.mark.parametrize(
    "text, message",
    [
        ("[" * 1000, "not valid YAML"),
        ("gpu-memory-utilization: 2020-13-45\n", "not valid YAML"),
        ("max-num-seqs: !!int abc\n", "not valid YAML"),
        ("max-num-seqs: !!float x\n", "not valid YAML"),
    ],
)
def test_damaged_profile_files(tmp_path: Path, text: str, message: str) -> None:
    p = tmp_path / "p.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError, match=message) as e:
        load_file(p)
    one_line_error(e.value)


def test_huge_or_binary_profile_files(tmp_path: Path) -> None:
    p = tmp_path / "p.yaml"
    p.write_bytes(b"a" * (2**20 + 1))
    with pytest.raises(ConfigError, match="over 1 MiB"):
        load_file(p)
    p.write_bytes(b"\xff\xfe")
    with pytest.raises(ConfigError, match="not UTF-8"):
        load_file(p)


YAML_KEYS = [k.yaml_key for k in iter_knobs()] + ["compilation-config", "O", "nope"]
HOSTILE_YAML = st.sampled_from(
    [
        "[" * 1000,
        "a: &a [1]\nb: *a\n",
        "max-num-seqs: 2020-13-45\n",
        "!!python/name:os.system\n",
        "max-num-seqs: !!binary xyz\n",
        "compilation-config: {cudagraph_capture_sizes: [1, .nan]}\n",
        "gpu-memory-utilization: .inf\n",
        "max-model-len: " + "9" * 400 + "k\n",
        "\t: :\n",
    ]
)


@fuzz_settings(70)
@given(
    text=mutated({"max-num-seqs": 8, "model": "m"}, YAML_KEYS).map(
        lambda d: yaml.safe_dump(d, allow_unicode=True)
    )
    | HOSTILE_YAML
    | st.text(max_size=60)
)
def test_fuzz_profile_yaml(tmp_path: Path, text: str) -> None:
    """A profile file gives a config that validates and builds vLLM's arguments, or one
    ConfigError line."""
    p = tmp_path / "fuzz.yaml"
    p.write_text(text, encoding="utf-8")
    try:
        cfg = validate(load_file(p))
        args: Any = vllm_args(cfg)
    except QuantdeckError as e:
        one_line_error(e)
        return
    assert all(isinstance(a, str) for a in args)


@fuzz_settings(40)
@given(
    values=st.dictionaries(st.sampled_from([k.name for k in FLOAT_KNOBS]), st.floats(), max_size=3)
)
def test_fuzz_float_knobs(values: dict[str, float]) -> None:
    """A float knob holds a finite value after validation, whatever it was set to."""
    cfg = LaunchConfig()
    cfg.model.model = "m"
    by_name = {k.name: k for k in FLOAT_KNOBS}
    for name, v in values.items():
        by_name[name].set(cfg, v)
    try:
        validate(cfg)
    except ConfigError:
        return
    assert all(math.isfinite(by_name[n].get(cfg)) for n in values)
