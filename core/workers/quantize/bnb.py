"""bnb-nf4 and bnb-int8: bitsandbytes, quantizing as transformers loads the model."""

from __future__ import annotations

from pathlib import Path

from quantdeck.core.models import ModelInfo
from quantdeck.core.workers.quantize.common import ConvertError, Progress, load_model


def convert(src: Path, out: Path, method: str, info: ModelInfo, progress: Progress) -> None:
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
