"""Models: the built-in demo model, inspecting a folder, the model library."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from quantdeck.cli._common import AddCommand, add_engine, engine_from, human_bytes, print_json
from quantdeck.core.events import Event, ProgressEvent


def cmd_demo_model(ns: argparse.Namespace) -> int:
    from quantdeck.core.models import default_demo_dir, ensure_demo_model

    target = Path(ns.dir) if ns.dir else default_demo_dir()

    def progress(ev: Event) -> None:
        if ns.json_events:
            print(json.dumps(ev.to_json()), flush=True)
        elif isinstance(ev, ProgressEvent):
            print(
                f"\r{ev.stage:>10} {ev.pct:5.1f}%",
                end="",
                file=sys.stderr,
                flush=True,
            )

    path = ensure_demo_model(target, on_progress=progress, force=ns.force, python=engine_from(ns))
    if not ns.json_events:
        print(file=sys.stderr)
        print(path)
    return 0


def cmd_demo_lora(ns: argparse.Namespace) -> int:
    from quantdeck.core.models import default_demo_dir, make_demo_adapter

    base = Path(ns.base) if ns.base else default_demo_dir()
    target = Path(ns.dir) if ns.dir else base.parent / "quantdeck-demo-lora"
    print(make_demo_adapter(target, base))
    return 0


def cmd_inspect(ns: argparse.Namespace) -> int:
    from quantdeck.core.models import inspect_model

    info = inspect_model(ns.path)
    if ns.json:
        print_json(info.to_json())
        return 0
    q = info.quantization
    rows = [
        ("path", info.path),
        ("architecture", info.architecture),
        ("format", info.badge + (f" ({q.method}, {q.scheme}, group {q.group_size})" if q else "")),
        ("parameters", f"{info.num_parameters:,}"),
        ("weights", human_bytes(info.weights_bytes)),
        ("layers / hidden", f"{info.num_layers} / {info.hidden_size}"),
        (
            "heads / kv heads / head dim",
            f"{info.num_attention_heads} / {info.num_kv_heads} / {info.head_dim}",
        ),
        ("vocab", f"{info.vocab_size:,}"),
        ("max positions", str(info.max_position_embeddings)),
        ("KV per token", human_bytes(info.kv_bytes_per_token())),
    ]
    for k, v in rows:
        print(f"{k:>28}: {v}")
    return 0


def cmd_models(ns: argparse.Namespace) -> int:
    from quantdeck.core.models import scan_library

    entries = scan_library(ns.folders, hf_cache=not ns.no_hf_cache)
    if ns.json:
        print_json([e.to_json() for e in entries])
        return 0
    for e in entries:
        if e.adapter:
            print(
                f"{e.badge:>8}  {'':9}  {e.source:8}  {e.name}  {e.path}  "
                f"(adapter of {e.base_model or 'an unnamed base'})"
            )
        elif e.info:
            print(
                f"{e.info.badge:>8}  {e.info.num_parameters / 1e9:8.3f}B  {e.source:8}  "
                f"{e.name}  {e.path}"
            )
        else:
            print(f"{'?':>8}  {'':9}  {e.source:8}  {e.name}  ({e.error})")
    return 0


def register(add: AddCommand) -> None:
    sp = add("demo-model", cmd_demo_model, "build the built-in tiny demo model")
    sp.add_argument(
        "dir",
        nargs="?",
        help="target folder (default: the user data dir); anything there other than an "
        "earlier demo build is refused and left as it is",
    )
    sp.add_argument("--force", action="store_true", help="rebuild a complete demo build")
    sp.add_argument("--json-events", action="store_true", help="print JSON progress lines")
    add_engine(sp, "trains it (it needs torch and transformers)")

    sp = add(
        "demo-lora",
        cmd_demo_lora,
        "make a small LoRA adapter (rank 8, q_proj/v_proj, random weights) for the demo model",
    )
    sp.add_argument(
        "dir",
        nargs="?",
        help="target folder (default: quantdeck-demo-lora beside the base model); anything "
        "there other than an earlier adapter Quantdeck made is refused",
    )
    sp.add_argument(
        "--base", metavar="PATH", help="the base model folder (default: the demo model)"
    )

    sp = add("inspect", cmd_inspect, "facts about a model folder (no weights loaded)")
    sp.add_argument("path")
    sp.add_argument("--json", action="store_true")

    sp = add("models", cmd_models, "models in folders and the Hugging Face cache")
    sp.add_argument("folders", nargs="*")
    sp.add_argument("--no-hf-cache", action="store_true")
    sp.add_argument("--json", action="store_true")
