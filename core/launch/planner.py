"""The KV / memory planner: how much KV cache a launch will get, before launching it.

GPU, as vLLM (V1) accounts it per device::

    kv_cache = total x gpu_memory_utilization - weights - peak activation
               - CUDA-graph memory - non-torch memory          (or kv_cache_memory_bytes)
    num_blocks = kv_cache // (block_size x kv_bytes_per_token)

CPU: the explicit KV size (``kv_cache_memory_bytes`` or ``VLLM_CPU_KVCACHE_SPACE`` GiB), else
the 1 GiB that Quantdeck's launcher passes (vLLM's own rule, RAM x utilization minus its resident
memory, often fails its memory check).

The KV cache itself follows vLLM's own specs per layer (``vllm/v1/kv_cache_interface.py``) and
its grouping (``vllm/v1/core/kv_cache_utils.py``): full, sliding-window, chunked-local, MLA and
Mamba / linear-attention layers; hybrids split into groups of equal page size, one page per layer
in a group; ``num_blocks`` = KV memory // the largest group's bytes per block; concurrency = blocks
/ the blocks one max_model_len request holds summed over groups (a sliding window holds only
``window - 1 + in-flight tokens``); it fits when that request fits beside the null block.
See docs/planner.md.

Weights and KV bytes per token are exact from the checkpoint's headers and config. Activation,
CUDA-graph and non-torch memory are estimates calibrated on vLLM 0.26 on an H200 (random
Llama-3-8B: 1.78, 0.59 and 0.22 GiB); they are small beside the KV cache on a large GPU.
"""

from __future__ import annotations

import functools
import importlib.metadata
import math
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from quantdeck.core.errors import PlanError
from quantdeck.core.launch.config import LaunchConfig
from quantdeck.core.launch.device import DeviceFacts, GiB
from quantdeck.core.models import ModelInfo
from quantdeck.core.models.info import CHUNKED, FULL, LINEAR, MAMBA, NO_CACHE, SLIDING

# Calibration constants (see module docstring).
SAMPLER_COPIES = 3.64  # fp32 logits copies alive at the sampler's peak
NON_TORCH_BYTES = int(0.22 * GiB)  # CUDA context beyond torch, cuBLAS workspaces
NCCL_BYTES = int(0.5 * GiB)  # extra per GPU when tensor/pipeline parallel
CUDAGRAPH_BYTES_PER_SIZE_LAYER = int(0.37 * 2**20)
CPU_ENGINE_RSS = int(1.6 * GiB)  # an idle vllm-cpu engine process besides the weights
CPU_DEFAULT_KV_BYTES = GiB  # the KV size our launcher passes on CPU when none is given
CPU_KV_ENV = "VLLM_CPU_KVCACHE_SPACE"  # vLLM's own KV size on a CPU, in GiB


def cpu_default_kv(cfg: LaunchConfig, device: DeviceFacts) -> int | None:
    """The KV size Quantdeck gives a launch on a CPU that names none (no
    ``kv_cache_memory_bytes``, no ``VLLM_CPU_KVCACHE_SPACE``): :data:`CPU_DEFAULT_KV_BYTES`.
    vLLM's own rule there (RAM x utilization less its own memory) fails its memory check on a
    busy machine. None on a GPU or where a size is given. The one rule the planner, the launch
    plan (:func:`~quantdeck.core.launch.command.launch_plan`) and the fleet's checks follow."""
    if device.is_cuda or cfg.cache.kv_cache_memory_bytes is not None:
        return None
    if os.environ.get(CPU_KV_ENV, "").strip():
        return None
    return CPU_DEFAULT_KV_BYTES


def with_cpu_default_kv(cfg: LaunchConfig, device: DeviceFacts) -> LaunchConfig:
    """A copy of ``cfg`` as it launches on ``device``: :func:`cpu_default_kv` set as its KV
    size where that applies."""
    out = cfg.copy()
    default = cpu_default_kv(cfg, device)
    if default is not None:
        out.cache.kv_cache_memory_bytes = default
    return out


@dataclass(frozen=True)
class KvGroup:
    """One of vLLM's KV cache groups: layers sharing a block table, one page each per block."""

    kind: str  # full_attention, sliding_attention, chunked_attention, mla or mamba
    layers: int  # layers in the group (per pipeline stage)
    block_size: int  # tokens per block
    page_bytes: int  # one layer's page (padded to the common page)
    window: int | None  # the sliding window or attention chunk, in tokens
    blocks_per_seq: int  # blocks one max_model_len sequence holds in this group

    @property
    def block_bytes(self) -> int:
        return self.layers * self.page_bytes


@dataclass(frozen=True)
class _Spec:
    """One layer's KV cache spec, reduced to what vLLM's grouping compares."""

    kind: str
    block_size: int
    page_bytes: int
    window: int | None = None
    state_blocks: int = 0  # Mamba: blocks a sequence holds whatever its length
    in_flight: int = 0  # sliding / chunked: tokens scheduled but not yet freed


@dataclass(frozen=True)
class KvPlan:
    """The planner's answer; bytes are per device (per GPU under tensor/pipeline parallel)."""

    device: str
    budget_bytes: int  # what vLLM may use: total x utilization, or the explicit KV size
    weights_bytes: int
    activation_bytes: int
    cudagraph_bytes: int
    non_torch_bytes: int
    kv_bytes_per_token: int
    kv_cache_bytes: int
    block_size: int
    num_blocks: int
    kv_cache_tokens: int
    max_model_len: int
    max_concurrency: float  # full-length sequences the KV cache holds at once
    max_num_seqs: int
    max_num_batched_tokens: int
    total_bytes: int  # device memory (per GPU), host RAM on CPU
    fits: bool
    kv_source: str  # "explicit", "utilization" or "quantdeck-default"
    warnings: list[str] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)  # why it does not fit
    groups: list[KvGroup] = field(default_factory=list)  # vLLM's KV cache groups
    bytes_per_block: int = 0  # one block over all layers: what num_blocks divides the cache by
    # KV offloading (cache.kv_offloading_size): the CPU memory per device that holds evicted
    # blocks for prefix-cache reuse, and the tokens it holds (not more room for running ones)
    offload_bytes: int = 0
    offload_tokens: int = 0

    @property
    def free_bytes(self) -> int:
        """Device memory left outside vLLM's share."""
        used = (
            self.weights_bytes
            + self.activation_bytes
            + self.cudagraph_bytes
            + self.non_torch_bytes
            + self.kv_cache_bytes
        )
        return max(0, self.total_bytes - used)

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["free_bytes"] = self.free_bytes
        return d


def kv_dtype_bytes(cfg: LaunchConfig, info: ModelInfo) -> int:
    kvd = cfg.cache.kv_cache_dtype
    if kvd.startswith("fp8"):
        return 1
    if kvd == "auto" and cfg.model.dtype in ("float32", "float"):
        return 4
    return 2


def default_batch_limits(device: DeviceFacts, world_size: int = 1) -> tuple[int, int]:
    """vLLM's defaults for the OpenAI server: (max_num_seqs, max_num_batched_tokens)."""
    if not device.is_cuda:
        return 128 * world_size, 2048 * world_size
    if device.memory_total_bytes >= 160 * GiB:
        return 1024, 16384
    if device.memory_total_bytes >= 70 * GiB and "a100" not in device.name.lower():
        return 1024, 8192
    return 256, 2048


def loaded_weights_bytes(cfg: LaunchConfig, info: ModelInfo) -> int:
    """Bytes of weights in device memory, counting in-flight quantization of a bf16 checkpoint."""
    q = cfg.model.quantization
    if info.quantization is None and q in ("fp8", "bitsandbytes"):
        lin = info.linear_weight_bytes
        per_param = 2 if (info.torch_dtype or "bfloat16") in ("bfloat16", "float16") else 4
        params = lin / per_param
        if q == "fp8":
            packed = params * 1.0
        else:  # nf4: half a byte per value plus one fp32 absmax per 64 values
            packed = params * 0.5 + params / 64 * 4
        return int(info.weights_bytes - lin + packed)
    if (
        info.torch_dtype == "float32"
        and cfg.model.dtype in ("auto", "bfloat16", "float16", "half")
        and info.quantization is None
    ):
        return info.weights_bytes // 2
    return info.weights_bytes


def cudagraph_capture_sizes(cfg: LaunchConfig, max_num_seqs: int) -> list[int]:
    """vLLM's default capture list: 1, 2, 4, then steps of 8 to 256, then 16, up to the max."""
    if cfg.compilation.cudagraph_capture_sizes:
        return sorted(set(cfg.compilation.cudagraph_capture_sizes))
    top = min(max_num_seqs * 2, 512)
    sizes = [s for s in (1, 2, 4) if s <= top]
    sizes += list(range(8, min(top, 256) + 1, 8))
    sizes += list(range(272, top + 1, 16))
    return sizes


def plan(
    cfg: LaunchConfig, info: ModelInfo, device: DeviceFacts, *, vllm_version: str | None = None
) -> KvPlan:
    """Predict the memory split and KV cache of launching ``info`` with ``cfg`` on ``device``
    with vLLM ``vllm_version`` (the engine's; None: the newest behaviour). The version decides
    the defaults that changed between releases: prefix caching for hybrid models."""
    bad_shape = info.shape_error()
    if bad_shape:
        raise PlanError(bad_shape)
    tp = cfg.parallel.tensor_parallel_size
    pp = cfg.parallel.pipeline_parallel_size
    if device.is_cuda and tp * pp > device.count:
        raise PlanError(
            f"parallel: tensor x pipeline = {tp * pp} GPUs, but the device has {device.count}"
        )
    max_len = cfg.model.max_model_len or info.max_position_embeddings or 2048
    seqs_d, tokens_d = default_batch_limits(device, 1 if device.is_cuda else tp * pp)
    max_num_seqs = cfg.scheduler.max_num_seqs or seqs_d
    max_tokens = cfg.scheduler.max_num_batched_tokens or tokens_d
    chunked = cfg.scheduler.enable_chunked_prefill is not False
    if not chunked:
        max_tokens = max(max_tokens, max_len)

    kv_heads = max(1, info.num_kv_heads // tp) if info.num_kv_heads >= tp else 1
    layers = math.ceil(info.num_layers / pp)
    bpt_dtype = kv_dtype_bytes(cfg, info)
    if info.kv_lora_rank:
        token_page = (info.kv_lora_rank + (info.qk_rope_head_dim or 0)) * bpt_dtype
    else:
        token_page = 2 * kv_heads * info.head_dim * bpt_dtype
    kinds = info.kinds()
    attn_layers = sum(k in (FULL, SLIDING, CHUNKED) for k in kinds)
    kv_per_token = math.ceil(attn_layers / pp) * token_page
    block: int = cfg.cache.block_size or (16 if device.is_cuda else 128)
    if info.kv_lora_rank and not device.is_cuda and "amx_tile" not in device.cpu_flags:
        block = 16  # vLLM's reference CPU MLA kernel runs 16-token blocks only
    weights = loaded_weights_bytes(cfg, info) // (tp * pp)
    warnings: list[str] = []
    reasons: list[str] = []

    if device.is_cuda:
        total = device.memory_total_bytes
        budget = int(total * cfg.cache.gpu_memory_utilization)
        fwd = (
            max_tokens
            * (2 * (info.intermediate_size or 4 * info.hidden_size) + 4 * info.hidden_size)
            * 2
            // tp
        )
        sampler = int(max_num_seqs * info.vocab_size * 4 * SAMPLER_COPIES)
        activation = max(fwd, sampler)
        cudagraph = 0
        if not cfg.compilation.enforce_eager and cfg.compilation.cudagraph_mode != "NONE":
            cudagraph = (
                len(cudagraph_capture_sizes(cfg, max_num_seqs))
                * layers
                * CUDAGRAPH_BYTES_PER_SIZE_LAYER
            )
        non_torch = NON_TORCH_BYTES + (NCCL_BYTES if tp * pp > 1 else 0)
        if cfg.cache.kv_cache_memory_bytes is not None:
            kv_bytes, source = cfg.cache.kv_cache_memory_bytes, "explicit"
            need = weights + activation + cudagraph + non_torch + kv_bytes
            if need > total:
                reasons.append(
                    f"weights, activations and the explicit KV cache need "
                    f"{need / GiB:.2f} GiB of the GPU's {total / GiB:.2f} GiB"
                )
        else:
            kv_bytes = budget - weights - activation - cudagraph - non_torch
            source = "utilization"
            if kv_bytes <= 0:
                reasons.append(
                    f"weights ({weights / GiB:.2f} GiB) and activations "
                    f"({activation / GiB:.2f} GiB) leave no room for the KV cache in "
                    f"{cfg.cache.gpu_memory_utilization:.2f} x {total / GiB:.1f} GiB"
                )
                kv_bytes = 0
    else:
        total = device.memory_total_bytes
        activation = cudagraph = non_torch = 0
        default = cpu_default_kv(cfg, device)
        if default is not None:
            kv_bytes, source = default, "quantdeck-default"
            warnings.append(
                f"no explicit KV size on CPU: Quantdeck gives the cache "
                f"{default / GiB:.0f} GiB (set --kv-cache-memory-bytes to choose)"
            )
        elif cfg.cache.kv_cache_memory_bytes is not None:
            kv_bytes, source = cfg.cache.kv_cache_memory_bytes, "explicit"
        else:
            kv_bytes, source = int(os.environ[CPU_KV_ENV]) * GiB, "explicit"
        budget = kv_bytes
        if weights + kv_bytes + CPU_ENGINE_RSS > total:
            reasons.append(
                f"weights ({weights / GiB:.2f} GiB) + KV cache "
                f"({kv_bytes / GiB:.2f} GiB) + engine exceed the host's "
                f"{total / GiB:.1f} GiB RAM"
            )

    specs = _layer_specs(cfg, info, device, block, token_page, max_tokens, vllm_version)
    groups = _groups(specs, max_len, pp)
    bytes_per_block = max((g.block_bytes for g in groups), default=0)
    num_blocks = max(0, kv_bytes // bytes_per_block) if bytes_per_block else 0
    need = sum(g.blocks_per_seq for g in groups)
    concurrency = num_blocks / need if need else 0.0
    tokens = int(concurrency * max_len)
    if groups and attn_layers:  # vLLM reports the smallest attention group's block
        block = min(g.block_size for g in groups if g.kind != "mamba")
    # vLLM's check_enough_kv_cache_memory: one max_model_len request beside the null block.
    if not reasons and groups and bytes_per_block * (need + 1) > kv_bytes:
        reasons.append(
            f"the KV cache holds {tokens} tokens, fewer than one max_model_len "
            f"sequence ({max_len}) needs: {need} blocks of {bytes_per_block / 2**20:.2f} MiB "
            f"and vLLM's null block, {num_blocks} made; lower max_model_len or give the "
            "cache more memory"
        )
    offload = int((cfg.cache.kv_offloading_size or 0.0) * GiB) // tp
    offload_tokens = offload // bytes_per_block * block if bytes_per_block else 0
    return KvPlan(
        device=device.label,
        budget_bytes=int(budget),
        weights_bytes=int(weights),
        activation_bytes=int(activation),
        cudagraph_bytes=int(cudagraph),
        non_torch_bytes=int(non_torch),
        kv_bytes_per_token=int(kv_per_token),
        kv_cache_bytes=int(kv_bytes),
        block_size=int(block),
        num_blocks=int(num_blocks),
        kv_cache_tokens=int(tokens),
        max_model_len=int(max_len),
        max_concurrency=round(concurrency, 2),
        max_num_seqs=int(max_num_seqs),
        max_num_batched_tokens=int(max_tokens),
        total_bytes=int(total),
        fits=not reasons,
        kv_source=source,
        warnings=warnings,
        reasons=reasons,
        groups=groups,
        bytes_per_block=int(bytes_per_block),
        offload_bytes=offload,
        offload_tokens=int(offload_tokens),
    )


def _dtype_bytes(name: str | None, default: int) -> int:
    return {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}.get(
        name or "", default
    )


# vLLM turns prefix caching on by default for hybrid (Mamba, linear-attention) models from
# 0.28 (vllm-project/vllm#50991); before, they ran without it unless asked.
HYBRID_PREFIX_CACHING_SINCE = (0, 28)


def version_tuple(version: str) -> tuple[int, ...]:
    """``0.26.0`` -> (0, 26, 0); a suffix (``0.28.1rc2.dev3+cpu``) ends the numbers."""
    out = []
    for part in version.split("."):
        digits = part[: len(part) - len(part.lstrip("0123456789"))]
        if not digits:
            break
        out.append(int(digits))
        if digits != part:
            break
    return tuple(out)


@functools.cache
def local_vllm_version() -> str | None:
    """The version of the vLLM installed beside Quantdeck (its metadata, not an import of
    it), or None: what plans made here assume when no engine is named."""
    for dist in ("vllm", "vllm-cpu"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            pass
    return None


def prefix_caching_on(cfg: LaunchConfig, hybrid: bool, vllm_version: str | None) -> bool:
    """Whether the engine caches prefixes: as asked, else vLLM's default for the model."""
    if cfg.cache.enable_prefix_caching is not None:
        return bool(cfg.cache.enable_prefix_caching)
    old = vllm_version is not None and version_tuple(vllm_version) < HYBRID_PREFIX_CACHING_SINCE
    return not (hybrid and old)


def max_in_flight_tokens(cfg: LaunchConfig, device: DeviceFacts, max_tokens: int) -> int:
    """vLLM's ``max_in_flight_tokens``: a batch per concurrent step (async scheduling keeps two
    on a GPU; vllm-cpu schedules synchronously; pipeline stages each hold one)."""
    pp = cfg.parallel.pipeline_parallel_size
    batches = (2 if pp == 1 else pp) if device.is_cuda else pp
    return batches * max_tokens


def _layer_specs(
    cfg: LaunchConfig,
    info: ModelInfo,
    device: DeviceFacts,
    block: int,
    token_page: int,
    max_tokens: int,
    vllm_version: str | None = None,
) -> list[_Spec]:
    """Every layer's spec as vLLM's attention and Mamba layers build it (no-cache layers left
    out), after its platform aligns a hybrid's attention block to the Mamba page."""
    kinds = [k for k in info.kinds() if k != NO_CACHE]
    state_page = 0
    state_blocks = 1
    if info.state is not None and any(k in (MAMBA, LINEAR) for k in kinds):
        tp = cfg.parallel.tensor_parallel_size
        conv = 4 if cfg.model.dtype in ("float32", "float") else 2
        ssm = _dtype_bytes(info.state.ssm_dtype, conv)
        if not device.is_cuda and "avx512_bf16" in device.cpu_flags and info.state.kind != "gdn":
            ssm = 4  # vllm-cpu keeps the SSM state in float32 where it has AVX-512 BF16
        state_page = info.state.page_bytes(conv, ssm, tp)
        if prefix_caching_on(cfg, True, vllm_version):
            # "align" mode: the running state and the last block boundary's; Mamba-2 keeps
            # one more for its prefill checkpoint.
            state_blocks = 2 + (info.state.kind == "mamba2")
        if any(k in (FULL, SLIDING, CHUNKED) for k in kinds):
            # Platform._align_hybrid_block_size: the attention page must hold a Mamba page.
            kernel = 16 if device.is_cuda else 32
            align = max(kernel, block)
            need = align * -(-state_page // (align * token_page))
            block = max(block, kernel * -(-need // kernel))
            state_page = max(state_page, block * token_page)
    # VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE=0 turns vLLM's hybrid manager off for
    # chunked attention: local layers then hold every token, as full attention does.
    env = os.environ.get("VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE", "1").strip()
    promote = CHUNKED in kinds and FULL in kinds and env == "0"
    in_flight = max_in_flight_tokens(cfg, device, max_tokens)
    page = block * token_page
    full = "mla" if info.kv_lora_rank else "full_attention"
    specs = []
    for k in kinds:
        if k == SLIDING and not promote:
            window = info.sliding_window
            assert window is not None  # the inspector only names sliding layers with a window
            specs.append(_Spec("sliding_attention", block, page, window, in_flight=in_flight))
        elif k == CHUNKED and not promote:
            chunk = info.attention_chunk_size or 0
            specs.append(_Spec("chunked_attention", block, page, chunk, in_flight=in_flight))
        elif k in (MAMBA, LINEAR):
            specs.append(_Spec("mamba", block, state_page, None, state_blocks))
        else:
            specs.append(_Spec(full, block, page))
    return specs


def _groups(specs: list[_Spec], max_len: int, pp: int) -> list[KvGroup]:
    """vLLM's get_kv_cache_groups for a layer-outer cache layout (what its CPU and CUDA
    attention backends resolve to): one group when every layer's spec is the same, else pages
    unified to the largest, layers bucketed by spec, and buckets cut into groups of the same
    number of layers (the smallest bucket's, or the largest when they are within 1.5x)."""
    if not specs:
        return []
    if len(set(specs)) > 1:
        top = max(s.page_bytes for s in specs)
        unified = []
        for s in specs:
            if s.page_bytes < top and s.kind != "mamba" and top % s.page_bytes == 0:
                # A smaller attention page grows by whole blocks; others are padded.
                s = replace(s, block_size=s.block_size * (top // s.page_bytes))
            unified.append(replace(s, page_bytes=top))
        specs = unified
    buckets: dict[_Spec, int] = {}
    for s in specs:
        buckets[s] = buckets.get(s, 0) + 1
    size = min(buckets.values())
    if max(buckets.values()) < size * 1.5:
        size = max(buckets.values())
    groups = []
    for spec, count in buckets.items():
        n = -(-count // size)
        # Group i takes layers[i::n]; the largest has ceil(count / n) layers.
        for i in range(n):
            in_group = len(range(i, count, n))
            groups.append(
                KvGroup(
                    kind=spec.kind,
                    layers=-(-in_group // pp),
                    block_size=spec.block_size,
                    page_bytes=spec.page_bytes,
                    window=spec.window,
                    blocks_per_seq=_blocks_per_seq(spec, max_len),
                )
            )
    return groups


def _blocks_per_seq(spec: _Spec, max_len: int) -> int:
    """A spec's max_memory_usage_bytes in pages: what one max_model_len sequence holds."""
    b = spec.block_size
    if spec.kind == "mamba":
        return spec.state_blocks
    if spec.kind == "sliding_attention":
        assert spec.window is not None
        return -(-min(spec.window - 1 + spec.in_flight, max_len) // b) + 1
    if spec.kind == "chunked_attention":
        assert spec.window is not None
        return -(-min(spec.window + spec.in_flight, max_len) // b)
    return -(-max_len // b)


def same_groups(groups: list[Any]) -> list[tuple[int, Any]]:
    """Runs of identical groups, as (count, group): a 5:1 hybrid prints two lines, not six."""
    out: list[tuple[int, Any]] = []
    for g in groups:
        if out and out[-1][1] == g:
            out[-1] = (out[-1][0] + 1, g)
        else:
            out.append((1, g))
    return out


@dataclass(frozen=True)
class EngineCheck:
    """One figure of a running launch: what the planner said, what the engine reported."""

    what: str
    planned: float
    engine: float

    @property
    def error_pct(self) -> float:
        """The plan's error against the engine, in percent of the engine's figure."""
        return 100.0 * (self.planned - self.engine) / self.engine if self.engine else 0.0

    def describe(self) -> str:
        unit = "×" if self.what == "max concurrency" else " tokens"
        figure = f"{self.engine:,.2f}" if unit == "×" else f"{self.engine:,.0f}"
        planned = f"{self.planned:,.2f}" if unit == "×" else f"{self.planned:,.0f}"
        return f"{self.what}: engine {figure}{unit}, plan {planned}{unit} ({self.error_pct:+.1f} %)"


def engine_checks(planned: Mapping[str, Any], facts: Mapping[str, Any]) -> list[EngineCheck]:
    """The planner's KV tokens and concurrency for a launch (:meth:`KvPlan.to_json`'s keys)
    beside the engine's own (the facts its log gave: ``kv_cache_tokens``, ``max_concurrency``),
    for the figures both have. The engine's concurrency is at its own ``max_model_len``."""
    out = []
    for what, key in (("KV cache", "kv_cache_tokens"), ("max concurrency", "max_concurrency")):
        p, e = planned.get(key), facts.get(key)
        if isinstance(p, int | float) and isinstance(e, int | float):
            out.append(EngineCheck(what, float(p), float(e)))
    return out
