"""The planner against vLLM's own figures (H200 reference; CPU figures come from the real server
in core/runtime/test_server.py) and the advisor's rules."""

from __future__ import annotations

from pathlib import Path

import pytest
from ckpt import LLAMA3_8B, write_checkpoint

from quantdeck.core.launch import LaunchConfig, advise, engine_checks, errors, plan
from quantdeck.core.launch.device import H200, DeviceFacts, cuda_device
from quantdeck.core.models.info import inspect_model, parse_quantization

# ../shared/gpu/README.md: H200, vLLM 0.26.0, random Llama-3-8B, max_model_len 2048, util 0.85.
REFERENCE_BLOCKS = {
    ("bf16", False): 52156,
    ("bf16", True): 52186,
    ("bitsandbytes", False): 56850,
    ("fp8", False): 55462,
}


@pytest.fixture(scope="module")
def llama8b(tmp_path_factory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("m") / "l8b", LLAMA3_8B, shards=4)


def _cfg(path: Path, **kw) -> LaunchConfig:
    cfg = LaunchConfig()
    cfg.model.model = str(path)
    cfg.model.max_model_len = 2048
    cfg.cache.gpu_memory_utilization = 0.85
    for k, v in kw.items():
        for g in ("model", "cache", "scheduler", "compilation", "parallel"):
            if hasattr(getattr(cfg, g), k):
                setattr(getattr(cfg, g), k, v)
    return cfg


def test_h200_reference_tokens(llama8b: Path) -> None:
    p = plan(_cfg(llama8b), inspect_model(llama8b), H200)
    assert abs(p.kv_cache_tokens / 834_496 - 1) <= 0.05
    assert p.block_size == 16 and p.kv_bytes_per_token == 131072
    assert abs(p.weights_bytes / 2**30 - 14.96) < 0.01  # vLLM: "14.96 GiB for weight"
    assert p.fits and p.max_concurrency > 400


@pytest.mark.parametrize("quant, eager", list(REFERENCE_BLOCKS))
def test_h200_reference_blocks(llama8b: Path, quant: str, eager: bool) -> None:
    q = None if quant == "bf16" else quant
    p = plan(_cfg(llama8b, quantization=q, enforce_eager=eager), inspect_model(llama8b), H200)
    assert abs(p.num_blocks / REFERENCE_BLOCKS[(quant, eager)] - 1) <= 0.05


def test_knobs_move_the_plan(llama8b: Path) -> None:
    info = inspect_model(llama8b)
    base = plan(_cfg(llama8b), info, H200)
    more = plan(_cfg(llama8b, gpu_memory_utilization=0.95), info, H200)
    fp8kv = plan(_cfg(llama8b, kv_cache_dtype="fp8"), info, H200)
    tp2 = plan(_cfg(llama8b, tensor_parallel_size=2), info, cuda_device(140.4, count=2))
    explicit = plan(_cfg(llama8b, kv_cache_memory_bytes=8 * 2**30), info, H200)
    assert more.kv_cache_tokens > base.kv_cache_tokens
    assert fp8kv.kv_bytes_per_token * 2 == base.kv_bytes_per_token
    assert fp8kv.kv_cache_tokens > 1.9 * base.kv_cache_tokens
    assert (
        tp2.weights_bytes * 2 == base.weights_bytes
        and tp2.kv_bytes_per_token * 2 == base.kv_bytes_per_token
    )
    assert explicit.kv_cache_bytes == 8 * 2**30 and explicit.kv_source == "explicit"
    assert explicit.kv_cache_tokens == 8 * 2**30 // 131072


def test_does_not_fit(llama8b: Path) -> None:
    info = inspect_model(llama8b)
    small = cuda_device(16, name="RTX 4080", compute_capability=(8, 9))
    p = plan(_cfg(llama8b), info, small)
    assert not p.fits and "no room for the KV cache" in p.reasons[0]
    f = advise(_cfg(llama8b), info, small, p)
    assert errors(f)


def test_kv_smaller_than_one_sequence(llama8b: Path) -> None:
    info = inspect_model(llama8b)
    cfg = _cfg(llama8b, kv_cache_memory_bytes=100 * 131072)
    p = plan(cfg, info, H200)
    assert not p.fits and "fewer than one max_model_len" in p.reasons[0]
    assert any(
        "fewer than one max_model_len" in f.message for f in errors(advise(cfg, info, H200, p))
    )


def test_cpu_explicit_kv(llama8b: Path) -> None:
    info = inspect_model(llama8b)
    cpu = DeviceFacts(kind="cpu", name="cpu", memory_total_bytes=512 * 2**30)
    p = plan(_cfg(llama8b, kv_cache_memory_bytes=2**30), info, cpu)
    assert p.block_size == 128 and p.num_blocks == 2**30 // (128 * 131072)
    auto = plan(_cfg(llama8b), info, cpu)
    assert auto.kv_source == "quantdeck-default" and auto.kv_cache_bytes == 2**30
    assert auto.warnings


# -- advisor ---------------------------------------------------------------------------------


def _with_quant(info, qc):
    import dataclasses

    return dataclasses.replace(info, quantization=parse_quantization(qc))


A100 = cuda_device(80, name="A100", compute_capability=(8, 0))
T4 = cuda_device(16, name="T4", compute_capability=(7, 5))
AVX2_CPU = DeviceFacts(
    kind="cpu", name="cpu", memory_total_bytes=64 * 2**30, cpu_flags=frozenset({"avx2"})
)


def _messages(cfg, info, dev, level="error"):
    return [f.message for f in advise(cfg, info, dev) if f.level == level]


def test_advisor_rules(llama8b: Path) -> None:
    info = inspect_model(llama8b)
    cfg = _cfg(llama8b)
    assert not _messages(cfg, info, H200)
    fp8 = _with_quant(info, {"quant_method": "fp8"})
    assert any("compute capability >= 8.0" in m for m in _messages(cfg, fp8, T4))
    assert any("weight-only through Marlin" in m for m in _messages(cfg, fp8, A100, "warning"))
    assert any("per-tensor FP8 has no CPU kernel" in m for m in _messages(cfg, fp8, AVX2_CPU))
    gptq = _with_quant(info, {"quant_method": "gptq", "bits": 4, "group_size": 128})
    assert any("Marlin kernels need" in m for m in _messages(cfg, gptq, T4, "warning"))
    assert any("no kernel for this CPU" in m for m in _messages(cfg, gptq, AVX2_CPU))
    bnb = _with_quant(info, {"quant_method": "bitsandbytes", "load_in_4bit": True})
    tp2 = _cfg(llama8b, tensor_parallel_size=2)
    two = cuda_device(140, count=2)
    assert any("pipeline_parallel_size 2" in m for m in _messages(tp2, bnb, two))
    bnb8 = _with_quant(info, {"quant_method": "bitsandbytes", "load_in_8bit": True})
    assert any("eager mode only" in m for m in _messages(cfg, bnb8, H200, "warning"))
    eager = _cfg(llama8b, enforce_eager=True)
    assert any("costs 4x" in m for m in _messages(eager, info, H200, "warning"))
    assert any("costs 8x" in m for m in _messages(eager, bnb, H200, "warning"))
    long = _cfg(llama8b, max_model_len=16384)
    assert any("exceeds the model's 8192 positions" in m for m in _messages(long, info, H200))
    tp3 = _cfg(llama8b, tensor_parallel_size=3)
    assert any("does not divide" in m for m in _messages(tp3, info, cuda_device(80, count=4)))
    wrong = _cfg(llama8b, quantization="awq")
    assert any("does not match" in m for m in _messages(wrong, gptq, H200))


# The H200 runs of benchmarks/planner_families.py (docs/gpu-validation.md, eleventh lease):
# vLLM 0.26.0, --load-format dummy, max_model_len 32768, util 0.85, eager; vLLM's KV cache
# tokens, blocks (cache_config_info) and max concurrency.
H200_FAMILIES = {
    "gemma3-8b": (544_421, 142_585, 16.61),
    "gpt-oss-8b": (2_857_643, 268_689, 87.21),
    "granite-h-8b": (5_502_748, 12_091, 167.93),
}


@pytest.mark.parametrize("family", list(H200_FAMILIES))
def test_h200_reference_families(family: str, tmp_path: Path) -> None:
    from ckpt_scaled import SCALED

    config, tensors = SCALED[family]
    path = write_checkpoint(tmp_path / family, config, tensors=tensors(config), shards=4)
    cfg = _cfg(path, max_model_len=32768, enforce_eager=True)
    p = plan(cfg, inspect_model(path), H200, vllm_version="0.26.0")
    tokens, blocks, concurrency = H200_FAMILIES[family]
    assert abs(p.num_blocks / blocks - 1) <= 0.02, p.num_blocks
    assert abs(p.kv_cache_tokens / tokens - 1) <= 0.02, p.kv_cache_tokens
    assert abs(p.max_concurrency / concurrency - 1) <= 0.02, p.max_concurrency


def test_hybrid_prefix_caching_follows_the_vllm_version(tmp_path: Path) -> None:
    """vLLM turned prefix caching on by default for hybrid models in 0.28: each Mamba group
    then keeps 3 state blocks per sequence (Mamba-2's "align" mode), 1 before. Turned off,
    1 in any version."""
    from ckpt_scaled import SCALED

    config, tensors = SCALED["granite-h-8b"]
    path = write_checkpoint(tmp_path / "g", config, tensors=tensors(config), shards=4)
    info = inspect_model(path)

    def mamba_blocks(version: str | None, **kw: object) -> set[int]:
        p = plan(_cfg(path, max_model_len=32768, **kw), info, H200, vllm_version=version)
        return {g.blocks_per_seq for g in p.groups if g.kind == "mamba"}

    assert mamba_blocks("0.26.0") == mamba_blocks("0.27.1") == {1}
    assert mamba_blocks("0.28.0") == mamba_blocks("0.32.0+cpu") == mamba_blocks(None) == {3}
    assert mamba_blocks("0.32.0", enable_prefix_caching=False) == {1}


def test_engine_checks_set_the_plan_beside_the_engines_figures() -> None:
    planned = {"kv_cache_tokens": 4096, "max_concurrency": 2.0, "num_blocks": 256}
    facts = {"kv_cache_tokens": 4000, "max_concurrency": 1.95, "kv_device": "cpu"}
    kv, conc = engine_checks(planned, facts)
    assert (kv.what, kv.planned, kv.engine) == ("KV cache", 4096, 4000)
    assert kv.error_pct == pytest.approx(2.4)
    assert kv.describe() == "KV cache: engine 4,000 tokens, plan 4,096 tokens (+2.4 %)"
    assert conc.describe() == "max concurrency: engine 1.95×, plan 2.00× (+2.6 %)"
    # before the engine has measured, or a plan without figures: nothing to set beside
    assert engine_checks(planned, {"kv_device": "cpu"}) == []
    assert engine_checks({}, facts) == []
