"""The model inspector: facts about a checkpoint from config.json and safetensors headers.

No weights are read: a safetensors file starts with an 8-byte little-endian header length and
a JSON header naming every tensor's dtype, shape and byte range, so even a 16 GB checkpoint is
inspected in milliseconds.
"""

from __future__ import annotations

import os
import struct
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from quantdeck.core.errors import ModelError
from quantdeck.core.schema import Fields, is_int, load_json, read_bounded, regular_file, shown

# Bits per element of the dtypes a safetensors header may name.
DTYPE_BITS: dict[str, int] = {
    "F64": 64,
    "I64": 64,
    "U64": 64,
    "F32": 32,
    "I32": 32,
    "U32": 32,
    "F16": 16,
    "BF16": 16,
    "I16": 16,
    "U16": 16,
    "I8": 8,
    "U8": 8,
    "BOOL": 8,
    "F8_E4M3": 8,
    "F8_E5M2": 8,
    "F8_E8M0": 8,
    "F8_E4M3FNUZ": 8,
    "F8_E5M2FNUZ": 8,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
}
TORCH_DTYPES = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F8_E4M3": "float8_e4m3fn"}
_MAX_HEADER = 100 * 2**20
_MAX_CONFIG = 16 * 2**20  # config.json and the shard index: metadata, never this large
_MAX_INDEX = 64 * 2**20
_MAX_DIM = 2**48  # one tensor dimension
_MAX_RANK = 16

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


# Per-layer cache kinds, named as Hugging Face's ``layer_types`` names them (vLLM reads the same).
FULL = "full_attention"
SLIDING = "sliding_attention"
CHUNKED = "chunked_attention"  # Llama 4 local attention: chunks of attention_chunk_size
MAMBA = "mamba"  # Mamba-2 state (Granite 4.0-H, Nemotron-H, Bamba)
LINEAR = "linear_attention"  # gated delta net state (Qwen3-Next)
NO_CACHE = "none"  # an MLP or MoE layer with no attention (Nemotron-H "-" and "E")
LAYER_KINDS = (FULL, SLIDING, CHUNKED, MAMBA, LINEAR, NO_CACHE)
_KIND_ALIASES = {
    "full_attention": FULL,
    "attention": FULL,
    "global": FULL,
    "sliding_attention": SLIDING,
    "sliding_window": SLIDING,
    "local": SLIDING,
    "chunked_attention": CHUNKED,
    "mamba": MAMBA,
    "mamba2": MAMBA,
    "linear_attention": LINEAR,
    "mlp": NO_CACHE,
    "moe": NO_CACHE,
}
_PATTERN_KINDS = {"M": MAMBA, "*": FULL, "-": NO_CACHE, "E": NO_CACHE}  # Nemotron-H


@dataclass(frozen=True)
class StateShape:
    """The recurrent state one Mamba-2 or gated-delta-net layer keeps per sequence, from
    config.json as vLLM's ``get_mamba_state_shape_from_config`` reads it (before TP split)."""

    kind: str  # "mamba2" or "gdn"
    conv_kernel: int  # the conv state keeps conv_kernel - 1 positions
    # mamba2: conv channels intermediate + 2 x n_groups x state_size; state heads x head_dim x
    # state_size. gdn: conv channels 2 x k_heads x k_dim + v_heads x v_dim; state v_heads x v_dim
    # x k_dim.
    intermediate_size: int = 0
    n_groups: int = 0
    num_heads: int = 0
    head_dim: int = 0
    state_size: int = 0
    num_k_heads: int = 0
    head_k_dim: int = 0
    ssm_dtype: str | None = None  # a model-level SSM state dtype (Nemotron-H: float32)

    def conv_channels(self, tp: int = 1) -> int:
        if self.kind == "gdn":
            return (2 * self.num_k_heads * self.head_k_dim + self.num_heads * self.head_dim) // tp
        groups = self.n_groups + (0 if self.n_groups % tp == 0 else tp - self.n_groups)
        return (self.intermediate_size + 2 * groups * self.state_size) // tp

    def state_elements(self, tp: int = 1) -> int:
        """Elements of the temporal (SSM) state."""
        k = self.head_k_dim if self.kind == "gdn" else self.state_size
        return self.num_heads // tp * self.head_dim * k

    def page_bytes(self, conv_bytes: int, ssm_bytes: int, tp: int = 1) -> int:
        """vLLM's MambaSpec page: the conv state and the temporal state of one layer."""
        conv = (self.conv_kernel - 1) * self.conv_channels(tp) * conv_bytes
        return conv + self.state_elements(tp) * ssm_bytes


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
    layer_types: tuple[str, ...] = ()  # one of LAYER_KINDS per layer; () = all full attention
    attention_chunk_size: int | None = None  # chunked local attention (Llama 4)
    state: StateShape | None = None  # Mamba / linear-attention layers' state

    def kinds(self) -> tuple[str, ...]:
        """The cache kind of every layer (all full attention when config.json names none)."""
        return self.layer_types or (FULL,) * self.num_layers

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

    def shape_error(self) -> str | None:
        """Why this shape cannot be planned (a count below one), else None. The inspector
        refuses such configs; this guards a ModelInfo made some other way."""
        counts = ("num_layers", "hidden_size", "num_attention_heads", "num_kv_heads")
        for name in (*counts, "head_dim", "vocab_size", "max_position_embeddings"):
            v = getattr(self, name)
            if v is None and name == "max_position_embeddings":  # unknown: the planner assumes
                continue
            if not (is_int(v) and v >= 1):
                return f"{self.path}: {name} is {shown(v)}, not a positive integer"
        return None

    def kv_bytes_per_token(self, kv_dtype_bytes: int = 2) -> int:
        """Bytes of KV cache one token takes over all attention layers (keys and values)."""
        layers = sum(k in (FULL, SLIDING, CHUNKED) for k in self.kinds())
        if self.kv_lora_rank:
            per_layer = self.kv_lora_rank + (self.qk_rope_head_dim or 0)
            return layers * per_layer * kv_dtype_bytes
        return 2 * layers * self.num_kv_heads * self.head_dim * kv_dtype_bytes

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
    """Parse one safetensors file's header; check every entry and it against the file's size."""
    try:
        size = regular_file(path, error=ModelError)
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
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise ModelError(f"{path}: corrupt safetensors header (not JSON)") from None
    header = load_json(text, f"{path}: safetensors header", error=ModelError)
    if not isinstance(header, dict):
        raise ModelError(f"{path}: corrupt safetensors header (not a JSON object)")
    out = [_tensor_entry(path, name, entry) for name, entry in header.items()]
    end_max = max((e for _, e in out), default=0)
    if 8 + n + end_max > size:
        raise ModelError(
            f"{path}: truncated safetensors file ({size} bytes, header promises {8 + n + end_max})"
        )
    return [t for t, _ in out if t is not None]


def _tensor_entry(path: Path, name: str, entry: Any) -> tuple[TensorEntry | None, int]:
    """One header entry as (tensor, end offset); ``__metadata__`` is (None, 0)."""
    if name == "__metadata__":
        return None, 0
    bad = f"{path}: corrupt safetensors header (bad entry {shown(name)}"
    if not isinstance(entry, dict):
        raise ModelError(f"{bad}: not an object)")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in DTYPE_BITS:
        raise ModelError(f"{path}: unknown tensor dtype {shown(dtype)} for {shown(name)}")
    if not (
        isinstance(shape, list)
        and len(shape) <= _MAX_RANK
        and all(is_int(d) and 0 <= d <= _MAX_DIM for d in shape)
    ):
        raise ModelError(f"{bad}: shape {shown(shape)})")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(is_int(o) for o in offsets)):
        raise ModelError(f"{bad}: data_offsets {shown(offsets)})")
    numel = 1
    for d in shape:
        numel *= d
    start, end = offsets
    if not 0 <= start <= end or end - start != (numel * DTYPE_BITS[dtype] + 7) // 8:
        raise ModelError(
            f"{path}: corrupt safetensors header (offsets of {shown(name)} do not match its shape)"
        )
    return TensorEntry(name, dtype, tuple(shape), end - start), end


def _read_json(path: Path, max_bytes: int) -> Any:
    """A model's JSON metadata file, size-bounded and parsed strictly."""
    raw = read_bounded(path, max_bytes, "model metadata", error=ModelError)
    return load_json(raw, str(path), error=ModelError)


def _is_shard_name(name: Any) -> bool:
    """A plain .safetensors file name: no folder part, so it stays inside the model folder."""
    return (
        isinstance(name, str)
        and name.endswith(".safetensors")
        and Path(name).name == name
        and "\\" not in name
        and "\0" not in name
    )


def _weight_files(root: Path) -> list[Path]:
    index = root / "model.safetensors.index.json"
    if index.is_file():
        f = Fields(_read_json(index, _MAX_INDEX), str(index), error=ModelError)
        weight_map = f.sub("weight_map", required=True)
        assert weight_map is not None  # required
        for tensor, shard in weight_map.data.items():
            if not _is_shard_name(shard):
                weight_map.fail(
                    f"shard of {shown(tensor)} must be a .safetensors file in the model "
                    f"folder, got {shown(shard)}"
                )
        files = [root / n for n in sorted(set(weight_map.data.values()))]
        missing = [p.name for p in files if not p.is_file()]
        if missing:
            raise ModelError(f"{index}: shard {missing[0]} is missing")
        return files
    return sorted(root.glob("*.safetensors"))


# -- config.json ----------------------------------------------------------------------------

_MAX_GROUP = 2**20  # group sizes; -1 is one group per channel


def parse_quantization(qc: Any, where: str = "quantization_config") -> Quantization | None:
    """Read config.json's ``quantization_config`` the way vLLM dispatches on it; a field of
    the wrong type or range is a ModelError naming it."""
    if qc is None:
        return None
    f = Fields(qc, where, error=ModelError)
    method = (f.text(f.first("quant_method", "quant_algo"), max_len=64) or "").lower()
    if not method:
        if f.boolean("load_in_4bit") or f.boolean("load_in_8bit"):
            method = "bitsandbytes"
        else:
            return None
    if method in ("gptq", "awq"):
        bits = f.integer(f.first("bits", "w_bit"), lo=2, hi=8, required=True)
        group = f.integer(f.first("group_size", "q_group_size"), lo=-1, hi=_MAX_GROUP)
        return Quantization(method, bits, group, f"W{bits}A16")
    if method == "fp8":
        block = f.data.get("weight_block_size")
        if block is not None and not (
            isinstance(block, list) and len(block) == 2 and all(is_int(b) and b > 0 for b in block)
        ):
            f.fail(f"'weight_block_size' must be two positive integers, got {shown(block)}")
        return Quantization("fp8", 8, block[-1] if block else None, "FP8-block" if block else "FP8")
    if method == "bitsandbytes":
        if f.boolean("load_in_4bit"):
            blocksize = f.integer("bnb_4bit_blocksize", lo=1, hi=2**20)
            kind = f.text("bnb_4bit_quant_type", max_len=16)
            return Quantization("bitsandbytes", 4, blocksize or 64, kind or "fp4")
        return Quantization("bitsandbytes", 8, None, "int8")
    if method == "compressed-tensors":
        return _compressed_tensors(f)
    # A method Quantdeck does not parse: its bits and group, when they are plain numbers.
    bits = f.data.get(f.first("bits", "w_bit", "num_bits"))
    group = f.data.get("group_size")
    return Quantization(
        method,
        bits if is_int(bits) and 1 <= bits <= 32 else None,
        group if is_int(group) else None,
        None,
    )


def _compressed_tensors(f: Fields) -> Quantization:
    groups = f.sub("config_groups")
    first = next(iter(groups.data), None) if groups else None
    g = groups.sub(first) if groups and first is not None else None
    w = g.sub("weights") if g else None
    a = g.sub("input_activations") if g else None
    bits = w.integer("num_bits", lo=1, hi=32) if w else None
    wtype = (w.text("type", max_len=16) if w else None) or "int"
    strategy = w.text("strategy", max_len=32) if w else None
    gs = w.integer("group_size", lo=-1, hi=_MAX_GROUP) if w and strategy == "group" else None
    if a:
        abits = a.integer("num_bits", lo=1, hi=32)
        atype = a.text("type", max_len=16) or "int"
        kind = (
            "FP8"
            if atype == "float" and wtype == "float"
            else "INT8"
            if atype == "int"
            else atype.upper()
        )
        scheme = f"W{bits}A{abits}-{kind}"
        if kind == "FP8" and strategy == "tensor":
            scheme += "-tensor"
    else:
        scheme = f"W{bits}A16" + ("-FP8" if wtype == "float" else "")
    return Quantization("compressed-tensors", bits, gs, scheme)


def _load_config(root: Path) -> Fields:
    p = root / "config.json"
    if not root.exists():
        raise ModelError(f"{root}: no such folder")
    if not root.is_dir():
        raise ModelError(f"{root}: not a folder")
    if not p.is_file():
        raise ModelError(f"{root}: no config.json (not a model folder)")
    return Fields(_read_json(p, _MAX_CONFIG), str(p), error=ModelError)


def _architecture(cfg: Fields) -> str:
    archs = cfg.items("architectures", max_len=64) or []
    arch = archs[0] if archs else None
    if not arch:
        cfg.fail("no 'architectures' entry (unknown architecture)")
    if not isinstance(arch, str) or len(arch) > 256:
        cfg.fail(f"'architectures' must be a list of names, got {shown(archs)}")
    if arch not in KNOWN_ARCHITECTURES and not arch.endswith(_GENERATIVE_SUFFIXES):
        cfg.fail(f"unknown architecture '{arch}' (not a text-generation model vLLM serves)")
    return arch


def inspect_model(path: str | os.PathLike[str]) -> ModelInfo:
    """Inspect a model folder; raise ModelError with one line naming the file and problem."""
    root = Path(path).expanduser()
    cfg = _load_config(root)
    arch = _architecture(cfg)
    # Multimodal checkpoints nest the language model's shape in text_config.
    text = cfg.sub("text_config") or cfg
    layers = text.integer(
        text.first("num_hidden_layers", "n_layer", "num_layers"), lo=1, hi=100_000, required=True
    )
    hidden = text.integer(
        text.first("hidden_size", "n_embd", "d_model"), lo=1, hi=2**20, required=True
    )
    heads = text.integer(text.first("num_attention_heads", "n_head"), lo=1, hi=2**16, required=True)
    vocab = text.integer(
        text.first("vocab_size", "padded_vocab_size"), lo=1, hi=2**24, required=True
    )
    assert layers and hidden and heads and vocab  # required
    kv = text.integer(
        text.first("num_key_value_heads", "num_kv_heads", "n_head_kv", "multi_query_group_num"),
        lo=1,
        hi=2**16,
    )
    if kv is None:
        kv = 1 if text.data.get("multi_query") else heads
    head_dim = text.integer("head_dim", lo=1, hi=2**16) or hidden // heads
    max_positions = text.integer(
        text.first("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length"),
        lo=1,
        hi=2**40,
    )
    files = _weight_files(root)
    if not files:
        raise ModelError(
            f"{root}: no *.safetensors weights (only safetensors checkpoints are supported)"
        )
    tensors = [t for f in files for t in read_safetensors_header(f)]
    qsource = cfg if cfg.data.get("quantization_config") else text
    quant = parse_quantization(
        qsource.data.get("quantization_config"), f"{qsource.where}: 'quantization_config'"
    )
    dtypes: dict[str, int] = {}
    for t in tensors:
        dtypes[t.dtype] = dtypes.get(t.dtype, 0) + t.nbytes
    torch_dtype = cfg.text(cfg.first("torch_dtype", "dtype"), max_len=64) or text.text(
        text.first("torch_dtype", "dtype"), max_len=64
    )
    if torch_dtype is None and dtypes:
        main = max(dtypes, key=dtypes.__getitem__)
        torch_dtype = TORCH_DTYPES.get(main)
    tie = text.boolean("tie_word_embeddings")
    sliding = text.data.get("sliding_window")
    if not (is_int(sliding) and sliding > 0):
        sliding = None
    if text.data.get("use_sliding_window") is False:  # Qwen2/3: the window is off
        sliding = None
    kinds = _layer_kinds(text, layers, sliding)
    layers = len(kinds) if kinds else layers  # Nemotron-H: the pattern is the layer list
    return ModelInfo(
        path=str(root.resolve()),
        architecture=arch,
        model_type=cfg.text("model_type", max_len=256)
        or text.text("model_type", max_len=256)
        or "",
        num_parameters=count_parameters(tensors, quant),
        num_layers=layers,
        hidden_size=hidden,
        intermediate_size=text.integer(
            text.first("intermediate_size", "n_inner", "ffn_hidden_size"), lo=1, hi=2**24
        ),
        num_attention_heads=heads,
        num_kv_heads=kv,
        head_dim=head_dim,
        vocab_size=vocab,
        max_position_embeddings=max_positions,
        torch_dtype=torch_dtype or None,
        weights_bytes=sum(t.nbytes for t in tensors),
        quantization=quant,
        safetensors_files=len(files),
        tie_word_embeddings=bool(cfg.boolean("tie_word_embeddings") if tie is None else tie),
        kv_lora_rank=text.integer("kv_lora_rank", lo=1, hi=2**20),
        qk_rope_head_dim=text.integer("qk_rope_head_dim", lo=0, hi=2**16),
        sliding_window=sliding,
        tensor_dtypes=dtypes,
        linear_weight_bytes=sum(t.nbytes for t in tensors if _is_linear(t)),
        layer_types=kinds,
        attention_chunk_size=text.integer("attention_chunk_size", lo=1, hi=2**40)
        if CHUNKED in kinds
        else None,
        state=_state_shape(text, hidden) if MAMBA in kinds or LINEAR in kinds else None,
    )


def _layer_kinds(text: Fields, layers: int, sliding: int | None) -> tuple[str, ...]:
    """Every layer's cache kind, as transformers' config classes fill ``layer_types`` in when
    config.json leaves it out, and as vLLM's attention layers then read it."""
    mt = (text.text("model_type", max_len=256) or "").lower()
    raw = text.data.get("layer_types")
    if raw is None:
        raw = text.data.get("layers_block_type")  # older Granite / Nemotron-H configs
    pattern = text.data.get("hybrid_override_pattern")
    if isinstance(raw, list) and raw:
        kinds = []
        for k in raw:
            kind = _KIND_ALIASES.get(k) if isinstance(k, str) else None
            if kind is None:
                text.fail(f"'layer_types' names an unknown layer type {shown(k)}")
            kinds.append(kind)
        if len(kinds) != layers and not isinstance(pattern, str):
            text.fail(f"'layer_types' has {len(kinds)} entries for {layers} layers")
    elif isinstance(pattern, str) and pattern:
        if any(c not in _PATTERN_KINDS for c in pattern):
            text.fail(f"'hybrid_override_pattern' has an unknown layer code: {shown(pattern)}")
        kinds = [_PATTERN_KINDS[c] for c in pattern]
    elif mt in ("gemma2", "gpt_oss"):
        kinds = [SLIDING if (i + 1) % 2 else FULL for i in range(layers)]
    elif mt in ("gemma3", "gemma3_text", "cohere2", "exaone4"):
        every = text.data.get("sliding_window_pattern", 4 if mt != "gemma3_text" else 6)
        if mt == "gemma3":
            every = text.data.get("sliding_window_pattern", 6)
        if not (is_int(every) and every >= 1):
            text.fail(f"'sliding_window_pattern' must be a positive integer, got {shown(every)}")
        kinds = [SLIDING if (i + 1) % every else FULL for i in range(layers)]
    elif mt in ("qwen2", "qwen3") and sliding:
        first = text.integer("max_window_layers", lo=0, hi=100_000)
        first = 28 if first is None else first
        kinds = [SLIDING if i >= first else FULL for i in range(layers)]
    elif mt == "qwen3_next":
        every = text.integer("full_attention_interval", lo=1, hi=100_000) or 4
        kinds = [LINEAR if (i + 1) % every else FULL for i in range(layers)]
    elif mt in ("llama4", "llama4_text") and text.data.get("attention_chunk_size"):
        nope = text.data.get("no_rope_layers")
        every = text.integer("no_rope_layer_interval", lo=1, hi=100_000) or 4
        if not (isinstance(nope, list) and len(nope) == layers):
            nope = [int((i + 1) % every != 0) for i in range(layers)]
        kinds = [CHUNKED if r else FULL for r in nope]  # RoPE layers attend locally
    elif sliding:  # Mistral-style: one window for every layer
        kinds = [SLIDING] * layers
    else:
        return ()
    if sliding is None:  # no window: vLLM runs the "sliding" layers as full attention
        kinds = [FULL if k == SLIDING else k for k in kinds]
    return tuple(kinds) if any(k != FULL for k in kinds) else ()


def _state_shape(text: Fields, hidden: int) -> StateShape:
    """The Mamba-2 or gated-delta-net state of a hybrid's recurrent layers."""

    def need(*names: str) -> int:
        v = text.integer(text.first(*names), lo=1, hi=2**24, required=True)
        assert v is not None
        return v

    if text.data.get("linear_num_value_heads") is not None:  # Qwen3-Next
        return StateShape(
            "gdn",
            conv_kernel=need("linear_conv_kernel_dim"),
            num_heads=need("linear_num_value_heads"),
            head_dim=need("linear_value_head_dim"),
            num_k_heads=need("linear_num_key_heads"),
            head_k_dim=need("linear_key_head_dim"),
        )
    heads = need("mamba_n_heads", "mamba_num_heads")
    head_dim = need("mamba_d_head", "mamba_head_dim")
    if text.data.get("mamba_num_heads") is not None:  # Nemotron-H
        intermediate = heads * head_dim
        ssm = text.data.get("mamba_ssm_cache_dtype", "float32")
    else:  # Granite 4.0-H, Bamba: expand x hidden
        intermediate = need("mamba_expand") * hidden
        ssm = None
    return StateShape(
        "mamba2",
        conv_kernel=need("mamba_d_conv", "conv_kernel"),
        intermediate_size=intermediate,
        n_groups=need("mamba_n_groups", "n_groups"),
        num_heads=heads,
        head_dim=head_dim,
        state_size=need("mamba_d_state", "ssm_state_size"),
        ssm_dtype=ssm if isinstance(ssm, str) else None,
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
