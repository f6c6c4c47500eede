"""The launch settings: one dataclass per group, each field declared once.

Every field carries, in its metadata, vLLM's own flag name, vLLM's default, its bounds and a
one-line docstring. :mod:`quantdeck.core.launch.knobs` walks these fields to produce the ``vllm
serve`` argument list, the YAML that ``vllm serve --config FILE`` reads, the CLI options and the GUI
form, so a knob is added here and nowhere else.

``None`` means "auto": vLLM picks the value (for the model, device and vLLM version at hand).

Any other option of the chosen engine goes in ``LaunchConfig.extra_args`` (see
:mod:`quantdeck.core.launch.engine_args`), checked against that engine before a start.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from quantdeck.core.fields import setting
from quantdeck.core.launch.engine_args import speculative_config

_UNSET = object()


def knob(
    default: Any,
    doc: str,
    *,
    vllm_default: Any = _UNSET,
    positional: bool = False,
    secret_env: str | None = None,
    quantdeck_only: bool = False,
    to_vllm: Callable[[Any], Any] | None = None,
    **common: Any,
) -> Any:
    """Declare one launch setting: :func:`quantdeck.core.fields.setting` (bounds, ``flag``,
    ``title``, ``unit``, ``advanced`` in ``common``) and vLLM's side of it.

    ``flag`` defaults to ``--`` + the field name with dashes (vLLM's own naming);
    ``vllm_default`` defaults to ``default`` and decides whether the value is passed at all.
    ``secret_env``: the value is a secret, handed to vLLM in this environment variable (another
    user can read a process's argv in ``/proc``) and never written to a file or shown.
    ``quantdeck_only``: Quantdeck's own setting, never passed to vLLM.
    ``to_vllm``: the value as vLLM takes it, from the knob's (a friendly text to vLLM's JSON
    object); raises ConfigError for a value it cannot turn.
    """
    vllm = {
        "vllm_default": default if vllm_default is _UNSET else vllm_default,
        "positional": positional,
        "secret_env": secret_env,
        "quantdeck_only": quantdeck_only,
        "to_vllm": to_vllm,
    }
    return setting(default, doc, extra=vllm, **common)


DType = Literal["auto", "bfloat16", "float16", "half", "float32", "float"]
Quantization = Literal[
    "awq",
    "awq_marlin",
    "gptq",
    "gptq_marlin",
    "fp8",
    "compressed-tensors",
    "bitsandbytes",
    "modelopt",
    "experts_int8",
]
LoadFormat = Literal[
    "auto",
    "safetensors",
    "pt",
    "bitsandbytes",
    "dummy",
    "npcache",
    "sharded_state",
    "runai_streamer",
    "fastsafetensors",
]
KvCacheDtype = Literal["auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2"]
LoraRank = Literal[1, 8, 16, 32, 64, 128, 256, 320, 512]
BlockSize = Literal[1, 8, 16, 32, 64, 128, 256]
CudaGraphMode = Literal["NONE", "PIECEWISE", "FULL", "FULL_DECODE_ONLY", "FULL_AND_PIECEWISE"]
ExecutorBackend = Literal["mp", "ray", "uni"]
PerformanceMode = Literal["balanced", "interactivity", "throughput"]
OptimizationLevel = Literal[0, 1, 2, 3]
KvOffloadingBackend = Literal["native", "lmcache"]


@dataclass
class ModelConfig:
    """Which model to serve and how to load it."""

    model: str = knob(
        "", "Path of the model folder (or a Hugging Face id).", positional=True, title="Model"
    )
    served_model_name: str | None = knob(
        None, "Name the API serves the model under (default: the model path)."
    )
    dtype: DType = knob(
        "auto",
        "Data type of weights and activations; auto takes the "
        "checkpoint's (fp32 checkpoints load as fp16/bf16).",
    )
    quantization: Quantization | None = knob(
        None, "Quantization method; default: read from the checkpoint's quantization_config."
    )
    load_format: LoadFormat = knob("auto", "Format of the weights to load.", advanced=True)
    trust_remote_code: bool = knob(
        False, "Run model code shipped inside the checkpoint.", advanced=True
    )
    max_model_len: int | None = knob(
        None,
        "Longest sequence (prompt + output) in tokens; default: the model's positions.",
        ge=1,
        unit="tokens",
    )
    seed: int = knob(0, "Random seed of the engine's sampling.", ge=0, advanced=True)
    enable_sleep_mode: bool = knob(
        False,
        "Let the server sleep (/sleep frees the weights and KV cache, /wake_up restores them); "
        "CUDA and ROCm only: vLLM refuses it on CPU. vLLM serves those routes in its dev mode "
        "(VLLM_SERVER_DEV_MODE=1, set with it), without the API key: bind to loopback. A live "
        "trial's promoted-over incumbent then sleeps, so that an undo is a wake-up.",
        advanced=True,
        title="Sleep mode",
    )


@dataclass
class CacheConfig:
    """How much memory the KV cache gets and how it is laid out."""

    gpu_memory_utilization: float = knob(
        0.92,
        "Share of the GPU's memory vLLM may use (weights, activations, graphs, KV cache).",
        gt=0.0,
        le=1.0,
        title="GPU memory share",
    )
    kv_cache_memory_bytes: int | None = knob(
        None,
        "KV cache size in bytes per device; overrides gpu_memory_utilization.",
        ge=1,
        unit="bytes",
    )
    block_size: BlockSize | None = knob(
        None, "Tokens per KV-cache block; default: the attention backend's choice.", unit="tokens"
    )
    kv_cache_dtype: KvCacheDtype = knob(
        "auto", "Data type of the KV cache; fp8 halves it (needs scales or costs accuracy)."
    )
    enable_prefix_caching: bool | None = knob(
        None, "Reuse the KV cache of shared prompt prefixes (vLLM's default: on)."
    )
    kv_events: bool = knob(
        False,
        "Follow every KV-cache block: vLLM publishes its KV events (--kv-events-config, on a "
        "free loopback port) and Quantdeck keeps a block index: resident blocks, reuse, "
        "prefix hit rate, evictions (kv events; docs/kv.md). Needs prefix caching.",
        quantdeck_only=True,
        title="KV events",
    )
    cpu_offload_gb: float = knob(
        0.0, "GiB of weights per GPU to keep in CPU memory.", ge=0.0, unit="GiB", advanced=True
    )
    calculate_kv_scales: bool | None = knob(
        None,
        "Compute fp8 KV-cache scales from the first batches (gone from vLLM by 0.29, vllm#49389).",
        advanced=True,
    )
    kv_offloading_size: float | None = knob(
        None,
        "GiB of CPU memory that holds KV blocks evicted from the GPU, for prefix-cache reuse "
        "(summed over tensor-parallel ranks); off when unset.",
        gt=0.0,
        unit="GiB",
        advanced=True,
        title="KV offloading",
    )
    kv_offloading_backend: KvOffloadingBackend | None = knob(
        None,
        "What offloads the KV cache: native (vLLM's CPU offloading) or lmcache; needs "
        "kv_offloading_size (vLLM's default: native).",
        advanced=True,
        title="KV offloading backend",
    )


@dataclass
class SchedulerConfig:
    """How many sequences and tokens one engine step may take."""

    max_num_seqs: int | None = knob(
        None, "Most sequences in one batch; default depends on device and vLLM version.", ge=1
    )
    max_num_batched_tokens: int | None = knob(
        None,
        "Most tokens in one engine step; default depends on device and vLLM version.",
        ge=1,
        unit="tokens",
    )
    enable_chunked_prefill: bool | None = knob(
        None, "Split long prompts across steps so decodes keep running (vLLM's default: on)."
    )
    max_num_partial_prefills: int | None = knob(
        None,
        "Most prompts prefilled in one step, chunked (gone from vLLM by 0.29, vllm#49244).",
        ge=1,
        advanced=True,
    )
    max_num_active_seqs: int | None = knob(
        None,
        "Most requests admitted into RUNNING (<= max_num_seqs; vLLM >= 0.31).",
        ge=1,
        advanced=True,
    )
    max_num_queued_reqs: int | None = knob(
        None,
        "Most requests waiting or running; more get HTTP 503 (vLLM >= 0.29).",
        ge=0,
        advanced=True,
    )


@dataclass
class PerformanceConfig:
    """What the engine favours and how much it optimises; speculative decoding."""

    performance_mode: PerformanceMode | None = knob(
        None,
        "balanced, interactivity (low latency at small batches: fine-grained CUDA graphs, "
        "latency kernels) or throughput (tokens/s at high concurrency); vLLM >= 0.29 "
        "(vLLM's default: balanced).",
    )
    optimization_level: OptimizationLevel | None = knob(
        None,
        "vLLM's -O level: 0 starts fastest (no compilation, no CUDA graphs), 1 compiles with "
        "piecewise graphs, 2 adds full graphs, 3 as 2 (vLLM's default: 2).",
        title="Optimization level",
    )
    speculative: str | None = knob(
        None,
        "Speculative decoding: ngram:K (draft K tokens a step from the prompt, no draft "
        "model) or vLLM's JSON speculative config (EAGLE, a draft model); off when unset.",
        flag="--speculative-config",
        to_vllm=speculative_config,
        metavar="ngram:K|JSON",
        title="Speculative decoding",
    )


@dataclass
class CompilationConfig:
    """Eager mode vs torch.compile and CUDA graphs."""

    enforce_eager: bool = knob(
        False,
        "Run the model eagerly: no torch.compile, no CUDA graphs. Starts fastest, "
        "decodes slowest (4x slower at batch 1 for bf16 on an H200).",
        title="Eager mode",
    )
    cudagraph_mode: CudaGraphMode | None = knob(
        None,
        "Which CUDA graphs to capture; default: vLLM's (FULL_AND_PIECEWISE on new "
        "versions). Passed as compilation_config.cudagraph_mode.",
        advanced=True,
        flag="--compilation-config.cudagraph_mode",
    )
    cudagraph_capture_sizes: list[int] | None = knob(
        None,
        "Batch sizes to capture CUDA graphs for; default: vLLM's list up to max_num_seqs.",
        advanced=True,
        flag="--compilation-config.cudagraph_capture_sizes",
    )


@dataclass
class ParallelConfig:
    """How the model is spread over GPUs."""

    tensor_parallel_size: int = knob(
        1, "GPUs that split every layer (tensor parallel).", ge=1, le=64
    )
    pipeline_parallel_size: int = knob(
        1, "GPUs that hold consecutive layers (pipeline parallel).", ge=1, le=64
    )
    data_parallel_size: int = knob(
        1, "Independent model replicas (data parallel).", ge=1, le=64, advanced=True
    )
    distributed_executor_backend: ExecutorBackend | None = knob(
        None, "Worker backend for several GPUs: mp (one host) or ray (a cluster).", advanced=True
    )
    ray_address: str | None = knob(
        None,
        "Ray cluster for the ray backend: HOST:PORT of its head, or ray://HOST:PORT; given to "
        "vLLM as RAY_ADDRESS. Auto: RAY_ADDRESS, else a cluster `ray start` made on this "
        "machine, else vLLM's Ray starts one here.",
        quantdeck_only=True,
        advanced=True,
        title="Ray address",
    )


@dataclass
class LoRAConfig:
    """Serving LoRA adapters on top of the base model."""

    enable_lora: bool = knob(False, "Allow LoRA adapters to be served.", title="LoRA")
    max_loras: int = knob(1, "Most adapters in one batch.", ge=1, le=256)
    max_lora_rank: LoraRank = knob(16, "Highest rank of any adapter served.")
    lora_modules: list[str] = knob(
        [], "Adapters to load at start, each NAME=PATH.", flag="--lora-modules"
    )
    allow_runtime_lora_updating: bool = knob(
        False,
        "Load and unload adapters while the server runs (sets VLLM_ALLOW_RUNTIME_LORA_UPDATING); "
        "any API client may then load a folder of this machine.",
        quantdeck_only=True,
        title="Adapters at run time",
    )


@dataclass
class ServerConfig:
    """The OpenAI-compatible HTTP server."""

    host: str = knob(
        "127.0.0.1",
        "Address to listen on: 127.0.0.1 this machine only, "
        "0.0.0.0 every interface (vLLM's default).",
        vllm_default=None,
    )
    port: int = knob(8000, "TCP port of the OpenAI API and /metrics.", ge=1, le=65535)
    api_key: str | None = knob(
        None,
        "Key every route of the server requires as a Bearer token (Quantdeck's guard, not only "
        "vLLM's /v1): only /health answers without it, and /metrics while Open /metrics is on.",
        secret_env="VLLM_API_KEY",
        title="API key",
    )
    open_metrics: bool = knob(
        True,
        "With an API key, /metrics still answers without it, as on vLLM (a Prometheus scraper "
        "sends none unless told to); off, /metrics wants the key too.",
        quantdeck_only=True,
        advanced=True,
        title="Open /metrics",
    )
    allow_open: bool = knob(
        False,
        "Serve on an address beyond this machine without an API key.",
        quantdeck_only=True,
        title="Allow an open server",
    )
    profiler: bool = knob(
        False,
        "Let the server be profiled: vLLM's torch profiler (--profiler-config), its "
        "/start_profile and /stop_profile endpoints, traces in the run folder's profiles/ "
        "(quantdeck trace; docs/monitor.md). For development: any client with the API key (any "
        "client at all, without one) may start it.",
        quantdeck_only=True,
        advanced=True,
        title="Profiler",
    )


GROUPS: dict[str, type] = {
    "model": ModelConfig,
    "cache": CacheConfig,
    "scheduler": SchedulerConfig,
    "performance": PerformanceConfig,
    "compilation": CompilationConfig,
    "parallel": ParallelConfig,
    "lora": LoRAConfig,
    "server": ServerConfig,
}


@dataclass
class LaunchConfig:
    """Everything needed to start one vLLM server: the knobs, group by group, and any other
    option of the engine (``extra_args``: vLLM's flag name without dashes -> its value)."""

    model: ModelConfig = field(default_factory=ModelConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    performance: PerformanceConfig = field(default_factory=PerformanceConfig)
    compilation: CompilationConfig = field(default_factory=CompilationConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    lora: LoRAConfig = field(default_factory=LoRAConfig)
    server: ServerConfig = field(default_factory=ServerConfig)
    extra_args: dict[str, Any] = field(default_factory=dict)

    def copy(self) -> LaunchConfig:
        return dataclasses.replace(
            self,
            **{g: dataclasses.replace(getattr(self, g)) for g in GROUPS},
            extra_args=copy.deepcopy(self.extra_args),
        )
