"""LoRA adapters on a running server: ``quantdeck lora load|unload|list URL …``."""

from __future__ import annotations

import argparse
import os

from quantdeck.cli._common import AddCommand, add_client_options, client_from, print_json


def _key(ns: argparse.Namespace) -> str | None:
    """--api-key, else VLLM_API_KEY from the environment (a key kept out of argv)."""
    return ns.api_key or os.environ.get("VLLM_API_KEY") or None


def cmd_lora(ns: argparse.Namespace) -> int:
    from quantdeck.core.runtime import lora

    client_from(ns)
    key = _key(ns)
    if ns.action == "load":
        sent = lora.load_adapter(ns.url, ns.name, ns.path, api_key=key)
        print(f"loaded {ns.name} ({sent})")
    elif ns.action == "unload":
        lora.unload_adapter(ns.url, ns.name, api_key=key)
        print(f"unloaded {ns.name}")
    else:
        adapters = lora.loaded_adapters(ns.url, api_key=key)
        requests = lora.lora_requests(ns.url, api_key=key)
        if ns.json:
            print_json(
                {
                    "adapters": [a.to_json() for a in adapters],
                    "requests": requests.to_json() if requests else None,
                }
            )
            return 0
        for a in adapters:
            print(f"{a.name}  on {a.base}  {a.path or ''}".rstrip())
        if requests and (requests.running or requests.waiting):
            print(
                f"running: {', '.join(requests.running) or '-'}; waiting: "
                f"{', '.join(requests.waiting) or '-'}"
            )
    return 0


def register(add: AddCommand) -> None:
    sp = add("lora", cmd_lora, "load, unload or list LoRA adapters on a running server")
    sub = sp.add_subparsers(dest="action", required=True, metavar="ACTION")
    pa = sub.add_parser("load", help="load an adapter folder under NAME (the server's path)")
    pa.add_argument("url")
    pa.add_argument("name")
    pa.add_argument("path")
    add_client_options(pa)
    pa = sub.add_parser("unload", help="unload the adapter NAME")
    pa.add_argument("url")
    pa.add_argument("name")
    add_client_options(pa)
    pa = sub.add_parser("list", help="the adapters loaded, and those in running requests")
    pa.add_argument("url")
    pa.add_argument("--json", action="store_true")
    add_client_options(pa)
