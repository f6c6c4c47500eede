"""What every backend of the conversion worker shares: the checks on SRC and OUT made before
any heavy import, calibration text, model loading, progress lines, the side files copied from
SRC, weight bytes."""

from __future__ import annotations

import json
import os
import resource
import shutil
import sys
import threading
from pathlib import Path
from typing import Any

from quantdeck.core.errors import ModelError, QuantdeckError
from quantdeck.core.models import ModelInfo, inspect_model
from quantdeck.core.paths import CORPUS, refuse_overlap
from quantdeck.core.workers.protocol import emit

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
    """OUT must be an existing empty folder that is not, is not in and does not contain SRC.
    (The job makes it: a temporary sibling of the target, renamed into place when verified.)"""
    if not out.is_dir():
        raise ConvertError(f"{out}: output folder does not exist (the caller makes it)")
    if any(out.iterdir()):
        raise ConvertError(f"{out}: output folder is not empty")
    refuse_overlap(out, src)


def write_failure(e: Exception) -> str | None:
    """What went wrong, in one line, when ``e`` is the system refusing a read or write (a full
    disk, a quota, permissions); None for anything else. The libraries that save weights raise
    OSError, or their own error types carrying the OS error's text (safetensors)."""
    if isinstance(e, OSError):
        where = f"{e.filename}: " if e.filename else ""
        return f"{where}{e.strerror or e}"
    text = str(e)
    for needle in ("No space left on device", "Disk quota exceeded", "File too large"):
        if needle in text:
            return needle.lower()
    return None


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


# -- loading and calibration (torch and transformers, imported lazily) -----------------------


def quiet_libraries() -> None:
    """Keep library progress bars, warnings and info logs off stderr (the parent reads it for
    errors). The quality check (``quantdeck.core.workers.quality``) uses it too."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("COMPRESSED_TENSORS_LOG_DISABLED", "1")
    os.environ.setdefault("TQDM_DISABLE", "1")  # e.g. compressed-tensors' "Decompressing model"
    import logging
    import warnings

    warnings.filterwarnings("ignore")
    logging.getLogger("bitsandbytes").setLevel(logging.ERROR)
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()


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


# -- the output ------------------------------------------------------------------------------


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
