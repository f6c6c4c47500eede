"""The planner against vLLM on each KV layer family, served for real with dummy weights:
``quantdeck plan --json`` (the prediction) and ``quantdeck serve --load-format dummy`` (what
vLLM makes of the same launch: its "KV cache size" tokens, its blocks on /metrics, its
max concurrency), side by side.

    python benchmarks/planner_families.py --root DIR --tokenizer-from MODEL \\
        [--families gemma3-8b,gpt-oss-8b,granite-h-8b] [--extra "--max-model-len 8192 ..."] \\
        [--json OUT]

The 8B-scale checkpoints are config.json plus safetensors headers whose data are sparse holes
(tests/ckpt.py's writer): the planner reads the headers, vLLM's dummy loader never reads the
data, so a 16 GB checkpoint takes no disk and no minute to write. Their tensors are the ones the
Hugging Face classes name (the weights the planner counts); the tokenizer comes from
``--tokenizer-from`` (the server needs one; its vocabulary does not matter to the figures).
``--families`` also takes the tests' tiny ones (``tiny:gemma3``, ``tiny:gpt-oss``, ... as in
tests/ckpt.py), for a CPU run with ``--extra "--kv-cache-memory-bytes 64M"``.
Prints one line per family and, with ``--json``, every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from ckpt import FAMILIES, write_checkpoint
from ckpt_scaled import SCALED

from quantdeck.core.runtime.server import free_port

TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "generation_config.json",
)
BLOCKS = re.compile(r'^vllm:cache_config_info\{[^}]*num_gpu_blocks="(\d+)"', re.M)


def write(root: Path, family: str, tokenizer_from: Path) -> Path:
    folder = root / family.replace(":", "-")
    if family.startswith("tiny:"):
        cfg = FAMILIES[family.split(":", 1)[1]]
        embed = [("model.embed_tokens.weight", "BF16", [cfg["vocab_size"], cfg["hidden_size"]])]
        write_checkpoint(folder, cfg, tensors=embed)
    else:
        cfg, tensors = SCALED[family]
        write_checkpoint(folder, cfg, tensors=tensors(cfg), shards=4)
    for name in TOKENIZER_FILES:
        if (tokenizer_from / name).exists():
            shutil.copy(tokenizer_from / name, folder / name)
    return folder


def quantdeck(*args: str) -> list[str]:
    return [sys.executable, "-m", "quantdeck.cli", *args]


def measure(folder: Path, extra: list[str], out: Path, timeout: float) -> dict[str, Any]:
    knobs = ["--load-format", "dummy", *extra]
    res: dict[str, Any] = {"model": str(folder), "knobs": knobs}
    p = subprocess.run(
        quantdeck("plan", str(folder), *knobs, "--json"), capture_output=True, text=True
    )
    if p.returncode not in (0, 1):
        res["plan_error"] = p.stderr.strip()[-400:]
        return res
    doc = json.loads(p.stdout)
    res["plan"] = doc.get("plan") or doc
    port = free_port()
    events = out / f"{folder.name}-serve.jsonl"
    with open(events, "w", encoding="utf-8") as f:
        proc = subprocess.Popen(
            quantdeck("serve", str(folder), *knobs, "--port", str(port), "--json-events"),
            stdout=f,
            stderr=subprocess.STDOUT,
        )
    facts: dict[str, Any] = {}
    state = None
    t0 = time.time()
    try:
        while time.time() - t0 < timeout and proc.poll() is None:
            facts, state = {}, None
            for line in events.read_text(errors="replace").splitlines():
                if line.startswith("{"):
                    ev = json.loads(line)
                    if ev.get("event") == "fact":
                        facts[ev["name"]] = ev["value"]
                    elif ev.get("event") == "state":
                        state = ev.get("state")
            if state in ("ready", "crashed", "stopped"):
                break
            time.sleep(2)
        res["state"], res["ready_s"] = state, round(time.time() - t0, 1)
        if state == "ready":
            text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=30).text
            m = BLOCKS.search(text)
            res["vllm_blocks"] = int(m.group(1)) if m else None
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(90)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    keep = ("kv_cache_tokens", "max_concurrency", "kv_cache_gib", "weights_gib")
    res["vllm"] = {k: facts.get(k) for k in (*keep, "activation_peak_gib", "non_torch_gib")}
    if state != "ready":
        tail = [ln for ln in events.read_text(errors="replace").splitlines() if "rror" in ln]
        res["error"] = " | ".join(tail[-3:])[-600:]
    return res


def line(family: str, r: dict[str, Any]) -> str:
    plan, v = r.get("plan") or {}, r.get("vllm") or {}
    if "error" in r or "plan_error" in r:
        return f"{family}: {r.get('plan_error') or r.get('state')}: {r.get('error', '')[:300]}"
    tokens, real = plan.get("kv_cache_tokens"), v.get("kv_cache_tokens")
    err = 100.0 * (tokens - real) / real if tokens and real else float("nan")
    kinds = ", ".join(f"{g['kind']} x{g['layers']}" for g in plan.get("groups") or [])
    return (
        f"{family}: tokens planned {tokens} vs vLLM {real} ({err:+.2f} %); blocks planned "
        f"{plan.get('num_blocks')} vs vLLM {r.get('vllm_blocks')}; max concurrency planned "
        f"{plan.get('max_concurrency', 0):.2f} vs vLLM {v.get('max_concurrency')}; weights "
        f"planned {plan.get('weights_bytes', 0) / 2**30:.2f} GiB vs vLLM {v.get('weights_gib')}; "
        f"KV planned {plan.get('kv_cache_bytes', 0) / 2**30:.2f} GiB vs vLLM "
        f"{v.get('kv_cache_gib')}; groups: {kinds}; ready in {r.get('ready_s')} s"
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, required=True, help="where the checkpoints go")
    ap.add_argument("--tokenizer-from", type=Path, required=True, help="a model folder")
    ap.add_argument("--families", default=",".join(SCALED), help=f"({','.join(SCALED)})")
    ap.add_argument("--extra", default="", help="launch knobs for every family")
    ap.add_argument("--timeout", type=float, default=600, help="s to wait for ready (600)")
    ap.add_argument("--json", type=Path, help="every figure, as JSON")
    ns = ap.parse_args()
    out = ns.json.parent if ns.json else ns.root
    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {}
    failed = 0
    for family in [f for f in ns.families.split(",") if f]:
        folder = write(ns.root, family, ns.tokenizer_from)
        results[family] = r = measure(folder, ns.extra.split(), out, ns.timeout)
        failed += r.get("state") != "ready"
        print(line(family, r), flush=True)
        if ns.json:
            ns.json.write_text(json.dumps(results, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(main())
