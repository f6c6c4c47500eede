"""Subprocess entry point of the quality check: how far a quantized model drifts from its source.

Run as a subprocess (it imports torch and transformers; nothing else in ``core`` may)::

    python -m quantdeck.core.workers.quality ORIG QUANT [--text FILE] [--max-tokens N] [--window N]
        [--dtype auto|float32|bfloat16]

Both models run through transformers on the CPU over the first N tokens (default 2048) of
held-out text (default ``assets/corpus/heldout.txt``), cut into windows of 256 tokens, each fed
after a BOS token, so every text token is predicted exactly once. QUANT may be any format the
conversion jobs write: compressed-tensors (fp8, fp8-tensor, w8a8; loaded through transformers'
compressed-tensors integration, which simulates the activation quantization too) or
bitsandbytes (nf4, int8; needs bitsandbytes and accelerate).

Both models compute in float32 by default (``--dtype auto``: float32 when the source's float32
copy takes under 40 % of the available memory, else bfloat16): the bf16 weights upcast
exactly, and the comparison then measures the quantization, not bf16 rounding (which alone
gives a KL of ~3e-5 on the demo model), and it is ~2x faster on CPUs without bf16 matmul.
On a busy two-core machine run it with ``OMP_NUM_THREADS=1``: two spinning OpenMP threads
that share a core with another process run ~20x slower.

stdout gets one JSON object: ``{"kl_mean": <mean over tokens of KL(orig || quant) of the
next-token distributions, nats>, "top1_agreement": <fraction of tokens whose most likely next
token is the same>, "ppl_orig": ..., "ppl_quant": <perplexity on the text>, "tokens": <tokens
scored>, "windows": ..., "dtype": ..., "seconds": ...}``. Errors a user can cause print one
line on stderr and exit with code 2.

The source's log-probabilities are kept in memory (tokens x vocab x 4 bytes: 1 GiB for 2048
tokens of a 128k vocabulary) so that only one model is loaded at a time.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

from quantdeck.core.errors import ModelError, QuantdeckError
from quantdeck.core.models import inspect_model
from quantdeck.core.paths import CORPUS
from quantdeck.core.workers import protocol
from quantdeck.core.workers.quantize.common import quiet_libraries

PROG = "quality"  # the name on its one-line errors
DEFAULT_TEXT = CORPUS / "heldout.txt"
DEFAULT_MAX_TOKENS = 2048
DEFAULT_WINDOW = 256


class QualityError(QuantdeckError):
    """The comparison cannot run with what it was given (a user error, exit code 2)."""


def token_windows(model_dir: Path, text: str, max_tokens: int, window: int) -> list[Any]:
    """The text's first ``max_tokens`` tokens in windows of ``window``, each after a BOS."""
    import torch
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    ids = tok(text, add_special_tokens=False)["input_ids"][:max_tokens]
    if len(ids) < 2:
        raise QualityError("the held-out text has fewer than 2 tokens")
    bos = [tok.bos_token_id] if tok.bos_token_id is not None else []
    return [torch.tensor([bos + ids[i : i + window]]) for i in range(0, len(ids), window)]


def choose_dtype(requested: str, num_parameters: int) -> str:
    """``float32`` or ``bfloat16`` for ``--dtype`` (``auto``: float32 if it fits easily)."""
    if requested != "auto":
        return requested
    import psutil

    fits = 4 * num_parameters < 0.4 * psutil.virtual_memory().available
    return "float32" if fits else "bfloat16"


def load_model(path: Path, dtype: str) -> Any:
    """Load a model folder with transformers on the CPU, unquantized parts in ``dtype``."""
    import torch
    from transformers import AutoModelForCausalLM

    try:
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=getattr(torch, dtype), device_map="cpu"
        )
    except ImportError as e:
        raise QualityError(f"{path}: cannot load ({e})") from None
    except (OSError, ValueError, KeyError, RuntimeError) as e:
        msg = str(e).strip().splitlines()
        raise ModelError(
            f"{path}: cannot load ({type(e).__name__}: {msg[0] if msg else ''})"
        ) from None
    return model.eval()


def log_probs(model: Any, windows: list[Any]) -> list[Any]:
    """Per window: float32 log-probabilities of the next token at every position but the last
    (position p predicts token p+1, so with a BOS first every text token is predicted)."""
    import torch

    out = []
    with torch.inference_mode():
        for w in windows:
            logits = model(input_ids=w, use_cache=False).logits[0, :-1].float()
            out.append(torch.log_softmax(logits, dim=-1))
    return out


def compare(
    orig: Path, quant: Path, text_path: Path, max_tokens: int, window: int, dtype: str = "auto"
) -> dict[str, Any]:
    """Run both models over the text; return the figures."""
    t0 = time.monotonic()
    info = inspect_model(orig)  # one-line errors for missing / corrupt folders, before loading
    inspect_model(quant)
    dtype = choose_dtype(dtype, info.num_parameters)
    try:
        text = text_path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise QualityError(f"{text_path}: cannot read ({e})") from None
    quiet_libraries()
    windows = token_windows(orig, text, max_tokens, window)
    targets = [w[0, 1:] for w in windows]  # token p+1 is the target of position p

    model = load_model(orig, dtype)
    lp_orig = log_probs(model, windows)
    del model
    model = load_model(quant, dtype)
    lp_quant = log_probs(model, windows)
    del model

    kl_sum = nll_o = nll_q = 0.0
    agree = n = 0
    for lo, lq, tgt in zip(lp_orig, lp_quant, targets, strict=True):
        kl_sum += float((lo.exp() * (lo - lq)).sum())
        agree += int((lo.argmax(-1) == lq.argmax(-1)).sum())
        nll_o -= float(lo.gather(-1, tgt[:, None]).sum())
        nll_q -= float(lq.gather(-1, tgt[:, None]).sum())
        n += int(tgt.shape[0])
    return {
        "kl_mean": kl_sum / n,
        "top1_agreement": agree / n,
        "ppl_orig": math.exp(nll_o / n),
        "ppl_quant": math.exp(nll_q / n),
        "tokens": n,
        "windows": len(windows),
        "dtype": dtype,
        "seconds": round(time.monotonic() - t0, 2),
    }


def fail(message: object) -> NoReturn:
    """One error line on stderr, exit code 2."""
    protocol.fail(PROG, message)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = protocol.OneLineParser(prog=PROG, description=__doc__.split("\n")[0])
    parser.add_argument("orig", type=Path, help="the unquantized model folder")
    parser.add_argument("quant", type=Path, help="the converted model folder")
    parser.add_argument("--text", type=Path, default=DEFAULT_TEXT, help="held-out text file")
    parser.add_argument(
        "--max-tokens", type=int, default=DEFAULT_MAX_TOKENS, help="tokens of the text to score"
    )
    parser.add_argument(
        "--window", type=int, default=DEFAULT_WINDOW, help="tokens per forward pass (after BOS)"
    )
    parser.add_argument(
        "--dtype",
        choices=("auto", "float32", "bfloat16"),
        default="auto",
        help="compute dtype of the unquantized parts",
    )
    args = parser.parse_args(argv)
    if args.max_tokens < 2:
        fail(f"--max-tokens must be at least 2, got {args.max_tokens}")
    if args.window < 1:
        fail(f"--window must be at least 1, got {args.window}")
    try:
        result = compare(args.orig, args.quant, args.text, args.max_tokens, args.window, args.dtype)
    except QuantdeckError as e:
        fail(str(e))
    except MemoryError:
        fail("out of memory while comparing")
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
