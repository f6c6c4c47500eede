"""The compatibility advisor: what will fail, and what will cost, before a launch.

Each finding is one line with its reason. Errors block a launch (the CLI refuses, the GUI greys
out Start); warnings are shown next to the knob they are about.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

from quantdeck.core.errors import ConfigError
from quantdeck.core.http import is_loopback
from quantdeck.core.launch.config import LaunchConfig
from quantdeck.core.launch.device import DeviceFacts
from quantdeck.core.launch.engine_args import speculative_config
from quantdeck.core.launch.planner import KvPlan
from quantdeck.core.models import ModelInfo

# Batch-1 decode on an H200, vLLM 0.26, random Llama-3-8B (../shared/gpu/README.md).
EAGER_COST = {"bf16": (200.6, 50.7), "bitsandbytes": (181.9, 22.7)}

# quantization= values that may be given for a checkpoint's own quant_method.
_COMPATIBLE = {
    "gptq": {"gptq", "gptq_marlin"},
    "awq": {"awq", "awq_marlin"},
    "fp8": {"fp8"},
    "compressed-tensors": {"compressed-tensors"},
    "bitsandbytes": {"bitsandbytes"},
}


Report = Callable[[str, str], None]  # (knob, message)


@dataclass(frozen=True)
class Finding:
    level: str  # "error" | "warning"
    knob: str  # the setting it is about ("" for the model/device as a whole)
    message: str

    def __str__(self) -> str:
        return f"{self.level}: {self.message}"

    def to_json(self) -> dict[str, str]:
        return asdict(self)


def _effective_method(cfg: LaunchConfig, info: ModelInfo) -> str | None:
    if info.quantization is not None:
        return info.quantization.method
    return cfg.model.quantization


def advise(
    cfg: LaunchConfig, info: ModelInfo, device: DeviceFacts, kv_plan: KvPlan | None = None
) -> list[Finding]:
    """Errors first, then warnings."""
    bad_shape = info.shape_error()
    if bad_shape:  # nothing below holds for a shape with zero or negative counts
        return [Finding("error", "", bad_shape)]
    out: list[Finding] = []

    def err(knob: str, msg: str) -> None:
        out.append(Finding("error", knob, msg))

    def warn(knob: str, msg: str) -> None:
        out.append(Finding("warning", knob, msg))

    q = info.quantization
    method = _effective_method(cfg, info)
    scheme = q.scheme if q else None
    cc = device.compute_capability
    tp = cfg.parallel.tensor_parallel_size
    pp = cfg.parallel.pipeline_parallel_size

    # The checkpoint's method and the quantization knob must agree.
    if q is not None and cfg.model.quantization is not None:
        ok = _COMPATIBLE.get(q.method, {q.method})
        if cfg.model.quantization not in ok:
            err(
                "quantization",
                f"the checkpoint is {q.method}-quantized; quantization="
                f"{cfg.model.quantization} does not match it (use {' or '.join(sorted(ok))} "
                "or leave it on auto)",
            )

    is_fp8 = method == "fp8" or (scheme or "").startswith(("W8A8-FP8", "W8A16-FP8", "FP8"))
    fp8_tensor = method == "fp8" or (scheme or "").endswith("-tensor")
    if is_fp8:
        if device.is_cuda and cc is not None:
            if cc < (8, 0):
                err(
                    "quantization",
                    f"FP8 needs compute capability >= 8.0 (Marlin weight-only) "
                    f"and >= 8.9 for W8A8; this GPU is {cc[0]}.{cc[1]}",
                )
            elif cc < (8, 9):
                warn(
                    "quantization",
                    f"compute capability {cc[0]}.{cc[1]} has no FP8 tensor "
                    "cores: vLLM runs FP8 weight-only through Marlin (activations in 16-bit)",
                )
        elif not device.is_cuda and fp8_tensor:
            err(
                "quantization",
                "per-tensor FP8 has no CPU kernel; vLLM's CPU backend serves "
                "FP8 with per-channel weight scales only (quantize with --method fp8)",
            )

    if method in ("gptq", "awq") or (method == "compressed-tensors" and scheme == "W4A16"):
        name = method.upper() if method != "compressed-tensors" else "W4A16"
        if device.is_cuda and cc is not None and cc < (8, 0):
            warn(
                "quantization",
                f"{name} Marlin kernels need compute capability >= 8.0; "
                f"this GPU ({cc[0]}.{cc[1]}) falls back to slower kernels",
            )
        elif not device.is_cuda and "avx512f" not in device.cpu_flags:
            err(
                "quantization",
                f"{name} int4 has no kernel for this CPU (AVX2 only; vLLM's "
                "cpu_gemm_wna16 needs AVX-512): check it with transformers, serve it on a GPU",
            )

    if method == "bitsandbytes":
        if q is not None and tp > 1:
            err(
                "tensor_parallel_size",
                "pre-quantized bitsandbytes checkpoints do not run with "
                f"tensor parallel {tp}; use pipeline_parallel_size {tp} instead",
            )
        bits = q.bits if q else 4
        if bits == 8:
            warn(
                "enforce_eager",
                "bitsandbytes 8-bit runs in eager mode only (vLLM turns "
                "CUDA graphs off for it): expect slow decoding",
            )
        if not device.is_cuda:
            warn(
                "quantization",
                "bitsandbytes on vLLM's CPU backend needs vllm-bnb-plugin "
                "(vLLM >= 0.28) and runs slower than bf16 there",
            )

    if cfg.compilation.enforce_eager and device.is_cuda:
        key = "bitsandbytes" if method == "bitsandbytes" else "bf16"
        graphs, eager = EAGER_COST[key]
        warn(
            "enforce_eager",
            f"eager mode costs {graphs / eager:.0f}x decode speed at batch 1 "
            f"for {'bnb 4-bit' if key == 'bitsandbytes' else 'bf16'} on an H200 "
            f"({eager} vs {graphs} tok/s); it starts faster and saves the CUDA-graph memory",
        )
    if cfg.compilation.enforce_eager and (
        cfg.compilation.cudagraph_mode or cfg.compilation.cudagraph_capture_sizes
    ):
        warn("cudagraph_mode", "CUDA-graph settings are ignored in eager mode")
    if not device.is_cuda and (
        cfg.compilation.cudagraph_mode or cfg.compilation.cudagraph_capture_sizes
    ):
        warn("cudagraph_mode", "the CPU backend captures no CUDA graphs")

    mpe = info.max_position_embeddings
    if cfg.model.max_model_len is not None and mpe and cfg.model.max_model_len > mpe:
        err(
            "max_model_len",
            f"max_model_len {cfg.model.max_model_len} exceeds the model's "
            f"{mpe} positions (vLLM refuses unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1)",
        )

    if info.num_attention_heads % tp:
        err(
            "tensor_parallel_size",
            f"tensor parallel {tp} does not divide the model's "
            f"{info.num_attention_heads} attention heads",
        )
    elif info.num_kv_heads % tp and tp % info.num_kv_heads:
        err(
            "tensor_parallel_size",
            f"tensor parallel {tp} and the model's "
            f"{info.num_kv_heads} KV heads do not divide one another",
        )
    if pp > info.num_layers:
        err(
            "pipeline_parallel_size",
            f"pipeline parallel {pp} exceeds the model's {info.num_layers} layers",
        )
    on_cluster, cluster = _ray(cfg, device, err, warn)
    if cluster is not None:  # the GPUs are the Ray cluster's, not this machine's
        if tp * pp > cluster:
            err(
                "tensor_parallel_size",
                f"tensor x pipeline parallel needs {tp * pp} GPUs; the Ray cluster at "
                f"{device.ray.address if device.ray else ''} has {cluster:g}",
            )
        elif tp * pp < cluster:
            warn(
                "tensor_parallel_size",
                f"tensor x pipeline parallel uses {tp * pp} of the Ray cluster's {cluster:g} "
                "GPUs: the others stay idle",
            )
    elif device.is_cuda and not on_cluster and tp * pp > device.count:
        err(
            "tensor_parallel_size",
            f"tensor x pipeline parallel needs {tp * pp} GPUs; {device.count} present",
        )

    if cfg.cache.kv_cache_dtype.startswith("fp8") and not device.is_cuda:
        warn("kv_cache_dtype", "an fp8 KV cache on CPU is emulated: it saves memory, not time")

    _levers(cfg, device, err, warn)
    _exposure(cfg, err, warn)
    if cfg.lora.allow_runtime_lora_updating and not cfg.lora.enable_lora:
        err("allow_runtime_lora_updating", "loading adapters at run time needs LoRA enabled")

    if kv_plan is not None:
        for r in kv_plan.reasons:
            err(
                "kv_cache_memory_bytes"
                if kv_plan.kv_source == "explicit"
                else "gpu_memory_utilization",
                r,
            )
        for w in kv_plan.warnings:
            warn("", w)
    out.sort(key=lambda f: f.level != "error")
    return out


# vllm/v1/executor/ray_utils.py, initialize_ray_cluster, where the platform has no ray_device_key
CPU_RAY_REFUSAL = "current platform cpu does not support ray."


def _ray(
    cfg: LaunchConfig, device: DeviceFacts, err: Report, warn: Report
) -> tuple[bool, float | None]:
    """The Ray rules. Returns whether the launch runs on a Ray cluster named by an address (then
    this machine's GPU count says nothing) and, when the cluster answered, its GPU count."""
    address = cfg.parallel.ray_address
    on_cluster = bool(address) and cfg.parallel.distributed_executor_backend == "ray"
    if cfg.parallel.distributed_executor_backend != "ray":
        if address:
            err(
                "ray_address",
                f"ray_address {address} is set but the executor backend is "
                f"{cfg.parallel.distributed_executor_backend or 'auto'}: set "
                "distributed_executor_backend to ray (or clear ray_address)",
            )
        return on_cluster, None
    if not device.is_cuda:
        err(
            "distributed_executor_backend",
            "vLLM's CPU backend has no Ray executor (vLLM refuses: "
            f"'{CPU_RAY_REFUSAL}'): use mp, or serve on GPUs",
        )
        return on_cluster, None
    facts = device.ray
    if facts is None:
        if on_cluster:
            warn("ray_address", f"the Ray cluster at {address} was not checked here")
        return on_cluster, None
    if not facts.installed:
        err(
            "distributed_executor_backend",
            f"the ray backend needs Ray, which is not installed for {facts.python or 'vLLM'} "
            "(pip install ray, on every node)",
        )
    if facts.error:
        err("ray_address", facts.error)
    if not facts.installed or facts.error:
        return on_cluster, None
    if not facts.reachable:  # no address: vLLM's Ray starts on this machine, with its GPUs
        return on_cluster, None
    return on_cluster, facts.gpus


def _levers(cfg: LaunchConfig, device: DeviceFacts, err: Report, warn: Report) -> None:
    """Sleep mode, speculative decoding, KV offloading: what they cost, where they cannot run."""
    if cfg.model.enable_sleep_mode and not device.is_cuda:
        err(
            "enable_sleep_mode",
            "vLLM refuses sleep mode on CPU ('Sleep mode is not supported on current "
            "platform.'): it runs on CUDA and ROCm GPUs only",
        )
    if cfg.performance.speculative:
        try:
            spec = speculative_config(cfg.performance.speculative)
        except ConfigError:
            spec = {}  # validate() says what is wrong with it
        k = spec.get("num_speculative_tokens", "several")
        if spec.get("method") == "ngram":
            warn(
                "speculative",
                f"n-gram speculative decoding drafts up to {k} tokens a step from text the "
                "request already holds and verifies them in one forward pass: it saves time at "
                "low concurrency where outputs repeat their prompt, and costs compute (rejected "
                "drafts) at high concurrency",
            )
        elif spec:
            warn(
                "speculative",
                "speculative decoding with a draft model: the plan leaves out the draft's "
                "weights and KV cache; it saves time at low concurrency and costs compute "
                "(rejected drafts) at high concurrency",
            )
    if cfg.cache.kv_offloading_size and not device.is_cuda:
        err(
            "kv_offloading_size",
            "vLLM's CPU engine fails at start with KV offloading ('CPU Offloading is currently "
            "only supported on CUDA-alike and XPU GPUs'): on a CPU the KV cache is in host "
            "memory already; give it more with kv_cache_memory_bytes",
        )
    if cfg.cache.kv_offloading_backend is not None and cfg.cache.kv_offloading_size is None:
        warn(
            "kv_offloading_backend",
            "kv_offloading_backend does nothing without kv_offloading_size (vLLM offloads "
            "only when a size is set)",
        )


def keyless_routes(cfg: LaunchConfig) -> str:
    """What answers without a key on this server (Quantdeck's guard in the engine, see
    ``quantdeck.core.workers.engine.KeyGuard``): one phrase for the warnings."""
    if not cfg.server.api_key:
        return "without a key every route is open (inference, /start_profile, /scale_elastic_ep)"
    if cfg.server.open_metrics:
        return (
            "only /health, /metrics, /tokenize and /detokenize answer without the key "
            "(--no-open-metrics guards /metrics)"
        )
    return "only /health, /tokenize and /detokenize answer without the key"


def _exposure(cfg: LaunchConfig, err: Report, warn: Report) -> None:
    """A server other machines reach needs a key, or the user's explicit word that it may be
    open; either way, what answers without the key is said."""
    host = cfg.server.host
    if is_loopback(host):
        return
    where = f"host {host or '(every interface)'} is reachable from other machines"
    if not cfg.server.api_key and not cfg.server.allow_open:
        err(
            "host",
            f"{where} and no API key is set: set one, bind 127.0.0.1, or allow an open "
            f"server (--allow-open); {keyless_routes(cfg)}",
        )
    else:
        warn("host", f"{where}: {keyless_routes(cfg)}")


def errors(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.level == "error"]
