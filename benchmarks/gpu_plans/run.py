"""The GPU runner: every measurement of a GPU session, as named steps with parameters.

    python3 benchmarks/gpu_plans/run.py [--base DIR] [--results DIR] [--dry-run] \\
        STEP [OPTIONS] [+ STEP [OPTIONS] ...]

``benchmarks/gpu_host.sh setup|next STEP ...`` starts it on the lent GPU host, where Quantdeck
is installed from its wheel (see there); ``--dry-run`` prints the commands a run would make,
on any machine. ``+`` separates steps; they run one after the other. ``STEP --help`` lists a
step's options. Each step writes ``RESULTS/TAG.txt`` (its output) and, where the script keeps
them, ``RESULTS/TAG/`` (every run's JSON); a tag taken already gets ``-2``, ``-3``, ...

Steps:

- ``validation [--configs A,B,...] [--b1-prompts N]``: Llama-3-8B-shaped random checkpoints
  (``random_llama.py``: bf16, and gptq / awq where a config serves them), one NVML snapshot
  timing, the /metrics parse timing, the conversions the configs need, run by Quantdeck's own
  jobs (``fp8-converted-*`` -> ``quantdeck quantize --method fp8``, ``w8a8-converted-*`` ->
  ``w8a8``, ``bnb4-converted-*`` -> ``bnb-nf4``) in the background, then
  ``benchmarks/gpu_validation.py`` for every config: the ones that need no conversion while the
  conversions run, the others once they are done. Default configs: the first run's eight.
- ``fidelity [--concurrency N --num-prompts N --input-len N --output-len N] [--rounds N]
  [--same-prompts | --corpus]``: ``benchmarks/bench_fidelity.py``, ``quantdeck bench`` against
  ``vllm bench serve`` on one server, ABBA rounds (default c=16, 128 prompts, 512 / 128, 6
  rounds).
- ``random-check [--count N]``: do ``quantdeck bench --dataset-name random``'s prompts match
  this host's vLLM ``RandomDataset`` prompt for prompt (seed 0, 512 / 128)?
- ``overhead [--rounds N --concurrency N --requests N --max-tokens N]``:
  ``benchmarks/monitoring_overhead.py``, 2 Hz monitoring against none on one server, and the
  CPU one sample costs (default 8 rounds, c=16, 64 requests, 128 tokens).
- ``tune [--ttft-ms X --tpot-ms Y] [--space KNOB=V1,V2 ...] [--concurrency N ...]``:
  ``benchmarks/tune_goal.py``, ``quantdeck tune`` coordinate search against the exhaustive grid
  (default: the third run's 20-point space, 64 concurrent, 128 prompts, 512 / 128, p99 TTFT
  1000 ms, p99 TPOT 50 ms).
- ``planner [--max-model-len N] [--families A,B]``: ``benchmarks/planner_families.py``, the
  planner against vLLM on 8B-scale Gemma-3-like, gpt-oss-like and Granite-4.0-H-like
  checkpoints (headers only, ``--load-format dummy``), tokens, blocks and concurrency.
- ``trace [--graphs] [--steps N]``: ``quantdeck serve --profiler`` and ``quantdeck trace``.
- ``kv-overhead [--rounds N ...]``: ``benchmarks/kv_events_overhead.py``, KV events on vs off.
- ``metrics-parse``, ``nvml``: ``benchmarks/metrics_parse.py``, ``benchmarks/nvml_snapshot.py``.
- ``client-cost [--requests N --rounds N --concurrency N ...]``: ``benchmarks/client_cost.py``.
- ``trial [--shape 1b|8b --share F --candidate JSON --goal G --concurrency N ...]``:
  ``benchmarks/live_trial.py`` on GPU 0: a fleet of one (eager, sleep mode, ``--share`` of the
  GPU) behind the router under a closed-loop load, a live trial of the candidate (default CUDA
  graphs) with NVML's readings beside the admission's figures, then ``fleet undo`` (the
  incumbent woken from sleep), timed.
- ``ray [--ray-port P --port P --startup-s S]``: a loopback Ray head with the one GPU (``ray
  start --head``, Ray from ``gpu_host.sh stash-ray``), the ray probe, ``quantdeck plan`` and
  ``quantdeck serve`` with ``--distributed-executor-backend ray --ray-address 127.0.0.1:P``, a
  ``quantdeck bench`` (c=4, 32 prompts), whether vLLM's log shows the Ray executor; ``ray stop``.

``fidelity``, ``random-check``, ``overhead`` and ``tune`` serve a Llama-3.2-1B-shaped random
checkpoint (``--shape 8b``: the 8B) with ``--max-model-len 2048 --gpu-memory-utilization 0.85``,
eager unless ``--graphs``. The runs in docs/gpu-validation.md, as this runner's arguments:

    validation                                                        # first run
    validation --configs w8a8-converted-eager,bnb4-converted-eager --b1-prompts 4 \\
      + fidelity --rounds 2 + overhead --rounds 4                     # second run
    validation --configs w8a8-converted-graphs,bnb4-converted-graphs + overhead
    tune                                                              # third run
    fidelity --rounds 4 --concurrency 16 + fidelity --rounds 4 --concurrency 1 \\
      --num-prompts 32 --output-len 64 + client-cost --requests 100 --rounds 2 \\
      --concurrency 1 16                                              # fourth run
    fidelity --rounds 2 --concurrency 1 --num-prompts 12 --output-len 64 --same-prompts
    random-check + fidelity + fidelity --rounds 4 --concurrency 1 --num-prompts 24 \\
      --output-len 64                                                 # fifth run
    fidelity --rounds 8 + fidelity --rounds 5 --concurrency 1 --num-prompts 24 \\
      --output-len 64                                                 # sixth run
    fidelity --rounds 8 --concurrency 1 --num-prompts 32 --output-len 64   # seventh run
    fidelity --graphs --rounds 14 --concurrency 1 --num-prompts 32 --output-len 64  # eighth
    metrics-parse + overhead --rounds 1 --requests 32 --max-tokens 64     # the scrape check
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BENCH = REPO / "benchmarks"
PY = sys.executable
COMMON = "--max-model-len 2048 --gpu-memory-utilization 0.85"
# random_llama.py writes the Llama-3-8B shape; the 1B is the same script with its shape line
# changed (Llama-3.2-1B's shape, untied head).
SHAPE_LINE = re.compile(r"^H, L, NH, NKV, I, V, HD = .*$", re.M)
SHAPES = {"8b": None, "1b": "H, L, NH, NKV, I, V, HD = 2048, 16, 32, 8, 8192, 128256, 64"}
# gpu_validation.py's configs, by the checkpoint folder they serve (the rest serve bf16)
CONVERTED = {"fp8-converted": "fp8", "w8a8-converted": "w8a8", "bnb4-converted": "bnb-nf4"}
FIRST_RUN = (
    "bf16-graphs,bf16-eager,fp8-inflight-graphs,fp8-converted-graphs,gptq-graphs,awq-graphs,"
    "bnb4-graphs,bnb4-eager"
)
# gpu_validation.py's CONFIGS (not imported: a dry run needs no Quantdeck installed)
CONFIGS = (
    FIRST_RUN.split(",")
    + [f"{m}-converted-{mode}" for m in ("w8a8", "bnb4") for mode in ("graphs", "eager")]
    + ["bf16-graphs-ngram", "fp8-inflight-graphs-ngram"]
)


def config_list(text: str) -> str:
    unknown = [c for c in text.split(",") if c and c not in CONFIGS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown {unknown}; configs: {','.join(CONFIGS)}")
    return text


TUNE_SPACE = [
    "max_num_seqs=16,32,64,128,256",
    "max_num_batched_tokens=2048,8192",
    "enable_chunked_prefill=true,false",
]
# does `quantdeck bench --dataset-name random` send vLLM's RandomDataset, prompt for prompt?
RANDOM_CHECK = """
import sys
from transformers import AutoTokenizer
from vllm.benchmarks.datasets import RandomDataset
from vllm.tokenizers import get_tokenizer
from quantdeck.core.bench.datasets import random_dataset, tokenizer_vocab
path, n = sys.argv[1], int(sys.argv[2])
theirs = [r.prompt for r in RandomDataset(random_seed=0).sample(
    get_tokenizer(path), n, input_len=512, output_len=128)]
hf = AutoTokenizer.from_pretrained(path)
class Local:  # the server's /tokenize and /detokenize, as the same tokenizer answers them
    def count(self, text): return len(hf(text)["input_ids"])
    def encode(self, text, special): return hf.encode(text, add_special_tokens=special)
    def decode(self, ids): return hf.decode(ids)
ours = [r.prompt for r in random_dataset(Local(), tokenizer_vocab(path), 512, 128, n, n, 0)]
print(f"random prompts: {sum(a == b for a, b in zip(ours, theirs))} of {len(theirs)} the same "
      "as this host's vLLM's")
"""


class Runner:
    """Runs (or, dry, prints) the commands of the steps; keeps the session's clock."""

    def __init__(self, base: Path, results: Path, dry: bool) -> None:
        self.base, self.results, self.dry = base, results, dry
        self.t0 = time.time()
        self.background: list[subprocess.Popen[bytes]] = []
        self.failed: list[str] = []

    def stamp(self, what: str) -> None:
        print(f"[{time.time() - self.t0:.0f} s] {what}", flush=True)

    def tag(self, name: str) -> str:
        """``name``, or ``name-2``, ``name-3``... if an earlier step of the session took it."""
        tag, n = name, 1
        while (self.results / f"{tag}.txt").exists():
            n += 1
            tag = f"{name}-{n}"
        return tag

    def run(self, cmd: Sequence[str], out: Path | None = None, *, cwd: Path | None = None) -> int:
        """Run ``cmd``, its output to the console and (``out``) to a file, as ``| tee`` does."""
        print("$ " + shlex.join(str(c) for c in cmd) + (f" > {out}" if out else ""), flush=True)
        if self.dry:
            if out is not None:
                out.parent.mkdir(parents=True, exist_ok=True)
                out.touch()  # so that tags stay distinct in a dry run too
            return 0
        with (
            subprocess.Popen(
                [str(c) for c in cmd],
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                cwd=cwd or REPO,
                text=True,
                errors="replace",
            ) as p,
            open(out or os.devnull, "w", encoding="utf-8") as f,
        ):
            assert p.stdout is not None
            for line in p.stdout:
                sys.stdout.write(line)
                sys.stdout.flush()
                f.write(line)
                f.flush()
        if p.returncode:
            print(f"(exit code {p.returncode})", flush=True)
            self.failed.append(" ".join(Path(str(c)).name for c in cmd[1:3]))
        return p.returncode

    def start(self, cmd: Sequence[str], out: Path, env: dict[str, str]) -> None:
        """Start ``cmd`` in the background, its output to ``out`` (see ``wait``)."""
        print("$ " + shlex.join(str(c) for c in cmd) + f" > {out} &", flush=True)
        if self.dry:
            return
        with open(out, "w", encoding="utf-8") as f:
            self.background.append(
                subprocess.Popen(
                    [str(c) for c in cmd],
                    stdout=f,
                    stderr=subprocess.STDOUT,
                    cwd=REPO,
                    env={**os.environ, **env},
                )
            )

    def wait(self) -> None:
        for p in self.background:
            if p.wait():
                self.failed.append(" ".join(map(str, p.args[1:5])))
        self.background = []

    def models(self, shape: str, kinds: str) -> Path:
        """Random checkpoints of ``shape`` under BASE/models (8B) or BASE/models1b: their root.
        random_llama.py skips those already written."""
        root = self.base / ("models" if shape == "8b" else f"models{shape}")
        script = self.base / "random_llama.py"  # kept by gpu_host.sh setup
        if SHAPES[shape] is not None and not self.dry:
            shaped = self.base / f"random_llama_{shape}.py"
            shaped.write_text(SHAPE_LINE.sub(SHAPES[shape], script.read_text()))
            script = shaped
        if self.dry:
            print(f"$ {PY} {script} {root} {kinds}  # {shape} shape", flush=True)
            return root
        r = subprocess.run(
            [PY, str(script), str(root), kinds],
            cwd=self.base,
            capture_output=True,
            text=True,
        )
        lines = [ln for ln in (r.stdout + r.stderr).splitlines() if "Warning" not in ln]
        print("\n".join(lines[-4:]), flush=True)
        self.stamp(f"{shape} models written ({kinds})")
        return root


# -- steps ---------------------------------------------------------------------------------------
def _serving(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--shape", choices=sorted(SHAPES), default="1b", help="model shape (1b)")
    ap.add_argument("--graphs", action="store_true", help="CUDA graphs (default: eager)")
    ap.add_argument("--tag", help="name of the output files (default: from the options)")


def _serve_arg(r: Runner, ns: argparse.Namespace) -> str:
    model = r.models(ns.shape, "bf16") / "bf16"
    return f"{model} {COMMON}" + ("" if ns.graphs else " --enforce-eager")


def _mode(ns: argparse.Namespace) -> str:
    return f"{ns.shape}-{'graphs' if ns.graphs else 'eager'}"


def step_validation(r: Runner, ns: argparse.Namespace) -> None:
    configs = [c for c in ns.configs.split(",") if c]
    kinds = ["bf16"] + [k for k in ("gptq", "awq") if any(c.startswith(k) for c in configs)]
    root = r.models("8b", ",".join(kinds))
    r.run([PY, BENCH / "nvml_snapshot.py"], r.results / f"{r.tag('nvml_snapshot')}.txt")
    r.run([PY, BENCH / "metrics_parse.py"], r.results / f"{r.tag('metrics_parse')}.txt")
    methods = sorted({m for p, m in CONVERTED.items() if any(c.startswith(p) for c in configs)})
    # two conversions at once share the host's CPU (as the second run had them)
    env = {"OMP_NUM_THREADS": "6"} if len(methods) > 1 else {}
    for m in methods:
        if (root / m / "config.json").exists():
            print(f"{root / m}: converted already", flush=True)
            continue
        r.start(
            [PY, "-m", "quantdeck.cli", "quantize", root / "bf16", "--method", m]
            + ["--out", root / m, "--json-events"],
            r.results / f"quantize-{m}.jsonl",
            env,
        )
    later = [c for c in configs if any(c.startswith(p) for p in CONVERTED)]
    now = [c for c in configs if c not in later]
    cmd = [PY, BENCH / "gpu_validation.py", "--root", root, "--out", r.results]
    if ns.b1_prompts:
        cmd += ["--b1-prompts", str(ns.b1_prompts)]
    if now:
        r.run(cmd + ["--configs", ",".join(now)])
        r.stamp(f"launches done: {','.join(now)}")
    r.wait()
    for m in methods:
        log = r.results / f"quantize-{m}.jsonl"
        if log.exists() and log.stat().st_size:
            print(log.read_text().splitlines()[-1][:400], flush=True)
    if later:
        r.run(cmd + ["--configs", ",".join(later)])
        r.stamp(f"launches done: {','.join(later)}")


def step_fidelity(r: Runner, ns: argparse.Namespace) -> None:
    serve = _serve_arg(r, ns)
    sent = "-same" if ns.same_prompts else "-corpus" if ns.corpus else ""
    tag = r.tag(ns.tag or f"fidelity-c{ns.concurrency}{sent}-{_mode(ns)}")
    cmd = [PY, BENCH / "bench_fidelity.py", "--serve", serve, "--rounds", str(ns.rounds)]
    cmd += ["--concurrency", str(ns.concurrency), "--num-prompts", str(ns.num_prompts)]
    cmd += ["--input-len", str(ns.input_len), "--output-len", str(ns.output_len)]
    cmd += ["--same-prompts"] if ns.same_prompts else ["--corpus"] if ns.corpus else []
    r.run(cmd + ["--keep", r.results / tag], r.results / f"{tag}.txt")
    r.stamp(f"{tag} done")


def step_random_check(r: Runner, ns: argparse.Namespace) -> None:
    model = r.models(ns.shape, "bf16") / "bf16"
    tag = r.tag(ns.tag or "random-check")
    script = r.results / f"{tag}.py"
    script.write_text(RANDOM_CHECK)
    r.run([PY, script, model, str(ns.count)], r.results / f"{tag}.txt")


def step_overhead(r: Runner, ns: argparse.Namespace) -> None:
    serve = _serve_arg(r, ns)
    tag = r.tag(ns.tag or f"monitoring_overhead-{_mode(ns)}")
    cmd = [PY, BENCH / "monitoring_overhead.py", "--serve", serve, "--rounds", str(ns.rounds)]
    cmd += ["--concurrency", str(ns.concurrency), "--requests", str(ns.requests)]
    r.run(cmd + ["--max-tokens", str(ns.max_tokens)], r.results / f"{tag}.txt")
    r.stamp(f"{tag} done")


def step_tune(r: Runner, ns: argparse.Namespace) -> None:
    model = r.models(ns.shape, "bf16") / "bf16"
    tag = r.tag(ns.tag or f"tune_goal-{_mode(ns)}")
    extra = COMMON + ("" if ns.graphs else " --enforce-eager")
    cmd = [PY, BENCH / "tune_goal.py", model, "--extra", extra]
    cmd += ["--ttft-ms", str(ns.ttft_ms), "--tpot-ms", str(ns.tpot_ms), "--space", *ns.space]
    cmd += ["--concurrency", str(ns.concurrency), "--num-prompts", str(ns.num_prompts)]
    cmd += ["--input-len", str(ns.input_len), "--output-len", str(ns.output_len)]
    r.run(cmd + ["--out", r.results / tag], r.results / f"{tag}.txt")
    r.stamp(f"{tag} done")


def step_fleet(r: Runner, ns: argparse.Namespace) -> None:
    """benchmarks/fleet.py on the one GPU: two FP8 primaries and a bf16 backup of the 8B,
    each with its share of the GPU (they start one after the other)."""
    model = r.models(ns.shape, "bf16") / "bf16"
    knobs = f"--max-model-len 2048 --gpu-memory-utilization {ns.share}" + (
        "" if ns.graphs else " --enforce-eager"
    )
    tag = r.tag(ns.tag or f"fleet-{ns.shape}-{'graphs' if ns.graphs else 'eager'}")
    cmd = [PY, BENCH / "fleet.py", "--serve", f"{model} --quantization fp8 {knobs}"]
    cmd += ["--backup", f"{model} {knobs}", "--gpus", "0", "--above-ms", str(ns.above_ms)]
    cmd += ["--rate", str(ns.rate), "--prompts", str(ns.prompts), "--burst", str(ns.burst)]
    cmd += ["--pairs", str(ns.pairs), "--parts", ns.parts, "--record", r.results / f"{tag}.jsonl"]
    r.run(cmd + ["--json", r.results / f"{tag}.json"], r.results / f"{tag}.txt")
    r.stamp(f"{tag} done")


def step_trial(r: Runner, ns: argparse.Namespace) -> None:
    """benchmarks/live_trial.py on the GPU: a fleet of one instance (eager, sleep mode) behind
    the router under load, a live trial of a candidate (default: CUDA graphs) on the same GPU,
    NVML beside the admission's figures, then the promotion undone from sleep, timed."""
    model = r.models(ns.shape, "bf16") / "bf16"
    knobs = {
        "max-model-len": 2048,
        "gpu-memory-utilization": ns.share,
        "enforce-eager": True,
        "enable-sleep-mode": True,
    }
    tag = r.tag(ns.tag or f"trial-{ns.shape}")
    cmd = [PY, BENCH / "live_trial.py", "--model", model, "--gpus", "0"]
    cmd += ["--knobs", json.dumps(knobs), "--candidate", ns.candidate, "--goal", ns.goal]
    cmd += ["--aa", str(ns.aa), "--max-duration", str(ns.max_duration)]
    cmd += ["--min-requests", str(ns.min_requests), "--concurrency", str(ns.concurrency)]
    cmd += ["--undo"] if not ns.no_undo else []
    r.run(cmd + ["--json", r.results / f"{tag}.json"], r.results / f"{tag}.txt")
    r.stamp(f"{tag} done")


RAY_CLI = [PY, "-m", "ray.scripts.scripts"]  # the `ray` command (--target installs have none)
# what vLLM's log says when its Ray executor runs the model (RayDistributedExecutor, ray_utils)
RAY_EXECUTOR = re.compile(r"RayDistributedExecutor|ray_(distributed_)?executor|ray_utils|RayWorker")


def step_ray(r: Runner, ns: argparse.Namespace) -> None:
    """A loopback Ray head with the one GPU; `quantdeck plan` (which probes the cluster) and
    `quantdeck serve` with the ray backend at its address; a short `quantdeck bench`; whether
    vLLM's log shows the Ray executor; then the server and Ray stop."""
    model = r.models(ns.shape, "bf16") / "bf16"
    tag = r.tag(ns.tag or f"ray-{_mode(ns)}")
    address = f"127.0.0.1:{ns.ray_port}"
    knobs = f"{COMMON}{'' if ns.graphs else ' --enforce-eager'} --port {ns.port}"
    knobs += f" --distributed-executor-backend ray --ray-address {address}"
    head = ["start", "--head", "--port", str(ns.ray_port), "--num-gpus", "1"]
    head += ["--disable-usage-stats", "--include-dashboard=false"]
    r.run(RAY_CLI + head, r.results / f"{tag}-ray-start.txt")
    server: subprocess.Popen[bytes] | None = None
    log = r.results / f"{tag}-serve.jsonl"
    try:
        r.run(
            [PY, "-m", "quantdeck.core.workers.ray_probe", address], r.results / f"{tag}-probe.txt"
        )
        plan = [PY, "-m", "quantdeck.cli", "plan", model, *knobs.split(), "--json"]
        r.run(plan, r.results / f"{tag}-plan.json")
        serve = [PY, "-m", "quantdeck.cli", "serve", model, *knobs.split()]
        serve += ["--json-events", "--logs", "--startup-timeout", str(ns.startup_s)]
        print("$ " + shlex.join(map(str, serve)) + f" > {log} &", flush=True)
        if r.dry:
            ready = True
        else:
            with open(log, "w", encoding="utf-8") as f:
                server = subprocess.Popen(
                    [str(c) for c in serve], stdout=f, stderr=subprocess.STDOUT, cwd=REPO
                )
            ready = _wait_ready(server, log, ns.startup_s)
            r.stamp(f"server {'ready' if ready else 'not ready'}")
        if ready:
            bench = [PY, "-m", "quantdeck.cli", "bench", f"http://127.0.0.1:{ns.port}"]
            bench += ["--concurrency", "4", "--num-prompts", "32", "--no-save"]
            r.run(bench + ["--json", r.results / f"{tag}-bench.json"], r.results / f"{tag}.txt")
        else:
            r.failed.append(f"{tag}: the server did not become ready")
    finally:
        if server is not None:
            _stop(server)
        r.run(RAY_CLI + ["stop"], r.results / f"{tag}-ray-stop.txt")
    if not r.dry:
        lines = log.read_text(errors="replace").splitlines()
        seen = [ln[:300] for ln in lines if RAY_EXECUTOR.search(ln)]
        summary = f"Ray executor in vLLM's log: {'yes' if seen else 'no'} ({len(seen)} lines)"
        with open(r.results / f"{tag}.txt", "a", encoding="utf-8") as f:
            f.write("\n".join([summary, *seen[:20]]) + "\n")
        print(summary, flush=True)
        if not seen:
            r.failed.append(f"{tag}: no Ray executor in the log")
    r.stamp(f"{tag} done")


def _wait_ready(server: subprocess.Popen[bytes], log: Path, limit_s: float) -> bool:
    """Until `quantdeck serve` prints its ready state (True) or ends or runs out of time."""
    end = time.time() + limit_s
    while time.time() < end and server.poll() is None:
        if '"state": "ready"' in log.read_text(errors="replace"):
            return True
        time.sleep(2)
    return False


def _stop(server: subprocess.Popen[bytes]) -> None:
    """SIGINT, as a person would: `quantdeck serve` stops vLLM and leaves no process."""
    server.send_signal(2)
    try:
        server.wait(90)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait()


def step_planner(r: Runner, ns: argparse.Namespace) -> None:
    """benchmarks/planner_families.py: 8B-scale Gemma-3-like, gpt-oss-like and Granite-4.0-H-like
    checkpoints (headers only, dummy weights), planned and served, tokens and blocks compared."""
    tokenizer = r.models("1b", "bf16") / "bf16"
    tag = r.tag(ns.tag or "planner-families")
    extra = f"--max-model-len {ns.max_model_len} --gpu-memory-utilization 0.85"
    extra += "" if ns.graphs else " --enforce-eager"
    cmd = [PY, BENCH / "planner_families.py", "--root", r.base / "families"]
    cmd += ["--tokenizer-from", tokenizer, "--families", ns.families, "--extra", extra]
    r.run(cmd + ["--json", r.results / tag / "planner.json"], r.results / f"{tag}.txt")
    r.stamp(f"{tag} done")


def step_trace(r: Runner, ns: argparse.Namespace) -> None:
    """`quantdeck serve --profiler` of the 1B, then `quantdeck trace URL --steps N`: the CUDA
    trace's top kernels and host vs device time (eager vs CUDA graphs: one step each)."""
    model = r.models(ns.shape, "bf16") / "bf16"
    tag = r.tag(ns.tag or f"trace-{_mode(ns)}")
    knobs = f"{COMMON}{'' if ns.graphs else ' --enforce-eager'} --port {ns.port} --profiler"
    log = r.results / f"{tag}-serve.jsonl"
    serve = [PY, "-m", "quantdeck.cli", "serve", model, *knobs.split(), "--json-events"]
    print("$ " + shlex.join(map(str, serve)) + f" > {log} &", flush=True)
    if r.dry:
        return
    with open(log, "w", encoding="utf-8") as f:
        server = subprocess.Popen([str(c) for c in serve], stdout=f, stderr=subprocess.STDOUT)
    try:
        if not _wait_ready(server, log, 600):
            r.failed.append(f"{tag}: the server did not become ready")
            return
        r.stamp("server ready")
        trace = [PY, "-m", "quantdeck.cli", "trace", f"http://127.0.0.1:{ns.port}"]
        trace += ["--steps", str(ns.steps), "--requests", "4", "--max-tokens", "16"]
        r.run(trace + ["--out", r.results / tag], r.results / f"{tag}.txt")
    finally:
        _stop(server)
    r.stamp(f"{tag} done")


def step_kv_overhead(r: Runner, ns: argparse.Namespace) -> None:
    """benchmarks/kv_events_overhead.py: two servers of the 1B side by side (a share of the GPU
    each), KV events on (and ingested) against off, ABBA."""
    model = r.models(ns.shape, "bf16") / "bf16"
    tag = r.tag(ns.tag or f"kv-overhead-{_mode(ns)}")
    serve = f"{model} --max-model-len 2048 --gpu-memory-utilization 0.4"
    serve += "" if ns.graphs else " --enforce-eager"
    cmd = [PY, BENCH / "kv_events_overhead.py", "--serve", serve, "--rounds", str(ns.rounds)]
    cmd += ["--concurrency", str(ns.concurrency), "--requests", str(ns.requests)]
    cmd += ["--prompt-words", "400", "--max-tokens", "128"]
    r.run(cmd, r.results / f"{tag}.txt")
    r.stamp(f"{tag} done")


def step_metrics_parse(r: Runner, ns: argparse.Namespace) -> None:
    r.run([PY, BENCH / "metrics_parse.py"], r.results / f"{r.tag('metrics_parse')}.txt")


def step_nvml(r: Runner, ns: argparse.Namespace) -> None:
    r.run([PY, BENCH / "nvml_snapshot.py"], r.results / f"{r.tag('nvml_snapshot')}.txt")


def step_client_cost(r: Runner, ns: argparse.Namespace) -> None:
    cmd = [PY, BENCH / "client_cost.py", "--requests", str(ns.requests)]
    cmd += ["--rounds", str(ns.rounds), "--concurrency", *map(str, ns.concurrency)]
    r.run(cmd, r.results / f"{r.tag('client_cost')}.txt")


def _load(ap: argparse.ArgumentParser, c: int, n: int, i: int, o: int) -> None:
    ap.add_argument("--concurrency", type=int, default=c, help=f"requests at a time ({c})")
    ap.add_argument("--num-prompts", type=int, default=n, help=f"prompts ({n})")
    ap.add_argument("--input-len", type=int, default=i, help=f"prompt tokens ({i})")
    ap.add_argument("--output-len", type=int, default=o, help=f"output tokens ({o})")


def parsers() -> dict[str, tuple[argparse.ArgumentParser, Callable[..., None]]]:
    """Each step's option parser and its function."""
    out: dict[str, tuple[argparse.ArgumentParser, Callable[..., None]]] = {}

    def add(name: str, fn: Callable[..., None], what: str) -> argparse.ArgumentParser:
        ap = argparse.ArgumentParser(prog=f"run.py {name}", description=what)
        out[name] = (ap, fn)
        return ap

    ap = add("validation", step_validation, "8B launches end to end, per config")
    ap.add_argument(
        "--configs", type=config_list, default=FIRST_RUN, help="gpu_validation.py's configs"
    )
    ap.add_argument("--b1-prompts", type=int, help="prompts of the batch-1 load (8)")
    ap = add("fidelity", step_fidelity, "quantdeck bench against vllm bench serve, ABBA")
    _serving(ap)
    _load(ap, 16, 128, 512, 128)
    ap.add_argument("--rounds", type=int, default=6, help="ABBA rounds (6)")
    sent = ap.add_mutually_exclusive_group()
    sent.add_argument("--same-prompts", action="store_true", help="both send Quantdeck's text")
    sent.add_argument("--corpus", action="store_true", help="Quantdeck sends its text")
    ap = add("random-check", step_random_check, "random prompts against vLLM's RandomDataset")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="1b", help="model shape (1b)")
    ap.add_argument("--count", type=int, default=16, help="prompts compared (16)")
    ap.add_argument("--tag", help="name of the output file")
    ap = add("overhead", step_overhead, "2 Hz monitoring against none, same server")
    _serving(ap)
    ap.add_argument("--rounds", type=int, default=8, help="ABBA rounds (8)")
    ap.add_argument("--concurrency", type=int, default=16, help="requests at a time (16)")
    ap.add_argument("--requests", type=int, default=64, help="requests a measurement (64)")
    ap.add_argument("--max-tokens", type=int, default=128, help="output tokens (128)")
    ap = add("tune", step_tune, "the tuner's coordinate search against the exhaustive grid")
    _serving(ap)
    _load(ap, 64, 128, 512, 128)
    ap.add_argument("--ttft-ms", type=float, default=1000, help="p99 TTFT target (1000)")
    ap.add_argument("--tpot-ms", type=float, default=50, help="p99 TPOT target (50)")
    ap.add_argument("--space", nargs="+", default=TUNE_SPACE, help="KNOB=V1,V2 ...")
    ap = add("fleet", step_fleet, "a fleet on the GPU: router cost, failover, fallback")
    ap.add_argument("--graphs", action="store_true", help="CUDA graphs (default: eager)")
    ap.add_argument("--share", type=float, default=0.28, help="GPU memory share each (0.28)")
    ap.add_argument("--above-ms", type=float, default=150.0, help="fallback rule (150)")
    ap.add_argument("--burst", type=int, default=128, help="fallback burst concurrency (128)")
    ap.add_argument("--pairs", type=int, default=4, help="direct/router ABBA rounds (4)")
    ap.add_argument("--rate", type=float, default=8.0, help="failover load, req/s (8)")
    ap.add_argument("--prompts", type=int, default=320, help="per throughput run (320)")
    ap.add_argument("--tag", help="name of the output files")
    ap.add_argument("--shape", choices=("1b", "8b"), default="8b", help="the model's shape (8b)")
    ap.add_argument("--parts", default="router,failover,fallback", help="which figures (all)")
    ap = add("trial", step_trial, "a live trial on the GPU, admission vs NVML, undo from sleep")
    ap.add_argument("--shape", choices=("1b", "8b"), default="1b", help="the model's shape (1b)")
    ap.add_argument("--share", type=float, default=0.3, help="GPU memory share each arm (0.3)")
    ap.add_argument(
        "--candidate", default='{"enforce-eager": false}', help="the candidate's knobs (graphs)"
    )
    ap.add_argument("--goal", default="itl_p99", help="the trial's goal (itl_p99)")
    ap.add_argument("--aa", type=int, default=0, help="A/A trials first (0)")
    ap.add_argument("--max-duration", type=float, default=90.0, help="measuring, s (90)")
    ap.add_argument("--min-requests", type=int, default=30, help="per arm (30)")
    ap.add_argument("--concurrency", type=int, default=4, help="closed-loop clients (4)")
    ap.add_argument("--no-undo", action="store_true", help="no undo after the promotion")
    ap.add_argument("--tag", help="name of the output files")
    ap = add("ray", step_ray, "the ray backend on a loopback Ray head: serve and bench")
    _serving(ap)
    ap.add_argument("--ray-port", type=int, default=6379, help="the Ray head's port (6379)")
    ap.add_argument("--port", type=int, default=8011, help="the server's port (8011)")
    ap.add_argument("--startup-s", type=float, default=600, help="ready within (600 s)")
    ap = add("planner", step_planner, "the planner against vLLM per KV layer family")
    ap.add_argument("--graphs", action="store_true", help="CUDA graphs (default: eager)")
    ap.add_argument("--max-model-len", type=int, default=32768, help="(32768)")
    ap.add_argument("--families", default="gemma3-8b,gpt-oss-8b,granite-h-8b", help="(all)")
    ap.add_argument("--tag", help="name of the output files")
    ap = add("trace", step_trace, "serve --profiler, then quantdeck trace: the CUDA trace")
    _serving(ap)
    ap.add_argument("--steps", type=int, default=8, help="engine steps recorded (8)")
    ap.add_argument("--port", type=int, default=8012, help="the server's port (8012)")
    ap = add("kv-overhead", step_kv_overhead, "KV events on vs off, two servers, ABBA")
    _serving(ap)
    ap.add_argument("--rounds", type=int, default=4, help="ABBA rounds (4)")
    ap.add_argument("--concurrency", type=int, default=32, help="requests at a time (32)")
    ap.add_argument("--requests", type=int, default=128, help="requests a measurement (128)")
    add("metrics-parse", step_metrics_parse, "/metrics parse + derive time")
    add("nvml", step_nvml, "one NVML snapshot's time")
    ap = add("client-cost", step_client_cost, "what each client costs, no model")
    ap.add_argument("--requests", type=int, default=100, help="requests a round (100)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds (2)")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 16], help="(1 16)")
    return out


def split_steps(argv: Sequence[str]) -> list[list[str]]:
    steps: list[list[str]] = [[]]
    for a in argv:
        if a == "+":
            steps.append([])
        else:
            steps[-1].append(a)
    return [s for s in steps if s]


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        usage="run.py [--base DIR] [--results DIR] [--dry-run] STEP [OPTIONS] [+ STEP ...]",
    )
    ap.add_argument("--base", type=Path, default=Path("/root/qd"), help="the session's folder")
    ap.add_argument("--results", type=Path, help="where the output goes (BASE/results)")
    ap.add_argument("--dry-run", action="store_true", help="print the commands only")
    ap.add_argument("steps", nargs=argparse.REMAINDER, help="STEP [OPTIONS] [+ STEP ...]")
    ns = ap.parse_args(argv)
    table = parsers()
    plan = []
    for words in split_steps(ns.steps):
        if words[0] not in table:
            ap.error(f"no step {words[0]!r}; steps: {', '.join(table)}")
        step_ap, fn = table[words[0]]
        plan.append((words, fn, step_ap.parse_args(words[1:])))
    if not plan:
        ap.error(f"name a step: {', '.join(table)}")
    results = ns.results or ns.base / "results"
    if ns.dry_run:  # nothing written where the real run writes
        results = Path(os.environ.get("TMPDIR", "/tmp")) / f"qd-dry-run-{os.getpid()}"
    results.mkdir(parents=True, exist_ok=True)
    r = Runner(ns.base, results, ns.dry_run)
    if not ns.dry_run:
        import quantdeck.core  # the installed wheel's, not the tree's: say which

        print(f"quantdeck from {Path(quantdeck.core.__file__).parent}; {os.cpu_count()} CPUs")
        sys.stdout.flush()
        if shutil.which("lscpu"):
            subprocess.run("lscpu | grep -E '^Model name|^Socket|^Core|^Thread'", shell=True)
    try:
        for words, fn, step_ns in plan:
            r.stamp("step: " + shlex.join(words))
            fn(r, step_ns)
        r.wait()
    finally:
        if ns.dry_run:
            shutil.rmtree(results, ignore_errors=True)
    if r.failed:
        r.stamp(f"all steps done; failed: {', '.join(r.failed)}")
        return 1
    r.stamp("all steps done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
