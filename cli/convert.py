"""Conversion: quantize a model, compare it with its source."""

from __future__ import annotations

import argparse
import json
import sys

from quantdeck.cli._common import (
    AddCommand,
    add_engine,
    engine_from,
    human_bytes,
    print_json,
    until_signal,
)
from quantdeck.core.errors import QuantdeckError
from quantdeck.core.events import Event, ProgressEvent


def serving_note(method: str, python: str) -> None:
    """Before the job: a result the engine cannot serve is said (the conversion itself runs:
    the fix can come after)."""
    from quantdeck.core.models import CONVERSION_METHODS
    from quantdeck.core.runtime import EngineEnv

    if CONVERSION_METHODS[method].quant_method != "bitsandbytes":
        return
    try:
        problem = EngineEnv(python).bnb_problem()
    except QuantdeckError:
        return  # no vLLM there: the job says what it needs
    if problem is not None:
        print(f"quantdeck: note: the result will not serve here: {problem}", file=sys.stderr)


def cmd_quantize(ns: argparse.Namespace) -> int:
    import threading

    from quantdeck.core.convert import QuantSpec, run_job

    spec = QuantSpec(
        src=ns.src,
        method=ns.method,
        out=ns.out,
        calib=ns.calib,
        samples=ns.samples,
        seq_len=ns.seq_len,
    )
    serving_note(ns.method, engine_from(ns))
    cancel = threading.Event()
    stops = until_signal(cancel)

    def show(ev: Event) -> None:
        if ns.json_events:
            print(json.dumps(ev.to_json(), default=str), flush=True)
        elif isinstance(ev, ProgressEvent):
            layer = f" layer {ev.layer}/{ev.layers}" if ev.layer else ""  # the quantizer's
            print(
                f"\r{ev.stage:>10}{layer} {ev.pct:5.1f}%   ",
                end="",
                file=sys.stderr,
                flush=True,
            )

    try:
        result = run_job(spec, show, cancel=cancel, python=engine_from(ns))
    except QuantdeckError as e:
        if stops.signum is None:
            raise
        print(f"\nquantdeck: {e}", file=sys.stderr)  # cancelled: 128 + the signal's number
        return stops.exit_code(e.exit_code)
    if not ns.json_events:
        print(file=sys.stderr)
        print(
            f"{result.out}  {result.quant_method} {result.scheme}  "
            f"{human_bytes(result.bytes)} (from {human_bytes(result.source_bytes)}) "
            f"in {result.seconds:.1f} s"
        )
    return 0


def cmd_compare(ns: argparse.Namespace) -> int:
    from quantdeck.core.convert import compare_quality

    result = compare_quality(
        ns.orig, ns.quant, text=ns.text, max_tokens=ns.max_tokens, python=engine_from(ns)
    )
    if ns.json:
        print_json(result)
    else:
        print(
            f"KL(orig||quant) {result['kl_mean']:.5f} nats · top-1 agreement "
            f"{result['top1_agreement']:.1%} · perplexity {result['ppl_orig']:.2f} -> "
            f"{result['ppl_quant']:.2f} over {result['tokens']} tokens"
        )
    return 0


def register(add: AddCommand) -> None:
    from quantdeck.core.convert import METHODS

    sp = add("quantize", cmd_quantize, "convert a model: " + ", ".join(METHODS))
    sp.add_argument("src", help="the unquantized model folder (never modified)")
    sp.add_argument("--method", required=True, choices=list(METHODS))
    sp.add_argument("--out", required=True, help="target folder (must not exist or be empty)")
    add_engine(sp, "converts (it needs torch and the method's library)")
    sp.add_argument("--calib", help="calibration text (.txt or .jsonl with a 'text' field)")
    sp.add_argument("--samples", type=int, default=64)
    sp.add_argument("--seq-len", type=int, default=256)
    sp.add_argument("--json-events", action="store_true")

    sp = add("compare", cmd_compare, "quality of a converted model against its source")
    sp.add_argument("orig")
    sp.add_argument("quant")
    add_engine(sp, "runs both models (it needs torch and transformers)")
    sp.add_argument("--text", help="held-out text (default: the shipped held-out set)")
    sp.add_argument("--max-tokens", type=int, default=2048)
    sp.add_argument("--json", action="store_true")
