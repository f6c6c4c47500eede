"""The model inspector: facts about a checkpoint from config.json and safetensors headers.

No weights are read: a safetensors file starts with an 8-byte little-endian header length and
a JSON header naming every tensor's dtype, shape and byte range, so even a 16 GB checkpoint is
inspected in milliseconds.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from quantdeck.core.errors import ModelError

# Bytes per element of the dtypes a safetensors header may name.
DTYPE_BYTES: dict[str, float] = {
    "F64": 8,
    "I64": 8,
    "U64": 8,
    "F32": 4,
    "I32": 4,
    "U32": 4,
    "F16": 2,
    "BF16": 2,
    "I16": 2,
    "U16": 2,
    "I8": 1,
    "U8": 1,
    "BOOL": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "F8_E8M0": 1,
    "F8_E4M3FNUZ": 1,
    "F8_E5M2FNUZ": 1,
    "F4": 0.5,
    "F6_E2M3": 0.75,
    "F6_E3M2": 0.75,
}
TORCH_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F8_E4M3": "float8_e4m3fn"}
_MAX_HEADER = 100 * 2**20

# Text-generation architectures whose shape the planner understands (vLLM serves them all).
# Others ending in ForCausalLM are accepted when config.json has the standard shape fields.
KNOWN_ARCHITECTURES = frozenset(
    {
        "LlamaForCausalLM",
        "MistralForCausalLM",
        "MixtralForCausalLM",
        "Qwen2ForCausalLM",
        "Qwen3ForCausalLM",
        "Qwen2MoeForCausalLM",
        "Qwen3MoeForCausalLM",
        "GemmaForCausalLM",
        "Gemma2ForCausalLM",
        "Gemma3ForCausalLM",
        "Phi3ForCausalLM",
        "PhiForCausalLM",
        "GPTNeoXForCausalLM",
        "GPT2LMHeadModel",
        "GPTBigCodeForCausalLM",
        "GPTJForCausalLM",
        "FalconForCausalLM",
        "OPTForCausalLM",
        "BloomForCausalLM",
        "StableLmForCausalLM",
        "Starcoder2ForCausalLM",
        "OlmoForCausalLM",
        "Olmo2ForCausalLM",
        "GraniteForCausalLM",
        "InternLM2ForCausalLM",
        "CohereForCausalLM",
        "DeepseekV2ForCausalLM",
        "DeepseekV3ForCausalLM",
        "ExaoneForCausalLM",
        "MiniCPMForCausalLM",
        "SmolLM3ForCausalLM",
        "Glm4ForCausalLM",
        "GptOssForCausalLM",
    }
)
_GENERATIVE_SUFFIXES = ("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")


@dataclass(frozen=True)
class Quantization:
    """How a checkpoint's weights are quantized, as vLLM will read it."""

    method: str  # quant_method as in config.json: gptq, awq, fp8, compressed-tensors, bitsandbytes
    bits: int | None
    group_size: int | None
    scheme: str | None  # W4A16, W8A8-INT8, W8A8-FP8, FP8, nf4, fp4, int8, ...

    @property
    def badge(self) -> str:
        """Short label for lists: GPTQ-4, AWQ-4, FP8, W8A8, BnB-4, ..."""
        m = self.method
        if m == "gptq":
            return f"GPTQ-{self.bits}"
        if m == "awq":
            return f"AWQ-{self.bits}"
        if m == "bitsandbytes":
            return f"BnB-{self.bits}"
        if m == "fp8" or (self.scheme or "").startswith("W8A8-FP8") or self.scheme == "FP8":
            return "FP8"
        if self.scheme == "W8A8-INT8":
            return "W8A8"
        if self.scheme:
            return self.scheme
        return m.upper()


@dataclass(frozen=True)
class ModelInfo:
    """What the planner and advisor need to know about a checkpoint."""

    path: str
    architecture: str
    model_type: str
    num_parameters: int
    num_layers: int
    hidden_size: int
    intermediate_size: int | None
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int | None
    torch_dtype: str | None
    weights_bytes: int
    quantization: Quantization | None
    safetensors_files: int
    tie_word_embeddings: bool = False
    kv_lora_rank: int | None = None  # MLA models cache one latent per token and layer
    qk_rope_head_dim: int | None = None
    sliding_window: int | None = None
    tensor_dtypes: dict[str, int] = field(default_factory=dict)  # dtype -> bytes
    linear_weight_bytes: int = 0  # 2-D projection weights: what in-flight quantization shrinks

    @property
    def badge(self) -> str:
        if self.quantization is not None:
            return self.quantization.badge
        return (
            (self.torch_dtype or "?")
            .replace("bfloat16", "BF16")
            .replace("float16", "FP16")
            .replace("float32", "FP32")
        )

    def kv_bytes_per_token(self, kv_dtype_bytes: int = 2) -> int:
        """Bytes of KV cache one token takes over all layers (keys and values)."""
        if self.kv_lora_rank:
            per_layer = self.kv_lora_rank + (self.qk_rope_head_dim or 0)
            return self.num_layers * per_layer * kv_dtype_bytes
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * kv_dtype_bytes

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["badge"] = self.badge
        d["kv_bytes_per_token"] = self.kv_bytes_per_token()
        return d


# -- safetensors headers --------------------------------------------------------------------


@dataclass(frozen=True)
class TensorEntry:
    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int


def read_safetensors_header(path: Path) -> list[TensorEntry]:
    """Parse one safetensors file's header; check it against the file's size."""
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise ModelError(f"{path}: truncated safetensors file (no header)")
            (n,) = struct.unpack("<Q", head)
            if n > _MAX_HEADER or 8 + n > size:
                raise ModelError(
                    f"{path}: corrupt safetensors header (length {n} exceeds "
                    f"the file's {size} bytes)"
                )
            raw = f.read(n)
    except OSError as e:
        raise ModelError(f"{path}: cannot read ({e.strerror})") from None
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise ModelError(f"{path}: corrupt safetensors header (not JSON)") from None
    if not isinstance(header, dict):
        raise ModelError(f"{path}: corrupt safetensors header (not a JSON object)")
    out: list[TensorEntry] = []
    end_max = 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (start, end) = (
                entry["dtype"],
                tuple(entry["shape"]),
                entry["data_offsets"],
            )
            numel = 1
            for d in shape:
                numel *= int(d)
        except (KeyError, TypeError, ValueError):
            raise ModelError(f"{path}: corrupt safetensors header (bad entry '{name}')") from None
        if dtype not in DTYPE_BYTES:
            raise ModelError(f"{path}: unknown tensor dtype '{dtype}' for '{name}'")
        if end < start or end - start != int(numel * DTYPE_BYTES[dtype] + 0.999):
            raise ModelError(
                f"{path}: corrupt safetensors header (offsets of '{name}' do not match its shape)"
            )
        end_max = max(end_max, end)
        out.append(TensorEntry(name, dtype, shape, end - start))
    if 8 + n + end_max > size:
        raise ModelError(
            f"{path}: truncated safetensors file ({size} bytes, header promises {8 + n + end_max})"
        )
    return out


def _weight_files(root: Path) -> list[Path]:
    index = root / "model.safetensors.index.json"
    if index.is_file():
        try:
            wm = json.loads(index.read_text())["weight_map"]
            names = sorted(set(wm.values()))
        except (json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError):
            raise ModelError(f"{index}: corrupt index (no weight_map)") from None
        files = [root / n for n in names]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise ModelError(f"{index}: shard {missing[0]} is missing")
        return files
    return sorted(root.glob("*.safetensors"))


# -- config.json ----------------------------------------------------------------------------


def _first(cfg: dict[str, Any], *names: str) -> Any:
    for n in names:
        if cfg.get(n) is not None:
            return cfg[n]
    return None


def parse_quantization(qc: Any) -> Quantization | None:
    """Read config.json's ``quantization_config`` the way vLLM dispatches on it."""
    if not isinstance(qc, dict):
        return None
    method = str(qc.get("quant_method") or qc.get("quant_algo") or "").lower()
    if not method:
        if qc.get("load_in_4bit") or qc.get("load_in_8bit"):
            method = "bitsandbytes"
        else:
            return None
    if method == "gptq":
        bits = qc.get("bits")
        return Quantization("gptq", bits, qc.get("group_size"), f"W{bits}A16")
    if method == "awq":
        bits = _first(qc, "bits", "w_bit")
        return Quantization("awq", bits, _first(qc, "group_size", "q_group_size"), f"W{bits}A16")
    if method == "fp8":
        block = qc.get("weight_block_size")
        scheme = "FP8-block" if block else "FP8"
        return Quantization("fp8", 8, block[-1] if block else None, scheme)
    if method == "bitsandbytes":
        if qc.get("load_in_4bit"):
            return Quantization(
                "bitsandbytes",
                4,
                qc.get("bnb_4bit_blocksize", 64),
                str(qc.get("bnb_4bit_quant_type", "fp4")),
            )
        return Quantization("bitsandbytes", 8, None, "int8")
    if method == "compressed-tensors":
        return _compressed_tensors(qc)
    bits = _first(qc, "bits", "w_bit", "num_bits")
    return Quantization(method, bits if isinstance(bits, int) else None, qc.get("group_size"), None)


def _compressed_tensors(qc: dict[str, Any]) -> Quantization:
    groups = qc.get("config_groups") or {}
    g: dict[str, Any] = next(iter(groups.values()), {}) if isinstance(groups, dict) else {}
    w = g.get("weights") or {}
    a = g.get("input_activations") or {}
    bits = w.get("num_bits")
    wtype = w.get("type", "int")
    gs = w.get("group_size") if w.get("strategy") == "group" else None
    if a:
        abits, atype = a.get("num_bits"), a.get("type", "int")
        kind = (
            "FP8"
            if atype == "float" and wtype == "float"
            else "INT8"
            if atype == "int"
            else atype.upper()
        )
        scheme = f"W{bits}A{abits}-{kind}"
        if kind == "FP8" and w.get("strategy") == "tensor":
            scheme += "-tensor"
    else:
        scheme = f"W{bits}A16" + ("-FP8" if wtype == "float" else "")
    return Quantization("compressed-tensors", bits, gs, scheme)


def _load_config(root: Path) -> dict[str, Any]:
    p = root / "config.json"
    if not root.exists():
        raise ModelError(f"{root}: no such folder")
    if not root.is_dir():
        raise ModelError(f"{root}: not a folder")
    if not p.is_file():
        raise ModelError(f"{root}: no config.json (not a model folder)")
    try:
        cfg = json.loads(p.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ModelError(f"{p}: not UTF-8 text") from None
    except json.JSONDecodeError as e:
        raise ModelError(f"{p}: corrupt JSON (line {e.lineno}: {e.msg})") from None
    if not isinstance(cfg, dict):
        raise ModelError(f"{p}: corrupt JSON (not an object)")
    return cfg


def inspect_model(path: str | os.PathLike[str]) -> ModelInfo:
    """Inspect a model folder; raise ModelError with one line naming the file and problem."""
    root = Path(path).expanduser()
    cfg = _load_config(root)
    archs = cfg.get("architectures") or []
    arch = archs[0] if isinstance(archs, list) and archs else None
    where = root / "config.json"
    if not arch:
        raise ModelError(f"{where}: no 'architectures' entry (unknown architecture)")
    text_config = cfg.get("text_config")
    text: dict[str, Any] = text_config if isinstance(text_config, dict) else cfg
    if arch not in KNOWN_ARCHITECTURES and not arch.endswith(_GENERATIVE_SUFFIXES):
        raise ModelError(
            f"{where}: unknown architecture '{arch}' (not a text-generation model vLLM serves)"
        )
    layers = _first(text, "num_hidden_layers", "n_layer", "num_layers")
    hidden = _first(text, "hidden_size", "n_embd", "d_model")
    heads = _first(text, "num_attention_heads", "n_head")
    vocab = _first(text, "vocab_size", "padded_vocab_size")
    for name, v in (
        ("num_hidden_layers", layers),
        ("hidden_size", hidden),
        ("num_attention_heads", heads),
        ("vocab_size", vocab),
    ):
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise ModelError(
                f"{where}: '{name}' missing or not a positive integer "
                f"(unknown architecture '{arch}'?)"
            )
    kv = _first(text, "num_key_value_heads", "num_kv_heads", "n_head_kv", "multi_query_group_num")
    if kv is None:
        kv = 1 if text.get("multi_query") else heads
    head_dim = text.get("head_dim") or hidden // heads
    files = _weight_files(root)
    if not files:
        raise ModelError(
            f"{root}: no *.safetensors weights (only safetensors checkpoints are supported)"
        )
    tensors = [t for f in files for t in read_safetensors_header(f)]
    quant = parse_quantization(cfg.get("quantization_config") or text.get("quantization_config"))
    dtypes: dict[str, int] = {}
    for t in tensors:
        dtypes[t.dtype] = dtypes.get(t.dtype, 0) + t.nbytes
    torch_dtype = _first(cfg, "torch_dtype", "dtype") or _first(text, "torch_dtype", "dtype")
    if torch_dtype is None and dtypes:
        main = max(dtypes, key=dtypes.__getitem__)
        torch_dtype = TORCH_DTYPES.get(main)
    return ModelInfo(
        path=str(root.resolve()),
        architecture=arch,
        model_type=str(cfg.get("model_type") or text.get("model_type") or ""),
        num_parameters=count_parameters(tensors, quant),
        num_layers=layers,
        hidden_size=hidden,
        intermediate_size=_first(text, "intermediate_size", "n_inner", "ffn_hidden_size"),
        num_attention_heads=heads,
        num_kv_heads=int(kv),
        head_dim=int(head_dim),
        vocab_size=vocab,
        max_position_embeddings=_first(
            text, "max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"
        ),
        torch_dtype=str(torch_dtype) if torch_dtype else None,
        weights_bytes=sum(t.nbytes for t in tensors),
        quantization=quant,
        safetensors_files=len(files),
        tie_word_embeddings=bool(
            text.get("tie_word_embeddings", cfg.get("tie_word_embeddings", False))
        ),
        kv_lora_rank=text.get("kv_lora_rank"),
        qk_rope_head_dim=text.get("qk_rope_head_dim"),
        sliding_window=text.get("sliding_window")
        if isinstance(text.get("sliding_window"), int)
        else None,
        tensor_dtypes=dtypes,
        linear_weight_bytes=sum(t.nbytes for t in tensors if _is_linear(t)),
    )


def _is_linear(t: TensorEntry) -> bool:
    """A decoder layer's projection weight (not embeddings, head or norms)."""
    n = t.name
    return (
        len(t.shape) == 2
        and n.endswith(".weight")
        and ".layers." in n
        and "norm" not in n
        and "embed" not in n
    )


# Tensors that hold quantization metadata rather than parameters.
_AUX_SUFFIXES = (
    ".scales",
    ".qzeros",
    ".g_idx",
    ".weight_scale",
    ".input_scale",
    ".weight_zero_point",
    ".input_zero_point",
    ".weight_g_idx",
    ".weight_shape",
    ".absmax",
    ".quant_map",
    ".nested_absmax",
    ".nested_quant_map",
    ".quant_state.bitsandbytes__nf4",
    ".quant_state.bitsandbytes__fp4",
    ".SCB",
    ".weight_format",
    ".k_scale",
    ".v_scale",
    ".weight_global_scale",
    ".input_global_scale",
    ".output_scale",
)


def count_parameters(tensors: list[TensorEntry], quant: Quantization | None) -> int:
    """Logical parameters: packed integer weights count as the values they hold."""
    total = 0
    for t in tensors:
        if t.name.endswith(_AUX_SUFFIXES) or ".quant_state." in t.name:
            continue
        numel = 1
        for d in t.shape:
            numel *= d
        if quant is not None and quant.bits and quant.bits < 8:
            if t.dtype in ("I32", "U32") and t.name.endswith((".qweight", ".weight_packed")):
                numel *= 32 // quant.bits
            elif t.dtype == "U8" and quant.method == "bitsandbytes":
                numel *= 8 // quant.bits
        total += numel
    return total
