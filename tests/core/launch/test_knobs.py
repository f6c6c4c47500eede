"""The one schema: every knob declared fully, and every product of the walker round-trips."""

from __future__ import annotations

import argparse
import dataclasses
import json
import random

import pytest
import yaml

from quantdeck.core.errors import ConfigError
from quantdeck.core.launch import GROUPS, LaunchConfig, iter_knobs, knobs, profiles


def test_every_knob_is_declared_fully() -> None:
    ks = iter_knobs()
    assert len(ks) == sum(len(dataclasses.fields(c)) for c in GROUPS.values())
    for k in ks:
        assert k.doc and k.doc.endswith((".", ")")), k.key
        assert k.flag.startswith("--"), k.key
        if k.numeric:
            assert k.ge is not None or k.gt is not None, f"{k.key} has no lower bound"
        knobs.check_value(k, k.default)  # the default itself is valid


def test_groups_follow_vllm() -> None:
    names = {k.name: k.group for k in iter_knobs()}
    assert names["gpu_memory_utilization"] == "cache"
    assert names["max_num_batched_tokens"] == "scheduler"
    assert names["enforce_eager"] == "compilation"
    assert names["tensor_parallel_size"] == "parallel"
    assert names["max_lora_rank"] == "lora"
    assert names["host"] == "server"


def _random_config(rng: random.Random) -> LaunchConfig:
    """A valid config with roughly half the knobs moved off their defaults."""
    cfg = LaunchConfig()
    cfg.model.model = "/models/x"
    for k in iter_knobs():
        if k.positional or k.secret_env or k.quantdeck_only or rng.random() < 0.5:
            continue  # secrets and Quantdeck's own settings never reach vLLM's argv
        if k.choices is not None:
            v = rng.choice(k.choices)
        elif k.base is bool:
            v = rng.choice([True, False])
        elif k.base is int:
            lo = int(k.ge if k.ge is not None else (k.gt or 0) + 1)
            v = rng.randint(max(lo, 1), int(min(k.le or 4096, 4096)))
        elif k.base is float:
            v = round(rng.uniform(0.05, min(k.le or 10.0, 10.0)), 3)
        elif k.to_vllm is not None:  # vLLM's JSON, as vllm_args writes it (ngram:K: below)
            v = '{"method":"ngram","num_speculative_tokens":2}'
        elif k.base is list:
            v = sorted(rng.sample(range(1, 64), 3)) if k.item is int else ["a=/", "b.2=/"]
        else:
            v = rng.choice(["name-x", "0.0.0.0", "a b --c", "--x"])
        k.set(cfg, v)
    if cfg.lora.lora_modules:
        cfg.lora.enable_lora = True
    cfg.scheduler.max_num_batched_tokens = None  # cross-field rules are tested below
    cfg.scheduler.max_num_active_seqs = None
    cfg.parallel.distributed_executor_backend = None
    return knobs.validate(cfg)


@pytest.mark.parametrize("seed", range(25))
def test_yaml_round_trip(seed: int) -> None:
    cfg = _random_config(random.Random(seed))
    assert knobs.from_yaml(knobs.to_yaml(cfg)) == cfg


@pytest.mark.parametrize("seed", range(25))
def test_args_round_trip(seed: int) -> None:
    """config -> vllm serve args -> our CLI parser (vLLM's flag names) -> the same config."""
    cfg = _random_config(random.Random(seed))
    args = knobs.vllm_args(cfg)
    # Our CLI takes the compilation JSON as its dotted vLLM options.
    flat: list[str] = []
    it = iter(args)
    for a in it:
        if a.startswith("--compilation-config="):
            for key, v in json.loads(a.partition("=")[2]).items():
                flat += [
                    f"--compilation-config.{key}",
                    *([str(x) for x in v] if isinstance(v, list) else [str(v)]),
                ]
        else:
            flat.append(a)
    p = argparse.ArgumentParser()
    knobs.add_cli_options(p)
    ns = p.parse_args(flat)
    base = knobs.from_dict({})
    back = knobs.apply_cli_options(base, ns)
    back.model.model = cfg.model.model
    assert back == cfg


def test_args_only_differ_from_vllm_defaults() -> None:
    cfg = LaunchConfig()
    cfg.model.model = "/m"
    assert knobs.vllm_args(cfg) == ["--host=127.0.0.1"]
    cfg.compilation.enforce_eager = True
    cfg.cache.enable_prefix_caching = False
    cfg.cache.kv_cache_memory_bytes = 128 * 2**20
    cfg.compilation.cudagraph_mode = "PIECEWISE"
    args = knobs.vllm_args(cfg)
    assert "--enforce-eager" in args and "--no-enable-prefix-caching" in args
    assert f"--kv-cache-memory-bytes={128 * 2**20}" in args
    (comp,) = [a for a in args if a.startswith("--compilation-config=")]
    assert json.loads(comp.partition("=")[2]) == {"cudagraph_mode": "PIECEWISE"}
    assert knobs.serve_command(cfg)[:3] == ["vllm", "serve", "/m"]


def test_unsupported_flag_is_refused() -> None:
    cfg = LaunchConfig()
    cfg.model.model = "/m"
    cfg.scheduler.max_num_seqs = 8
    with pytest.raises(ConfigError, match="--max-num-seqs"):
        knobs.vllm_args(cfg, supported={"--host", "--port"})


def test_yaml_is_what_vllm_serve_config_reads() -> None:
    """vLLM's config-file loader turns keys into --key value; ours are its flag names."""
    cfg = LaunchConfig()
    cfg.model.model = "/m"
    cfg.scheduler.max_num_seqs = 32
    cfg.compilation.enforce_eager = True
    data = yaml.safe_load(knobs.to_yaml(cfg))
    assert data == {"model": "/m", "max-num-seqs": 32, "enforce-eager": True, "host": "127.0.0.1"}


@pytest.mark.parametrize(
    "text, message",
    [
        ("gpu-memory-utilization: 1.5", "above the maximum"),
        ("gpu-memory-utilization: 0", "greater than 0"),
        ("max-num-seqs: -1", "below the minimum"),
        ("block-size: 17", "not one of"),
        ("dtype: int3", "not one of"),
        ("enforce-eager: maybe", "not a valid bool"),
        ("no-such-knob: 1", "unknown setting 'no-such-knob'"),
        ("[1, 2", "not valid YAML"),
        ("- a\n- b", "expected a mapping"),
    ],
)
def test_bad_profile_values(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        knobs.from_yaml(text)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"max_num_seqs": 64, "max_num_batched_tokens": 32}, "smaller than scheduler.max_num_seqs"),
        (
            {"enable_chunked_prefill": False, "max_num_batched_tokens": 512, "max_model_len": 1024},
            "chunked prefill off",
        ),
        ({"lora_modules": ["a=/x"]}, "enable_lora is off"),
    ],
)
def test_contradictory_knobs(change: dict, message: str) -> None:
    cfg = LaunchConfig()
    cfg.model.model = "/m"
    for name, v in change.items():
        knobs.knob_by_name(name).set(cfg, v)
    with pytest.raises(ConfigError, match=message):
        knobs.validate(cfg)


def test_profiles_save_load_delete(tmp_path) -> None:
    cfg = LaunchConfig()
    cfg.model.model = "/models/demo"
    cfg.scheduler.max_num_seqs = 16
    path = profiles.save_profile("small batch", cfg)
    assert path.parent == profiles.profiles_dir() and path.is_file()
    assert profiles.list_profiles() == ["small batch"]
    assert profiles.load_profile("small batch") == cfg
    assert not [p for p in path.parent.iterdir() if p.name.endswith(".tmp")]
    profiles.delete_profile("small batch")
    assert profiles.list_profiles() == []
    with pytest.raises(ConfigError, match="does not exist"):
        profiles.delete_profile("small batch")
    with pytest.raises(ConfigError, match="profile name"):
        profiles.profile_path("../escape")


def test_size_suffixes() -> None:
    k = knobs.knob_by_name("kv_cache_memory_bytes")
    assert knobs.parse_text(k, "128M") == 128 * 10**6
    assert knobs.parse_text(k, "128MiB") == 128 * 2**20
    assert knobs.parse_text(k, "auto") is None
