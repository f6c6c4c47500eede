"""Build Quantdeck's built-in demo model: a tiny, deterministic Llama trained in seconds on CPU.

Run as a subprocess (it imports torch, transformers and tokenizers; nothing else in ``core``
may)::

    python -m quantdeck.core.workers.demo_train OUTDIR [--steps N] [--seed S]

It trains a byte-level BPE tokenizer and a 4-layer Llama on ``assets/corpus/train.txt`` and
writes a Hugging Face model folder (config.json, model.safetensors in bfloat16, tokenizer.json,
tokenizer_config.json, special_tokens_map.json, generation_config.json) into OUTDIR. The same
seed on the same machine gives byte-identical files.

stdout carries one JSON object per line: ``{"event": "progress", "stage": "tokenizer" | "train"
| "save", "pct": <overall 0-100>, "loss": <float, train only>}`` and finally ``{"event":
"done", "out": ..., "seconds": ..., "final_loss": ..., "initial_loss": ..., ...}`` where
``final_loss`` is the mean training loss of the last 10 steps. On error one line goes to
stderr and the exit code is 2.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

from quantdeck.core.paths import CORPUS
from quantdeck.core.workers import protocol
from quantdeck.core.workers.protocol import emit

PROG = "demo_train"  # the name on its one-line errors
CORPUS_DIR = CORPUS

BOS, EOS, PAD = "<|begin_of_text|>", "<|end_of_text|>", "<|pad|>"
ROLE_TOKENS = ["<|system|>", "<|user|>", "<|assistant|>"]
SPECIAL_TOKENS = [BOS, EOS, PAD, *ROLE_TOKENS]  # ids 0..5

# Training recipe, tuned for ~40 s on two CPU cores (see the README of assets/corpus for the
# data). The large embedding learning rate (30x) is what gets the model past unigram
# statistics within the budget: held-out perplexity ~60 instead of ~180 with one LR.
VOCAB_SIZE = 2048
SEQ_LEN = 128
BATCH_SIZE = 4
DEFAULT_STEPS = 180
DEFAULT_SEED = 1234
NUM_THREADS = 2
PEAK_LR = 2e-3
EMBED_LR_MULT = 30.0
HEAD_LR_MULT = 3.0
WEIGHT_DECAY = 0.05
WARMUP_FRAC = 0.1
FINAL_LR_FRAC = 0.1

# Role-tagged chat format; every turn ends with the EOS token, so generation stops there.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>\\n' + message['content'] + eos_token + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)

MODEL_CONFIG: dict[str, Any] = {
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 256,
    "num_hidden_layers": 4,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 64,
    "intermediate_size": 768,
    "max_position_embeddings": 2048,
    "rope_theta": 10000.0,
    "rms_norm_eps": 1e-5,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "attention_bias": False,
    "mlp_bias": False,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "pad_token_id": 2,
}


def progress(stage: str, pct: float, loss: float | None = None) -> None:
    """Report overall progress (0-100) within ``stage``."""
    fields: dict[str, Any] = {"stage": stage, "pct": round(pct, 2)}
    if loss is not None:
        fields["loss"] = round(loss, 5)
    emit("progress", **fields)


def train_tokenizer(text: str) -> Any:
    """Train the byte-level BPE tokenizer (vocab 2048) that prefixes BOS to every encoding."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        min_frequency=2,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(text.split("\n\n"), trainer=trainer)
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A",
        pair=f"{BOS} $A {BOS} $B",
        special_tokens=[(BOS, tok.token_to_id(BOS))],
    )
    if tok.get_vocab_size() != VOCAB_SIZE:
        raise RuntimeError(f"tokenizer has {tok.get_vocab_size()} tokens, expected {VOCAB_SIZE}")
    return tok


def write_json(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` as stable, indented JSON."""
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def save_tokenizer(tok: Any, out: Path) -> None:
    """Write tokenizer.json plus the config files transformers and vLLM read."""
    tok.save(str(out / "tokenizer.json"))
    write_json(
        out / "tokenizer_config.json",
        {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": BOS,
            "eos_token": EOS,
            "pad_token": PAD,
            "unk_token": None,
            "add_bos_token": True,
            "add_eos_token": False,
            "additional_special_tokens": ROLE_TOKENS,
            "clean_up_tokenization_spaces": False,
            "model_max_length": MODEL_CONFIG["max_position_embeddings"],
            "padding_side": "left",
            "chat_template": CHAT_TEMPLATE,
        },
    )
    write_json(
        out / "special_tokens_map.json",
        {
            "bos_token": BOS,
            "eos_token": EOS,
            "pad_token": PAD,
            "additional_special_tokens": ROLE_TOKENS,
        },
    )


def param_groups(model: Any) -> list[dict[str, Any]]:
    """AdamW groups: a higher learning rate for the (sparsely updated) embeddings and the
    output head, and no weight decay on norms."""
    groups: dict[str, dict[str, Any]] = {
        "embed": {"params": [], "lr_mult": EMBED_LR_MULT, "weight_decay": 0.0},
        "head": {"params": [], "lr_mult": HEAD_LR_MULT, "weight_decay": 0.0},
        "matrix": {"params": [], "lr_mult": 1.0, "weight_decay": WEIGHT_DECAY},
        "norm": {"params": [], "lr_mult": 1.0, "weight_decay": 0.0},
    }
    for name, p in model.named_parameters():
        key = (
            "embed"
            if "embed_tokens" in name
            else "head"
            if name.startswith("lm_head")
            else "matrix"
            if p.ndim >= 2
            else "norm"
        )
        groups[key]["params"].append(p)
    return [g for g in groups.values() if g["params"]]


def lr_at(step: int, steps: int) -> float:
    """Linear warm-up, then cosine decay to ``FINAL_LR_FRAC`` of the peak."""
    warmup = max(1, round(steps * WARMUP_FRAC))
    if step < warmup:
        return PEAK_LR * (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return PEAK_LR * (FINAL_LR_FRAC + (1 - FINAL_LR_FRAC) * 0.5 * (1.0 + math.cos(math.pi * t)))


def build(out: Path, steps: int, seed: int) -> dict[str, Any]:
    """Train tokenizer and model, write everything into ``out``; return the summary."""
    t0 = time.monotonic()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "true")
    text = (CORPUS_DIR / "train.txt").read_text(encoding="utf-8")

    progress("tokenizer", 0.0)
    tok = train_tokenizer(text)
    ids_list = tok.encode(text, add_special_tokens=False).ids
    progress("tokenizer", 10.0)

    import logging

    import torch

    # transformers imports torchao where it is installed (GPTQModel needs it): its notes about
    # CUDA kernels a CPU host cannot load, and torch's about its enums, are not errors.
    for name in ("torchao", "torch.utils._pytree"):
        logging.getLogger(name).setLevel(logging.ERROR)
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # keep stderr for the one error line

    torch.set_num_threads(NUM_THREADS)
    torch.use_deterministic_algorithms(True)
    torch.manual_seed(seed)
    config = LlamaConfig(**MODEL_CONFIG)
    model = LlamaForCausalLM(config).float()
    model.train()

    data = torch.tensor(ids_list, dtype=torch.long)
    bos = torch.full((BATCH_SIZE, 1), tok.token_to_id(BOS), dtype=torch.long)
    offsets = torch.arange(SEQ_LEN - 1)
    gen = torch.Generator().manual_seed(seed)
    opt = torch.optim.AdamW(param_groups(model), lr=PEAK_LR, betas=(0.9, 0.95), eps=1e-8)

    losses: list[float] = []
    report_every = max(1, steps // 30)
    for step in range(steps):
        for group in opt.param_groups:
            group["lr"] = lr_at(step, steps) * group["lr_mult"]
        starts = torch.randint(0, len(data) - SEQ_LEN, (BATCH_SIZE,), generator=gen)
        batch = torch.cat([bos, data[starts[:, None] + offsets]], dim=1)
        loss = model(input_ids=batch, labels=batch).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(float(loss.detach()))
        if step % report_every == 0 or step == steps - 1:
            progress("train", 10.0 + 85.0 * (step + 1) / steps, losses[-1])

    progress("save", 95.0)
    model.eval()
    model.generation_config = GenerationConfig(
        bos_token_id=MODEL_CONFIG["bos_token_id"],
        eos_token_id=MODEL_CONFIG["eos_token_id"],
        pad_token_id=MODEL_CONFIG["pad_token_id"],
    )
    model.to(torch.bfloat16)
    model.config.dtype = torch.bfloat16
    model.save_pretrained(out, safe_serialization=True)
    _fix_config(out / "config.json")
    save_tokenizer(tok, out)
    progress("save", 100.0)

    tail = losses[-10:]
    return {
        "out": str(out),
        "seconds": round(time.monotonic() - t0, 2),
        "final_loss": round(sum(tail) / len(tail), 5),
        "initial_loss": round(losses[0], 5),
        "steps": steps,
        "seed": seed,
        "tokens_seen": steps * BATCH_SIZE * SEQ_LEN,
    }


def _fix_config(path: Path) -> None:
    """Make config.json readable by transformers 4 and 5: dtype and rope_theta under both
    the old and the new keys."""
    cfg = json.loads(path.read_text(encoding="utf-8"))
    cfg["architectures"] = ["LlamaForCausalLM"]
    cfg["dtype"] = "bfloat16"
    cfg["torch_dtype"] = "bfloat16"
    cfg.setdefault("rope_theta", MODEL_CONFIG["rope_theta"])  # transformers 4.x / older vLLM
    write_json(path, cfg)


def fail(message: object) -> NoReturn:
    """One error line on stderr, exit code 2."""
    protocol.fail(PROG, message)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = protocol.OneLineParser(prog=PROG, description=__doc__.split("\n")[0])
    parser.add_argument("outdir", type=Path, help="folder to write the model into")
    parser.add_argument("--steps", type=int, default=DEFAULT_STEPS, help="training steps")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="random seed")
    args = parser.parse_args(argv)
    if args.steps < 1:
        fail(f"--steps must be at least 1, got {args.steps}")
    try:
        args.outdir.mkdir(parents=True, exist_ok=True)
        summary = build(args.outdir, args.steps, args.seed)
    except Exception as exc:
        fail(f"{type(exc).__name__}: {exc}")
    emit("done", **summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
