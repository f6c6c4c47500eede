"""``quantdeck``: the headless command line over the same core as the GUI.

With no command it opens the desktop panel. Errors a user can cause print one line on stderr
and exit with code 2.
"""
from __future__ import annotations

import argparse
import importlib
import json
import sys
from pathlib import Path
from typing import Any, Callable, Sequence

from core import knobs, profiles
from core.config import LaunchConfig
from core.device import DeviceFacts, cpu_device, cuda_device, detect_device
from core.errors import ConfigError, QuantdeckError


def _print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=2, sort_keys=False, default=str))


def _human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.2f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)


# -- shared option groups -------------------------------------------------------------------

def _add_model_and_knobs(p: argparse.ArgumentParser) -> None:
    p.add_argument("path", nargs="?", help="model folder (default: the profile's model, else "
                   "the built-in demo model)")
    p.add_argument("--profile", metavar="FILE|NAME", help="start from a saved profile (a "
                   "profile name or a YAML file as `vllm serve --config` reads)")
    knobs.add_cli_options(p)


def _add_device(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("device")
    g.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                   help="plan for this machine's GPU (auto), its CPU, or a GPU described below")
    g.add_argument("--gpu-memory-gib", type=float, metavar="GIB",
                   help="memory of each GPU, for planning a GPU that is not here")
    g.add_argument("--num-gpus", type=int, default=1, metavar="N")
    g.add_argument("--compute-capability", default="9.0", metavar="X.Y")
    g.add_argument("--gpu-name", default="GPU")


def _device_from(ns: argparse.Namespace) -> DeviceFacts:
    if ns.device == "cpu":
        return cpu_device()
    if ns.gpu_memory_gib is not None:
        try:
            major, minor = (int(x) for x in ns.compute_capability.split("."))
        except ValueError:
            raise ConfigError(f"--compute-capability: '{ns.compute_capability}' is not X.Y") \
                from None
        if ns.gpu_memory_gib <= 0 or ns.num_gpus < 1:
            raise ConfigError("--gpu-memory-gib and --num-gpus must be positive")
        return cuda_device(ns.gpu_memory_gib, name=ns.gpu_name, count=ns.num_gpus,
                           compute_capability=(major, minor))
    dev = detect_device()
    if ns.device == "cuda" and not dev.is_cuda:
        raise ConfigError("--device cuda: no NVIDIA GPU found here; give --gpu-memory-gib to "
                          "plan for one")
    return dev


def _config_from(ns: argparse.Namespace) -> LaunchConfig:
    cfg = LaunchConfig()
    if ns.profile:
        p = Path(ns.profile)
        cfg = profiles.load_file(p) if p.suffix in (".yaml", ".yml") or p.exists() \
            else profiles.load_profile(ns.profile)
    cfg = knobs.apply_cli_options(cfg, ns)
    if ns.path:
        cfg.model.model = ns.path
    if not cfg.model.model:
        from core.demo_model import default_demo_dir, is_complete

        demo = default_demo_dir()
        if not is_complete(demo):
            raise ConfigError("no model given and the demo model is not built yet: run "
                              "`quantdeck demo-model` or pass a model folder")
        cfg.model.model = str(demo)
    return cfg.validate()


def _add_load_options(p: argparse.ArgumentParser, slo: bool = True,
                      seed_flag: str = "--seed") -> None:
    g = p.add_argument_group("load")
    mode = g.add_mutually_exclusive_group()
    mode.add_argument("--concurrency", type=int, help="fixed number of requests in flight")
    mode.add_argument("--request-rate", type=float, default=float("inf"), metavar="R",
                      help="Poisson arrivals per second (default: all at once)")
    g.add_argument("--burstiness", type=float, default=1.0,
                   help="gamma shape of arrival gaps (1: Poisson, <1 burstier)")
    g.add_argument("--num-prompts", type=int, default=64)
    g.add_argument("--input-len", type=int, default=128, help="prompt tokens (exact, through "
                   "the server's tokenizer)")
    g.add_argument("--output-len", type=int, default=128, help="max_tokens (with ignore_eos)")
    g.add_argument("--prompts-file", metavar="JSONL", help="prompts instead of random ones: "
                   '{"prompt": ..., "output_len": ...} per line')
    g.add_argument("--sharegpt", metavar="JSON", help="a ShareGPT file")
    g.add_argument("--dataset-name", choices=("corpus", "random"),  # core.bench.DATASETS
                   default="corpus",
                   help="synthetic prompts: windows of English text (corpus) or runs of "
                   "token ids from random offsets, as vllm bench serve's random dataset")
    g.add_argument("--tokenizer", metavar="PATH", help="random dataset: the tokenizer's "
                   "folder (default: the served model's, when it is on this machine)")
    g.add_argument("--warmups", type=int, default=1, help="requests before the measurement")
    g.add_argument("--no-ignore-eos", action="store_true", help="stop at end of sequence")
    g.add_argument("--temperature", type=float)
    g.add_argument(seed_flag, dest="load_seed", type=int, default=0,
                   help="seed of the prompts and arrival times")
    if not slo:
        return
    s = p.add_argument_group("SLO (goodput)")
    s.add_argument("--slo-ttft-ms", type=float)
    s.add_argument("--slo-tpot-ms", type=float)
    s.add_argument("--slo-e2el-ms", type=float)
    s.add_argument("--goodput", nargs="*", metavar="KEY:MS",
                   help="as vllm bench serve: ttft:MS tpot:MS e2el:MS")


# -- commands -------------------------------------------------------------------------------

def cmd_inspect(ns: argparse.Namespace) -> int:
    from core.model_info import inspect_model

    info = inspect_model(ns.path)
    if ns.json:
        _print_json(info.to_json())
        return 0
    q = info.quantization
    rows = [
        ("path", info.path), ("architecture", info.architecture),
        ("format", info.badge + (f" ({q.method}, {q.scheme}, group {q.group_size})" if q else "")),
        ("parameters", f"{info.num_parameters:,}"),
        ("weights", _human_bytes(info.weights_bytes)),
        ("layers / hidden", f"{info.num_layers} / {info.hidden_size}"),
        ("heads / kv heads / head dim",
         f"{info.num_attention_heads} / {info.num_kv_heads} / {info.head_dim}"),
        ("vocab", f"{info.vocab_size:,}"),
        ("max positions", str(info.max_position_embeddings)),
        ("KV per token", _human_bytes(info.kv_bytes_per_token())),
    ]
    for k, v in rows:
        print(f"{k:>28}: {v}")
    return 0


def cmd_models(ns: argparse.Namespace) -> int:
    from core.library import scan_library

    entries = scan_library(ns.folders, hf_cache=not ns.no_hf_cache)
    if ns.json:
        _print_json([e.to_json() for e in entries])
        return 0
    for e in entries:
        if e.info:
            print(f"{e.info.badge:>8}  {e.info.num_parameters / 1e9:8.3f}B  {e.source:8}  "
                  f"{e.name}  {e.path}")
        else:
            print(f"{'?':>8}  {'':9}  {e.source:8}  {e.name}  ({e.error})")
    return 0


def _plan_and_advise(ns: argparse.Namespace) -> tuple[LaunchConfig, Any, Any, list[Any]]:
    from core.advisor import advise
    from core.model_info import inspect_model
    from core.planner import plan

    cfg = _config_from(ns)
    info = inspect_model(cfg.model.model)
    dev = _device_from(ns)
    kv = plan(cfg, info, dev)
    return cfg, info, kv, advise(cfg, info, dev, kv)


def cmd_plan(ns: argparse.Namespace) -> int:
    cfg, info, kv, findings = _plan_and_advise(ns)
    out = kv.to_json()
    out["model"] = info.path
    out["errors"] = [f.message for f in findings if f.level == "error"]
    out["warnings"] = [f.message for f in findings if f.level == "warning"]
    out["fits"] = kv.fits and not out["errors"]
    if ns.json:
        _print_json(out)
        return 0
    print(f"device        {kv.device}")
    print(f"model         {info.path} ({info.badge})")
    for label, key in (("budget", "budget_bytes"), ("weights", "weights_bytes"),
                       ("activations", "activation_bytes"), ("CUDA graphs", "cudagraph_bytes"),
                       ("non-torch", "non_torch_bytes"), ("KV cache", "kv_cache_bytes")):
        print(f"{label:<13} {_human_bytes(out[key])}")
    print(f"KV cache      {kv.kv_cache_tokens:,} tokens in {kv.num_blocks:,} blocks of "
          f"{kv.block_size} ({_human_bytes(kv.kv_bytes_per_token)} per token)")
    print(f"concurrency   {kv.max_concurrency}x at max_model_len {kv.max_model_len}")
    print(f"fits          {'yes' if out['fits'] else 'no'}")
    for m in out["errors"]:
        print(f"error: {m}")
    for m in out["warnings"]:
        print(f"warning: {m}")
    return 0


def cmd_command(ns: argparse.Namespace) -> int:
    cfg = _config_from(ns)
    if ns.yaml:
        sys.stdout.write(knobs.to_yaml(cfg))
    else:
        import shlex

        print(shlex.join(knobs.serve_command(cfg)))
    return 0


def cmd_profile(ns: argparse.Namespace) -> int:
    if ns.action == "list":
        for name in profiles.list_profiles():
            print(name)
    elif ns.action == "show":
        sys.stdout.write(knobs.to_yaml(profiles.load_profile(ns.name)))
    elif ns.action == "delete":
        profiles.delete_profile(ns.name)
    elif ns.action == "save":
        path = profiles.save_profile(ns.name, _config_from(ns))
        print(path)
    return 0


def cmd_demo_model(ns: argparse.Namespace) -> int:
    from core.demo_model import default_demo_dir, ensure_demo_model

    target = Path(ns.dir) if ns.dir else default_demo_dir()

    def progress(ev: dict[str, Any]) -> None:
        if ns.json_events:
            print(json.dumps(ev), flush=True)
        elif ev.get("event") == "progress":
            print(f"\r{ev.get('stage', ''):>10} {ev.get('pct', 0):5.1f}%", end="",
                  file=sys.stderr, flush=True)

    path = ensure_demo_model(target, on_progress=progress, force=ns.force)
    if not ns.json_events:
        print(file=sys.stderr)
        print(path)
    return 0


class _EventPrinter:
    """Prints events as JSON lines (--json-events) or as short human lines; records them."""

    def __init__(self, json_events: bool, recorder: Any = None, logs: bool = False) -> None:
        self.json_events, self.recorder, self.logs = json_events, recorder, logs
        self._lock = __import__("threading").Lock()

    def __call__(self, ev: dict[str, Any]) -> None:
        if ev.get("event") == "log":
            if self.logs:
                with self._lock:
                    print(json.dumps(ev) if self.json_events else ev["line"], flush=True)
            return
        if self.recorder is not None:
            self.recorder.write(ev)
        with self._lock:
            if self.json_events:
                print(json.dumps(ev, default=str), flush=True)
            else:
                print(_human_event(ev), flush=True)


def _human_event(ev: dict[str, Any]) -> str:
    kind = ev.get("event")
    if kind == "state":
        extra = ev.get("reason") or ev.get("url") or ""
        return f"[{kind}] {ev['state']} {extra}".rstrip()
    if kind == "fact":
        return f"[fact] {ev['name']} = {ev['value']}"
    if kind == "progress":
        return f"[progress] {ev['stage']} {ev['pct']:.0f}%"
    if kind == "advice":
        return f"[{ev['level']}] {ev['message']}"
    if kind == "metrics":
        def f(v: Any, fmt: str = ".1f") -> str:
            return "-" if v is None else format(v, fmt)
        return (f"[metrics] kv {f(ev.get('kv_usage_pct'))}% ({ev.get('kv_blocks_used')}/"
                f"{ev.get('kv_blocks_total')} blocks) run {ev.get('running')} wait "
                f"{ev.get('waiting')} gen {f(ev.get('generation_tokens_per_s'))} tok/s "
                f"ttft p99 {f(ev.get('ttft_p99_ms'))} ms cpu {f(ev.get('host_cpu_pct'))}%")
    return json.dumps(ev, default=str)


def _until_signal(stop: Any) -> None:
    import signal

    def handler(signum: int, _frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


def cmd_serve(ns: argparse.Namespace) -> int:
    import threading

    from core.engine import EngineEnv
    from core.metrics import MetricsScraper
    from core.recording import Recorder
    from core.server import ServerProcess, warm_up
    from core.telemetry import ProcessWatch, Sampler

    cfg = _config_from(ns)
    engine = EngineEnv(ns.engine_python) if ns.engine_python else EngineEnv()
    server = ServerProcess(cfg, engine=engine)
    recorder = None
    if ns.record:
        recorder = Recorder(ns.record, {"source": "serve", "config": knobs.to_dict(cfg),
                                        "model": cfg.model.model})
    out = _EventPrinter(ns.json_events, recorder, ns.logs)
    server.subscribe(out)
    stop = threading.Event()
    _until_signal(stop)
    server.subscribe(lambda ev: stop.set() if ev.get("state") == "crashed" else None)
    sampler = None
    try:
        server.start()
        while not stop.is_set() and not server.wait_ready(0.5):
            if server.state in ("crashed", "stopped"):
                break
        if server.state == "ready" and not stop.is_set():
            if ns.warmup:
                warm_up(server, ns.warmup)
            scraper = MetricsScraper(server.url, api_key=cfg.server.api_key, window_s=ns.window)
            sampler = Sampler(hz=ns.hz, scraper=scraper, watch=ProcessWatch(server.pid))
            sampler.subscribe(lambda s: out(s.to_event()))
            sampler.start()
            stop.wait()
    finally:
        if sampler is not None:
            sampler.stop()
        crashed = server.state == "crashed"
        if server.running:
            server.stop()
        if recorder is not None:
            recorder.close()
    return 3 if crashed else 0


def cmd_monitor(ns: argparse.Namespace) -> int:
    import threading
    import time

    from core.metrics import MetricsScraper
    from core.recording import Recorder
    from core.server import AttachedServer
    from core.telemetry import Sampler

    att = AttachedServer(ns.url, api_key=ns.api_key)
    models = att.check()
    recorder = Recorder(ns.record, {"source": "monitor", "url": att.url, "models": models}) \
        if ns.record else None
    out = _EventPrinter(ns.json_events, recorder)
    out({"event": "state", "state": "attached", "url": att.url, "models": models,
         "t": time.time()})
    stop = threading.Event()
    _until_signal(stop)
    sampler = Sampler(hz=ns.hz, scraper=MetricsScraper(att.url, api_key=ns.api_key,
                                                       window_s=ns.window))
    sampler.subscribe(lambda s: out(s.to_event()))
    sampler.start()
    try:
        stop.wait(ns.duration)
    finally:
        sampler.stop()
        if recorder is not None:
            recorder.close()
    return 0


def cmd_quantize(ns: argparse.Namespace) -> int:
    import threading

    from core.quant_jobs import QuantSpec, run_job

    spec = QuantSpec(src=ns.src, method=ns.method, out=ns.out, calib=ns.calib,
                     samples=ns.samples, seq_len=ns.seq_len)
    cancel = threading.Event()
    _until_signal(cancel)

    def show(ev: dict[str, Any]) -> None:
        if ns.json_events:
            print(json.dumps(ev, default=str), flush=True)
        elif ev.get("event") == "progress":
            layer = f" layer {ev['layer']}/{ev['layers']}" if ev.get("layer") else ""
            print(f"\r{ev.get('stage', ''):>10}{layer} {ev.get('pct', 0):5.1f}%   ", end="",
                  file=sys.stderr, flush=True)

    result = run_job(spec, show, cancel=cancel)
    if not ns.json_events:
        print(file=sys.stderr)
        print(f"{result['out']}  {result['quant_method']} {result['scheme']}  "
              f"{_human_bytes(result['bytes'])} (from {_human_bytes(result['source_bytes'])}) "
              f"in {result['seconds']:.1f} s")
    return 0


def cmd_compare(ns: argparse.Namespace) -> int:
    from core.quant_jobs import compare_quality

    result = compare_quality(ns.orig, ns.quant, text=ns.text, max_tokens=ns.max_tokens)
    if ns.json:
        _print_json(result)
    else:
        print(f"KL(orig||quant) {result['kl_mean']:.5f} nats · top-1 agreement "
              f"{result['top1_agreement']:.1%} · perplexity {result['ppl_orig']:.2f} -> "
              f"{result['ppl_quant']:.2f} over {result['tokens']} tokens")
    return 0


def _load_from(ns: argparse.Namespace) -> Any:
    from core.bench import LoadSpec

    return LoadSpec(num_prompts=ns.num_prompts, input_len=ns.input_len,
                    output_len=ns.output_len, concurrency=ns.concurrency,
                    request_rate=ns.request_rate, burstiness=ns.burstiness,
                    prompts_file=ns.prompts_file, sharegpt=ns.sharegpt,
                    dataset=ns.dataset_name, tokenizer=ns.tokenizer, warmups=ns.warmups,
                    ignore_eos=not ns.no_ignore_eos, temperature=ns.temperature, seed=ns.load_seed)


def _slo_from(ns: argparse.Namespace) -> dict[str, float]:
    from core.bench import parse_slo

    return parse_slo(ns.goodput, ttft=ns.slo_ttft_ms, tpot=ns.slo_tpot_ms, e2el=ns.slo_e2el_ms)


def _progress_printer(quiet: bool) -> Any:
    import threading

    lock = threading.Lock()

    def show(rec: Any, done: int, total: int) -> None:
        if quiet:
            return
        with lock:
            end = "\n" if done == total else ""
            print(f"\r{done}/{total} requests", end=end, file=sys.stderr, flush=True)
    return show


def _served_model(url: str, api_key: str | None, model: str | None) -> str:
    if model:
        return model
    from core.server import AttachedServer

    names = AttachedServer(url, api_key=api_key).check()
    if len(names) != 1:
        raise ConfigError(f"{url} serves {len(names)} models ({', '.join(names)}): "
                          "pick one with --model")
    return names[0]


def cmd_bench(ns: argparse.Namespace) -> int:
    from core.bench import Bench, summary_lines
    from core.runs import environment, save_run, write_json

    spec = _load_from(ns)
    slo = _slo_from(ns)
    model = _served_model(ns.url, ns.api_key, ns.model)
    bench = Bench(ns.url, model, spec, api_key=ns.api_key, slo=slo,
                  on_record=_progress_printer(ns.quiet))
    stop_handler = lambda *_: bench.cancel()  # noqa: E731  (Ctrl-C ends with what was measured)
    import signal

    signal.signal(signal.SIGINT, stop_handler)
    result = bench.run()
    result["env"] = environment(result.get("server_version"))
    if ns.label:
        result["label"] = ns.label
    if not ns.no_save:
        path = save_run(result, ns.label)
        print(f"saved {path}", file=sys.stderr)
    if ns.json:
        write_json(Path(ns.json), result)
    if not ns.quiet:
        print("\n".join(summary_lines(result)))
    return 0 if result["completed"] and not result.get("ended_early") else 1


class _Progress:
    """Event printer for ab / tune: JSON lines or short human lines on stderr."""

    def __init__(self, json_events: bool) -> None:
        self.json_events = json_events

    def __call__(self, ev: dict[str, Any]) -> None:
        if self.json_events:
            print(json.dumps(ev, default=str), flush=True)
            return
        kind = ev.get("event")
        if kind == "arm":
            print(f"[{ev['index'] + 1}/{ev['total']}] {ev['label']}: {ev['stage']}"
                  + (f" ({ev['error']})" if ev.get("error") else ""), file=sys.stderr, flush=True)
        elif kind == "point":
            vals = " ".join(f"{k}={v}" for k, v in ev["values"].items())
            if ev["stage"] == "done":
                good = "-" if ev.get("goodput") is None else f"{ev['goodput']:.2f} req/s"
                note = ev.get("dropped") or ev.get("error") or ("meets" if ev.get("meets")
                                                                else "misses targets")
                print(f"point {ev['index']}: {vals}: goodput {good} ({note})", file=sys.stderr,
                      flush=True)
            else:
                print(f"point {ev['index']}: {vals}: starting", file=sys.stderr, flush=True)
        elif kind == "arm_server" and ev.get("event") == "state" and ev.get("state") == "crashed":
            print(f"  server crashed: {ev.get('reason')}", file=sys.stderr, flush=True)


def cmd_ab(ns: argparse.Namespace) -> int:
    import signal

    from core.ab import ABRun, parse_arm
    from core.runs import environment, save_run, write_json

    base = _config_from(ns)
    arms = [parse_arm(a, base) for a in ns.arm or []]
    run = ABRun(arms, _load_from(ns), slo=_slo_from(ns), warmups=ns.warmup,
                on_event=_Progress(ns.json_events))
    signal.signal(signal.SIGINT, lambda *_: run.cancel())
    result = run.run()
    result["env"] = environment(next((a["result"].get("server_version") for a in result["arms"]
                                      if a.get("result")), None))
    result["label"] = ns.label or "ab-" + "-vs-".join(a.label for a in arms)
    path = save_run(result, result["label"])
    if ns.json:
        write_json(Path(ns.json), result)
    print(f"saved {path}", file=sys.stderr)
    _print_ab_table(result)
    return 0 if all(a.get("result") and not a.get("error") for a in result["arms"]) else 1


def _print_ab_table(result: dict[str, Any]) -> None:
    print(f"{'arm':<20}{'ready s':>9}{'out tok/s':>11}{'req/s':>8}{'TTFT p50':>10}"
          f"{'TTFT p99':>10}{'TPOT p50':>10}{'roofline':>10}  kernel")
    for a in result["arms"]:
        r = a.get("result") or {}
        roof = a.get("roofline") or {}
        f = lambda v, fmt=".1f": "-" if v is None else format(v, fmt)  # noqa: E731
        frac = roof.get("fraction_of_roofline")
        print(f"{a['label']:<20}{f(a.get('ready_s')):>9}{f(r.get('output_throughput')):>11}"
              f"{f(r.get('request_throughput'), '.2f'):>8}{f(r.get('median_ttft_ms')):>10}"
              f"{f(r.get('p99_ttft_ms')):>10}{f(r.get('median_tpot_ms'), '.2f'):>10}"
              f"{(f(frac * 100, '.0f') + '%') if frac else '-':>10}  "
              f"{(a.get('facts') or {}).get('quantization_kernel', '')}"
              + (f"  ERROR {a['error']}" if a.get("error") else ""))


def cmd_tune(ns: argparse.Namespace) -> int:
    import signal

    from core.runs import environment, save_run, write_json
    from core.tune import Tuner, apply_point, parse_space

    base = _config_from(ns)
    spec = _load_from(ns)
    space = parse_space(ns.space, detect_device(), spec.concurrency)
    tuner = Tuner(base, spec, ttft_ms=ns.ttft_ms, tpot_ms=ns.tpot_ms, space=space,
                  strategy=ns.strategy, max_points=ns.max_points, warmups=ns.warmup,
                  on_event=_Progress(ns.json_events))
    signal.signal(signal.SIGINT, lambda *_: tuner.cancel())
    result = tuner.run()
    result["env"] = environment()
    result["label"] = ns.label or f"tune-{ns.strategy}"
    path = save_run(result, result["label"])
    if ns.json:
        write_json(Path(ns.json), result)
    print(f"saved {path}", file=sys.stderr)
    best = result.get("best")
    if not best:
        print("no point completed", file=sys.stderr)
        return 1
    vals = " ".join(f"{k}={v}" for k, v in best["values"].items())
    print(f"best: {vals}: goodput {best['goodput']:.2f} req/s, p99 TTFT "
          f"{best['p99_ttft_ms']:.0f} ms, p99 TPOT {best['p99_tpot_ms']:.1f} ms "
          f"({'meets' if best['meets'] else 'misses'} the targets); {len(result['points'])} "
          f"points in {result['seconds']:.0f} s")
    if ns.save_profile:
        profiles.save_profile(ns.save_profile, apply_point(base, best["values"]))
        print(f"saved profile {ns.save_profile}", file=sys.stderr)
    return 0


def cmd_report(ns: argparse.Namespace) -> int:
    from core.runs import load_run

    runs = [load_run(f) for f in ns.runs]
    report = importlib.import_module("gui.report")
    out = report.write_report(runs, Path(ns.out))
    print(out)
    return 0


def cmd_runs(ns: argparse.Namespace) -> int:
    from core.runs import compare, list_runs, load_run

    if ns.a and ns.b:
        rows = compare(load_run(ns.a), load_run(ns.b))
        if ns.json:
            _print_json(rows)
        else:
            for r in rows:
                fmt = lambda v: "-" if v is None else (f"{v:.2f}" if isinstance(v, float)  # noqa
                                                        else str(v))
                mark = {True: "better", False: "worse", None: ""}[r["b_better"]]
                ratio = "-" if r["ratio"] is None else f"x{r['ratio']:.3f}"
                print(f"{r['metric']:<24}{fmt(r['a']):>12}{fmt(r['b']):>12}  {ratio:>8} {mark}")
        return 0
    if ns.a:
        raise ConfigError("give two runs to compare (or none to list them)")
    rows = []
    for p in list_runs():
        try:
            r = load_run(p)
        except QuantdeckError:
            continue
        rows.append({"file": p.name, "kind": r.get("kind", "bench"), "label": r.get("label"),
                     "completed": r.get("completed"),
                     "output_throughput": r.get("output_throughput"),
                     "median_ttft_ms": r.get("median_ttft_ms")})
    if ns.json:
        _print_json(rows)
    else:
        for r in rows:
            if r["kind"] != "bench":
                print(f"{r['file']:<50} {r['kind']}")
                continue
            print(f"{r['file']:<50} {r['completed']:>5} req {r['output_throughput']:>9.1f} tok/s "
                  f"TTFT p50 {r['median_ttft_ms']:.1f} ms")
    return 0


def cmd_screenshots(ns: argparse.Namespace) -> int:
    mod = importlib.import_module("gui.screenshots")
    return int(mod.main([ns.outdir]) or 0)


def cmd_replay(ns: argparse.Namespace) -> int:
    from core.recording import read_recording

    read_recording(ns.file)  # one-line errors before Qt starts
    replay = importlib.import_module("gui.replay")
    w, _, h = ns.size.partition("x")
    return int(replay.main(ns.file, ns.png, (int(w), int(h)), ns.title))


def cmd_gui(ns: argparse.Namespace) -> int:
    # Loaded by name: core never depends on the Qt front end, the front end depends on core.
    app = importlib.import_module("gui.app")
    return int(app.main([]) or 0)


# -- parser ---------------------------------------------------------------------------------

class OneLineParser(argparse.ArgumentParser):
    """argparse whose usage errors are one line on stderr and exit code 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {' '.join(message.split())}\n")


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="quantdeck", description="Serve, quantize, benchmark and "
                                "tune LLMs with vLLM. With no command: the desktop panel.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    commands: dict[str, Callable[[argparse.Namespace], int]] = {}

    def add(name: str, fn: Callable[[argparse.Namespace], int], help_: str
            ) -> argparse.ArgumentParser:
        sp = sub.add_parser(name, help=help_, description=help_)
        sp.set_defaults(func=fn)
        commands[name] = fn
        return sp

    sp = add("gui", cmd_gui, "open the desktop panel")

    sp = add("screenshots", cmd_screenshots, "drive every tab against a demo server and save "
             "one PNG per tab")
    sp.add_argument("outdir")

    sp = add("demo-model", cmd_demo_model, "build the built-in tiny demo model")
    sp.add_argument("dir", nargs="?", help="target folder (default: the user data dir)")
    sp.add_argument("--force", action="store_true", help="rebuild even if it exists")
    sp.add_argument("--json-events", action="store_true", help="print JSON progress lines")

    sp = add("inspect", cmd_inspect, "facts about a model folder (no weights loaded)")
    sp.add_argument("path")
    sp.add_argument("--json", action="store_true")

    sp = add("models", cmd_models, "models in folders and the Hugging Face cache")
    sp.add_argument("folders", nargs="*")
    sp.add_argument("--no-hf-cache", action="store_true")
    sp.add_argument("--json", action="store_true")

    sp = add("plan", cmd_plan, "predict memory split and KV cache of a launch, with advice")
    _add_model_and_knobs(sp)
    _add_device(sp)
    sp.add_argument("--json", action="store_true")

    sp = add("command", cmd_command, "print the `vllm serve` command (or its --config YAML)")
    _add_model_and_knobs(sp)
    sp.add_argument("--yaml", action="store_true", help="print the YAML instead")

    sp = add("serve", cmd_serve, "start vLLM, watch it, print events until SIGINT/SIGTERM")
    _add_model_and_knobs(sp)
    sp.add_argument("--json-events", action="store_true", help="one JSON object per line")
    sp.add_argument("--record", metavar="FILE", help="record the session (JSONL) for replay")
    sp.add_argument("--hz", type=float, default=1.0, help="metrics events per second")
    sp.add_argument("--window", type=float, default=60.0, metavar="S",
                    help="sliding window of the latency percentiles")
    sp.add_argument("--warmup", type=int, default=0, metavar="N",
                    help="warm-up requests after ready (reports first-request latency)")
    sp.add_argument("--engine-python", metavar="PY", help="the Python whose vLLM to run "
                    "(default: this one)")
    sp.add_argument("--logs", action="store_true", help="also print the server's log lines")

    sp = add("monitor", cmd_monitor, "watch a running vLLM server at URL without owning it")
    sp.add_argument("url")
    sp.add_argument("--api-key")
    sp.add_argument("--json-events", action="store_true")
    sp.add_argument("--duration", type=float, default=None, metavar="S")
    sp.add_argument("--record", metavar="FILE")
    sp.add_argument("--hz", type=float, default=1.0)
    sp.add_argument("--window", type=float, default=60.0, metavar="S")

    from core.quant_jobs import METHODS

    sp = add("quantize", cmd_quantize, "convert a model: " + ", ".join(METHODS))
    sp.add_argument("src", help="the unquantized model folder (never modified)")
    sp.add_argument("--method", required=True, choices=list(METHODS))
    sp.add_argument("--out", required=True, help="target folder (must not exist or be empty)")
    sp.add_argument("--calib", help="calibration text (.txt or .jsonl with a 'text' field)")
    sp.add_argument("--samples", type=int, default=64)
    sp.add_argument("--seq-len", type=int, default=256)
    sp.add_argument("--json-events", action="store_true")

    sp = add("compare", cmd_compare, "quality of a converted model against its source")
    sp.add_argument("orig")
    sp.add_argument("quant")
    sp.add_argument("--text", help="held-out text (default: the shipped held-out set)")
    sp.add_argument("--max-tokens", type=int, default=2048)
    sp.add_argument("--json", action="store_true")

    sp = add("bench", cmd_bench, "measure a running server under load (as `vllm bench serve`)")
    sp.add_argument("url", help="the server's base URL, e.g. http://127.0.0.1:8000")
    sp.add_argument("--model", help="served model name (default: the only one served)")
    sp.add_argument("--api-key")
    _add_load_options(sp)
    sp.add_argument("--label", help="name of this run in the history")
    sp.add_argument("--json", metavar="FILE", help="also write the result here")
    sp.add_argument("--no-save", action="store_true", help="do not add it to the run history")
    sp.add_argument("--quiet", action="store_true")

    sp = add("ab", cmd_ab, "one load against several launch configs in turn (A/B)")
    _add_model_and_knobs(sp)
    sp.add_argument("--arm", action="append", metavar="LABEL=OPTIONS", required=True,
                    help="an arm: the base config with these options on top (a model path, "
                    "--profile NAME, knobs), e.g. --arm eager=--enforce-eager --arm graphs=")
    _add_load_options(sp, seed_flag="--load-seed")
    sp.add_argument("--warmup", type=int, default=2, help="warm-up requests per arm")
    sp.add_argument("--label")
    sp.add_argument("--json", metavar="FILE")
    sp.add_argument("--json-events", action="store_true")

    sp = add("tune", cmd_tune, "search launch knobs for the most goodput under latency targets")
    _add_model_and_knobs(sp)
    _add_load_options(sp, slo=False, seed_flag="--load-seed")
    sp.add_argument("--ttft-ms", type=float, required=True, help="p99 TTFT target")
    sp.add_argument("--tpot-ms", type=float, required=True, help="p99 TPOT target")
    sp.add_argument("--space", nargs="+", metavar="KNOB=V1,V2", help="candidate values "
                    "(default: sized to the load and device)")
    sp.add_argument("--strategy", default="coordinate", choices=["coordinate", "grid"])
    sp.add_argument("--max-points", type=int)
    sp.add_argument("--warmup", type=int, default=1)
    sp.add_argument("--save-profile", metavar="NAME", help="save the best point as a profile")
    sp.add_argument("--label")
    sp.add_argument("--json", metavar="FILE")
    sp.add_argument("--json-events", action="store_true")

    sp = add("report", cmd_report, "an HTML report with PNG charts of saved runs")
    sp.add_argument("runs", nargs="+", help="run files (bench, ab or tune results)")
    sp.add_argument("--out", default="quantdeck-report", help="output folder")

    sp = add("runs", cmd_runs, "list saved benchmark runs, or compare two")
    sp.add_argument("a", nargs="?", help="run file (or its name in the history)")
    sp.add_argument("b", nargs="?")
    sp.add_argument("--json", action="store_true")

    sp = add("replay", cmd_replay, "show a recording in the Monitor (or save it as a PNG)")
    sp.add_argument("file", help="a recording (.jsonl or .jsonl.gz)")
    sp.add_argument("--png", metavar="OUT", help="render off screen, save, exit")
    sp.add_argument("--size", default="1400x900", help="WIDTHxHEIGHT of the PNG")
    sp.add_argument("--title", help="heading above the plots (default: the model)")

    sp = add("profile", cmd_profile, "save, show, list or delete launch profiles")
    psub = sp.add_subparsers(dest="action", required=True, metavar="ACTION")
    psub.add_parser("list", help="list saved profiles")
    for action in ("show", "delete"):
        pa = psub.add_parser(action, help=f"{action} a profile")
        pa.add_argument("name")
    pa = psub.add_parser("save", help="save a profile from a model and knobs")
    pa.add_argument("name")
    _add_model_and_knobs(pa)
    return p



def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    ns = parser.parse_args(argv)
    if ns.command is None:
        ns.func = cmd_gui
    try:
        return ns.func(ns)
    except QuantdeckError as e:
        print(f"quantdeck: error: {e}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
