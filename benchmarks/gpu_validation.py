"""Validate launches end to end with Quantdeck's own CLI: plan, serve (recorded), bench, stop.

    python benchmarks/gpu_validation.py --root MODELS --out RESULTS [--configs a,b,...]

For each configuration: ``quantdeck plan --json`` (the prediction), ``quantdeck serve
--json-events --record`` (the launch, its events and telemetry recording), ``quantdeck bench``
at batch 1 (128 in / 256 out, 8 prompts) and at 64 concurrent (512 in / 128 out, 256 prompts),
then SIGINT. Writes RESULTS/NAME/{plan.json,events.jsonl,record.jsonl,b1.json,c64.json} and
RESULTS/summary.json with the figures docs/gpu-validation.md reports: planner KV tokens vs
vLLM's, the kernel and attention backend the log names, ready time, NVML peaks, throughput.

Model folders under ROOT: ``bf16``, ``gptq``, ``awq`` (shared/gpu/random_llama.py writes them),
``fp8``, ``w8a8``, ``bnb-nf4`` (``quantdeck quantize ROOT/bf16 --method fp8|w8a8|bnb-nf4``)
where present. ``--demo`` runs the CPU
configurations on the demo model instead (a dry run of this script on a machine without GPU).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from quantdeck.core.events import FactEvent, StateEvent, from_json

COMMON = ["--gpu-memory-utilization", "0.85", "--max-model-len", "2048"]
NGRAM = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}'
CONFIGS: dict[str, tuple[str, list[str]]] = {
    "bf16-graphs": ("bf16", []),
    "bf16-eager": ("bf16", ["--enforce-eager"]),
    "fp8-inflight-graphs": ("bf16", ["--quantization", "fp8"]),
    "fp8-converted-graphs": ("fp8", []),
    "bnb4-graphs": ("bf16", ["--quantization", "bitsandbytes"]),
    "bnb4-eager": ("bf16", ["--quantization", "bitsandbytes", "--enforce-eager"]),
    "gptq-graphs": ("gptq", []),
    "awq-graphs": ("awq", []),
    # checkpoints written by Quantdeck's own jobs (`quantdeck quantize ROOT/bf16 --method ...`)
    "w8a8-converted-eager": ("w8a8", ["--enforce-eager"]),
    "bnb4-converted-eager": ("bnb-nf4", ["--enforce-eager"]),
    "w8a8-converted-graphs": ("w8a8", []),
    "bnb4-converted-graphs": ("bnb-nf4", []),
    # speculative decoding (issue 33): n-gram prompt lookup, CUDA graphs
    "bf16-graphs-ngram": ("bf16", ["--speculative-config", NGRAM]),
    "fp8-inflight-graphs-ngram": ("bf16", ["--quantization", "fp8", "--speculative-config", NGRAM]),
}
DEMO = {"demo-eager": ("demo", ["--enforce-eager", "--kv-cache-memory-bytes", "128M"])}
LOADS = {
    "b1": ["--concurrency", "1", "--num-prompts", "8", "--input-len", "128", "--output-len", "256"],
    "c64": [
        "--concurrency",
        "64",
        "--num-prompts",
        "256",
        "--input-len",
        "512",
        "--output-len",
        "128",
    ],
}
DEMO_LOADS = {
    "b1": ["--concurrency", "1", "--num-prompts", "4", "--input-len", "64", "--output-len", "32"],
    "c64": ["--concurrency", "8", "--num-prompts", "16", "--input-len", "64", "--output-len", "32"],
}


def quantdeck(*args: str) -> list[str]:
    return [sys.executable, "-m", "quantdeck.cli", *args]


def wait_for(events: Path, proc: subprocess.Popen[bytes], timeout: float) -> dict[str, Any]:
    """Read the serve events until ready or crashed; returns the facts seen."""
    facts: dict[str, Any] = {}
    t0 = time.time()
    state = None
    while time.time() - t0 < timeout:
        if events.exists():
            for line in events.read_text().splitlines():
                try:
                    ev = from_json(json.loads(line))
                except ValueError:
                    continue
                if isinstance(ev, FactEvent):
                    facts[ev.name] = ev.value
                elif isinstance(ev, StateEvent):
                    state = ev.state
                    if state == "crashed":
                        facts["crash"] = ev.reason
                        facts["log_tail"] = list(ev.log_tail or [])[-40:]
        if state in ("ready", "crashed") or proc.poll() is not None:
            break
        time.sleep(1.0)
    facts["state"] = state
    return facts


def spec_counters(url: str) -> dict[str, Any]:
    """vLLM's speculative-decoding counters after the loads: drafts, accepted, acceptance."""
    import httpx

    from quantdeck.core.monitor.metrics import parse_metrics

    try:
        c = parse_metrics(httpx.get(url + "/metrics", timeout=10).text).counters
    except (httpx.HTTPError, ValueError) as e:
        return {"error": str(e)}
    drafts, accepted = c.get("spec_draft_tokens", 0.0), c.get("spec_accepted_tokens", 0.0)
    return {
        "draft_tokens": drafts,
        "accepted_tokens": accepted,
        "acceptance": accepted / drafts if drafts else None,
    }


def nvml_peaks(record: Path) -> dict[str, Any]:
    util, mem, power, temp, server_mem = [], [], [], [], []
    if not record.exists():
        return {}
    for line in record.read_text().splitlines():
        try:
            ev = json.loads(line)
        except json.JSONDecodeError:
            continue
        for g in ev.get("gpus") or []:
            for lst, key in (
                (util, "utilization_pct"),
                (mem, "memory_used_bytes"),
                (power, "power_w"),
                (temp, "temperature_c"),
                (server_mem, "server_memory_bytes"),
            ):
                if g.get(key) is not None:
                    lst.append(g[key])
    return {
        "samples": len(util),
        "util_max_pct": max(util, default=None),
        "mem_used_max_gib": max(mem, default=0) / 2**30 if mem else None,
        "server_mem_max_gib": max(server_mem, default=0) / 2**30 if server_mem else None,
        "power_max_w": max(power, default=None),
        "power_min_w": min(power, default=None),
        "temp_max_c": max(temp, default=None),
    }


def run_one(
    name: str,
    model: Path,
    knobs: list[str],
    out: Path,
    loads: dict[str, list[str]],
    port: int,
    timeout: float,
) -> dict[str, Any]:
    d = out / name
    d.mkdir(parents=True, exist_ok=True)
    args = [str(model), *knobs, "--port", str(port)]
    res: dict[str, Any] = {"config": name, "model": str(model), "knobs": knobs}
    p = subprocess.run(quantdeck("plan", *args, "--json"), capture_output=True, text=True)
    (d / "plan.json").write_text(p.stdout or p.stderr)
    try:
        res["plan"] = json.loads(p.stdout)
    except json.JSONDecodeError:
        res["plan_error"] = p.stderr.strip()
    t0 = time.time()
    events = d / "events.jsonl"
    with open(events, "wb") as f:
        proc = subprocess.Popen(
            quantdeck(
                "serve",
                *args,
                "--json-events",
                "--hz",
                "2",
                "--record",
                str(d / "record.jsonl"),
                "--warmup",
                "2",
            ),
            stdout=f,
            stderr=subprocess.STDOUT,
        )
    facts = wait_for(events, proc, timeout)
    res["facts"] = {k: v for k, v in facts.items() if k != "log_tail"}
    res["ready_wall_s"] = round(time.time() - t0, 1)
    if facts.get("state") == "ready":
        time.sleep(3)  # the warm-up requests
        url = f"http://127.0.0.1:{port}"
        for load, largs in loads.items():
            b = subprocess.run(
                quantdeck(
                    "bench",
                    url,
                    *largs,
                    "--json",
                    str(d / f"{load}.json"),
                    "--no-save",
                    "--quiet",
                    "--label",
                    f"{name}-{load}",
                ),
                capture_output=True,
                text=True,
            )
            if b.returncode not in (0, 1) or not (d / f"{load}.json").exists():
                res[f"{load}_error"] = b.stderr.strip()[-500:]
                continue
            r = json.loads((d / f"{load}.json").read_text())
            res[load] = {
                k: r.get(k)
                for k in (
                    "completed",
                    "failed",
                    "duration",
                    "output_throughput",
                    "request_throughput",
                    "median_ttft_ms",
                    "p99_ttft_ms",
                    "median_tpot_ms",
                    "p99_tpot_ms",
                    "median_itl_ms",
                    "ended_early",
                )
            }
        if "--speculative-config" in knobs:
            res["speculative"] = spec_counters(url)
    else:
        res["log_tail"] = facts.get("log_tail")
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=90)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    res["nvml"] = nvml_peaks(d / "record.jsonl")
    plan = res.get("plan") or {}
    pred = (plan.get("plan") or plan).get("kv_cache_tokens")
    real = res["facts"].get("kv_cache_tokens")
    if pred and real:
        res["kv_tokens_planned"], res["kv_tokens_vllm"] = pred, real
        res["kv_tokens_error_pct"] = round(100.0 * (pred - real) / real, 2)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, help="folder with bf16/ gptq/ awq/ fp8/ models")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--port", type=int, default=8011)
    ap.add_argument("--timeout", type=float, default=420.0, help="s to wait for ready")
    ap.add_argument("--demo", type=Path, help="the demo model (CPU dry run)")
    ap.add_argument("--b1-prompts", type=int, help="prompts of the batch-1 load (default 8)")
    ns = ap.parse_args()
    ns.out.mkdir(parents=True, exist_ok=True)
    summary_path = ns.out / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    table, loads = (DEMO, DEMO_LOADS) if ns.demo else (CONFIGS, LOADS)
    if ns.b1_prompts:
        b1 = loads["b1"]
        loads = {
            **loads,
            "b1": [
                *b1[: b1.index("--num-prompts") + 1],
                str(ns.b1_prompts),
                *b1[b1.index("--num-prompts") + 2 :],
            ],
        }
    names = list(table) if ns.demo else ns.configs.split(",")
    for name in names:
        sub, knobs = table[name]
        model = ns.demo if ns.demo else ns.root / sub
        if not (model / "config.json").exists():
            summary[name] = {"config": name, "skipped": f"no model at {model}"}
            continue
        t = time.time()
        res = run_one(
            name, model, knobs if ns.demo else [*COMMON, *knobs], ns.out, loads, ns.port, ns.timeout
        )
        res["total_s"] = round(time.time() - t, 1)
        summary[name] = res
        summary_path.write_text(json.dumps(summary, indent=1, default=str))
        print(
            json.dumps(
                {
                    k: res.get(k)
                    for k in (
                        "config",
                        "total_s",
                        "ready_wall_s",
                        "kv_tokens_error_pct",
                        "b1",
                        "c64",
                    )
                },
                default=str,
            ),
            flush=True,
        )
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
