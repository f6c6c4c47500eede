"""LoRA adapters: reading a PEFT adapter folder, and making a small one for the demo model.

An adapter folder holds ``adapter_config.json`` (PEFT's: rank, alpha, target modules, the base
model it was trained on) and ``adapter_model.safetensors``; vLLM serves it on top of its base
(``--enable-lora``, or loaded at run time). The reader checks what vLLM's own PEFT helper
requires, so a bad adapter is one line here rather than a refusal from a running server.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantdeck.core.errors import ModelError
from quantdeck.core.models.info import inspect_model, read_safetensors_header
from quantdeck.core.paths import atomic_dir
from quantdeck.core.schema import Fields, load_json, read_bounded, shown

if TYPE_CHECKING:
    import numpy as np

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")
MAX_RANK = 512  # the largest --max-lora-rank vLLM accepts
_MAX_CONFIG = 1 * 2**20
_MAX_MODULES = 256


@dataclass(frozen=True)
class AdapterInfo:
    """What the library and the loader need to know about a LoRA adapter."""

    path: str
    rank: int
    alpha: float
    target_modules: tuple[str, ...]
    base_model: str | None  # base_model_name_or_path: a hub id or a folder, as PEFT wrote it
    weights_bytes: int
    peft_type: str = "LORA"

    @property
    def badge(self) -> str:
        return f"LoRA-{self.rank}"

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "badge": self.badge}


def is_adapter_dir(path: Path) -> bool:
    """A folder with an ``adapter_config.json`` (weights checked by :func:`read_adapter`)."""
    return (path / ADAPTER_CONFIG).is_file()


def parse_adapter_config(data: Any, where: str) -> dict[str, Any]:
    """The fields of an ``adapter_config.json`` vLLM needs, checked: a bad one is a ModelError
    naming the key."""
    f = Fields(data, where, error=ModelError)
    peft_type = f.text("peft_type", max_len=32) or "LORA"
    if peft_type.upper() != "LORA":
        f.fail(f"'peft_type' is {shown(peft_type)}: only LoRA adapters are served")
    rank = f.integer("r", lo=1, hi=MAX_RANK, required=True)
    alpha = f.number("lora_alpha", lo=0, hi=1e6, required=True)
    targets = f.data.get("target_modules")
    if isinstance(targets, str) and 0 < len(targets) <= 4096:
        modules: tuple[str, ...] = (targets,)  # PEFT's regular-expression form
    else:
        items = f.items("target_modules", max_len=_MAX_MODULES, required=True) or []
        if not items or not all(isinstance(m, str) and 0 < len(m) <= 256 for m in items):
            f.fail(f"'target_modules' must name at least one module, got {shown(targets)}")
        modules = tuple(items)
    return {
        "peft_type": peft_type.upper(),
        "rank": rank,
        "alpha": alpha,
        "target_modules": modules,
        "base_model": f.text("base_model_name_or_path", max_len=4096) or None,
    }


def read_adapter(path: str | os.PathLike[str]) -> AdapterInfo:
    """Inspect an adapter folder; raise ModelError with one line naming the file and problem."""
    root = Path(path).expanduser()
    cfg_path = root / ADAPTER_CONFIG
    raw = read_bounded(cfg_path, _MAX_CONFIG, "adapter config", error=ModelError)
    fields = parse_adapter_config(load_json(raw, str(cfg_path), error=ModelError), str(cfg_path))
    weights = next((root / n for n in ADAPTER_WEIGHTS if (root / n).is_file()), None)
    if weights is None:
        raise ModelError(f"{root}: no {ADAPTER_WEIGHTS[0]} (adapter weights missing)")
    if weights.suffix == ".safetensors":
        nbytes = sum(t.nbytes for t in read_safetensors_header(weights))
    else:
        nbytes = weights.stat().st_size
    return AdapterInfo(str(root.absolute()), weights_bytes=nbytes, **fields)


# -- a demo adapter ----------------------------------------------------------------------------

DEMO_TARGETS = ("q_proj", "v_proj")
DEMO_RANK = 8


def _write_safetensors(path: Path, tensors: dict[str, np.ndarray]) -> None:
    """safetensors' layout by hand (8-byte header length, JSON header, the raw data): the
    format is that simple, and the core needs neither torch nor the safetensors package."""
    import numpy as np  # here: the CLI and the panel start without it

    tensors = {k: np.ascontiguousarray(t, dtype="<f4") for k, t in tensors.items()}
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, t in tensors.items():
        header[name] = {
            "dtype": "F32",
            "shape": list(t.shape),
            "data_offsets": [offset, offset + t.nbytes],
        }
        offset += t.nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text)
        for t in tensors.values():
            f.write(t.tobytes())


def make_demo_adapter(
    target: str | os.PathLike[str], base: str | os.PathLike[str], *, seed: int = 0
) -> Path:
    """Write a rank-8 LoRA adapter on ``q_proj`` and ``v_proj`` of the Llama-shaped ``base``.

    Its weights are random, not trained, and large enough that greedy outputs differ from the
    base model's: a test adapter, made in milliseconds, which shows that loading and routing
    to an adapter work. The folder is built through :func:`atomic_dir` (kind ``"lora"``).
    """
    info = inspect_model(base)
    out_dims = {
        "q_proj": info.num_attention_heads * info.head_dim,
        "v_proj": info.num_kv_heads * info.head_dim,
    }
    import numpy as np

    rng = np.random.default_rng(seed)
    tensors: dict[str, np.ndarray] = {}
    for layer in range(info.num_layers):
        for module in DEMO_TARGETS:
            prefix = f"base_model.model.model.layers.{layer}.self_attn.{module}"
            a = rng.normal(0, info.hidden_size**-0.5, (DEMO_RANK, info.hidden_size))
            b = rng.normal(0, 0.2, (out_dims[module], DEMO_RANK))
            tensors[f"{prefix}.lora_A.weight"] = a
            tensors[f"{prefix}.lora_B.weight"] = b
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": DEMO_RANK,
        "lora_alpha": 2 * DEMO_RANK,
        "lora_dropout": 0.0,
        "target_modules": list(DEMO_TARGETS),
        "base_model_name_or_path": str(Path(info.path).absolute()),
        "bias": "none",
        "fan_in_fan_out": False,
        "modules_to_save": None,
        "use_rslora": False,
        "use_dora": False,
    }
    dest = Path(target).expanduser().absolute()
    with atomic_dir(dest, "lora", overwrite=True) as tmp:
        (tmp / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        _write_safetensors(tmp / ADAPTER_WEIGHTS[0], tensors)
    return dest
