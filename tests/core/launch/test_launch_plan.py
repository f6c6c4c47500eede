"""The launch plan (issue 44): one place makes the server's argv and environment; secrets by
name only; what the start chooses is a placeholder until it starts; the CPU's default KV size
is one rule. The plan against the real server: tests/gui/test_gui_launch_plan_server.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantdeck.core.errors import ConfigError
from quantdeck.core.launch import (
    CPU_DEFAULT_KV_BYTES,
    LaunchConfig,
    cpu_default_kv,
    cpu_device,
    iter_knobs,
    launch_plan,
)
from quantdeck.core.launch.command import (
    KV_EVENTS_FLAG,
    PORT_AT_START,
    PROFILER_FLAG,
    RUN_DIR_AT_START,
    TMP_AT_START,
    kv_events_config,
)
from quantdeck.core.launch.device import H200
from quantdeck.core.runtime.engine import Capabilities

KEY = "s3cret-KEY-42"
ENGINE = Capabilities(
    "0.32.0",
    "2.9",
    "cpu",
    "cli",
    options={k.flag: {} for k in iter_knobs()}
    | {"--compilation-config": {}, KV_EVENTS_FLAG: {}, PROFILER_FLAG: {}},
)


def _cfg(**server: object) -> LaunchConfig:
    cfg = LaunchConfig()
    cfg.model.model = "/m"
    for name, value in server.items():
        setattr(cfg.server, name, value)
    return cfg


def test_a_secret_is_named_never_valued(monkeypatch: pytest.MonkeyPatch) -> None:
    plan = launch_plan(_cfg(api_key=KEY), ENGINE, cpu_device(), python="/py")
    assert plan.secret_env == ("VLLM_API_KEY",) and "VLLM_API_KEY" not in plan.env
    line = plan.shell_line()
    assert "VLLM_API_KEY=***" in line.split()
    assert KEY not in line and KEY not in repr(plan) and not any(KEY in w for w in plan.argv)
    started = plan.started(Path("/run"), Path("/run/tmp"))
    assert started.spawn_env()["VLLM_API_KEY"] == KEY  # for the spawn alone
    # unset: passed empty (no secret), so that the user's own VLLM_API_KEY is not the server's
    bare = launch_plan(_cfg(), ENGINE, cpu_device(), python="/py")
    assert bare.secret_env == () and bare.env["VLLM_API_KEY"] == ""


def test_what_the_start_chooses_is_a_placeholder_until_it_starts() -> None:
    cfg = _cfg(profiler=True)
    cfg.cache.kv_events = True
    plan = launch_plan(cfg, ENGINE, cpu_device(), python="/py")
    # another interpreter than ours runs the launcher by its file, the model first
    assert plan.argv[0] == "/py" and plan.argv[3].endswith("workers/engine.py")
    assert plan.argv[4] == "/m"
    assert plan.at_start == (KV_EVENTS_FLAG, PROFILER_FLAG, "TMPDIR")
    kv, prof = plan.argv[-2:]
    assert kv.startswith(KV_EVENTS_FLAG + "=") and kv.count(PORT_AT_START) == 2
    assert prof.startswith(PROFILER_FLAG + "=") and RUN_DIR_AT_START in prof
    assert plan.environment["TMPDIR"] == TMP_AT_START
    with pytest.raises(ValueError):
        plan.spawn_env()  # nothing spawns before the start chose its values
    chosen = kv_events_config(5555, 5556)
    started = plan.started(Path("/runs/r1"), Path("/t/q"), chosen)
    assert started.argv[: len(plan.command)] == plan.command  # the rest is the same
    assert json.loads(started.argv[-2].split("=", 1)[1]) == chosen
    assert json.loads(started.argv[-1].split("=", 1)[1])["torch_profiler_dir"] == (
        "/runs/r1/profiles"
    )
    assert started.profiler_dir == Path("/runs/r1/profiles")
    assert started.spawn_env()["TMPDIR"] == "/t/q"


def test_the_engine_decides_the_flags_it_gets() -> None:
    lean = Capabilities("0.32.0", "2.9", "cpu", "cli", options={k.flag: {} for k in iter_knobs()})
    cfg = _cfg()
    cfg.cache.kv_events = True
    with pytest.raises(ConfigError, match=r"cache\.kv_events: .* has no --kv-events-config"):
        launch_plan(cfg, lean, cpu_device(), python="/py")
    quiet = "--disable-access-log-for-endpoints"
    assert not any(w.startswith(quiet) for w in launch_plan(_cfg(), lean, H200, python="/p").argv)
    loud = Capabilities("0.32.0", "2.9", "cpu", "cli", options={**ENGINE.options, quiet: {}})
    assert any(w.startswith(quiet) for w in launch_plan(_cfg(), loud, H200, python="/p").argv)


def test_the_cpus_default_kv_size_is_one_rule(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    word = f"--kv-cache-memory-bytes={CPU_DEFAULT_KV_BYTES}"
    assert word in launch_plan(_cfg(), ENGINE, cpu_device(), python="/py").argv
    assert cpu_default_kv(_cfg(), cpu_device()) == CPU_DEFAULT_KV_BYTES
    assert cpu_default_kv(_cfg(), H200) is None  # a GPU: vLLM's own rule
    assert word not in launch_plan(_cfg(), ENGINE, H200, python="/py").argv
    given = _cfg()
    given.cache.kv_cache_memory_bytes = 64 * 2**20
    assert cpu_default_kv(given, cpu_device()) is None
    monkeypatch.setenv("VLLM_CPU_KVCACHE_SPACE", "2")  # vLLM's own variable: it decides
    assert cpu_default_kv(_cfg(), cpu_device()) is None
    assert word not in launch_plan(_cfg(), ENGINE, cpu_device(), python="/py").argv


def test_a_placement_wins_over_the_plans_own_environment() -> None:
    extra = {"CUDA_VISIBLE_DEVICES": "1", "HF_HUB_OFFLINE": "0"}
    plan = launch_plan(_cfg(), ENGINE, H200, python="/py", extra_env=extra)
    assert plan.env["CUDA_VISIBLE_DEVICES"] == "1" and plan.env["HF_HUB_OFFLINE"] == "0"
