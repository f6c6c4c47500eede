"""fp8, fp8-tensor and w8a8: compressed-tensors' schemes, with llm-compressor's observers."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from quantdeck.core.models import ModelInfo
from quantdeck.core.workers.quantize.common import (
    ConvertError,
    Progress,
    calibration_batches,
    decoder_layers,
    load_model,
)

# compressed-tensors preset scheme of each method (compressed_tensors.quantization.quant_scheme)
CT_PRESETS = {"fp8": "FP8_DYNAMIC", "fp8-tensor": "FP8", "w8a8": "W8A8"}
CT_IGNORE = ["lm_head"]  # as llm-compressor's examples: the output head stays bf16


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


def convert(
    src: Path,
    out: Path,
    method: str,
    info: ModelInfo,
    calib: list[str],
    samples: int,
    seq_len: int,
    progress: Progress,
) -> None:
    """fp8 / fp8-tensor / w8a8 through compressed-tensors."""
    from compressed_tensors import LoggerConfig, configure_logger
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (
        QuantizationConfig,
        QuantizationStatus,
        apply_quantization_config,
        preset_name_to_scheme,
    )
    from compressed_tensors.quantization.utils import is_module_quantized

    configure_logger(LoggerConfig(disabled=True))
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
