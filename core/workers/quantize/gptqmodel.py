"""gptq and awq: GPTQModel, layer by layer on calibration text."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from quantdeck.core.models import ModelInfo
from quantdeck.core.workers.quantize.common import ConvertError, Progress, calibration_batches


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
