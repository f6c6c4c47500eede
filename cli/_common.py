"""What the command groups share: option groups, the config and load they build, printers."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from quantdeck.core.errors import ConfigError
from quantdeck.core.events import ArmServerEvent, Event, LogEvent, StateEvent
from quantdeck.core.launch import (
    DeviceFacts,
    LaunchConfig,
    cpu_device,
    cuda_device,
    detect_device,
    knobs,
    profiles,
    validate,
)
from quantdeck.core.workers.protocol import OneLineParser  # noqa: F401 (the CLI's parser)

AddCommand = Callable[[str, Callable[[argparse.Namespace], int], str], argparse.ArgumentParser]


def print_json(obj: Any) -> None:
    print(json.dumps(obj, indent=2, sort_keys=False, default=str))


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.2f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return str(n)


def add_model_and_knobs(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "path",
        nargs="?",
        help="model folder (default: the profile's model, else the built-in demo model)",
    )
    p.add_argument(
        "--profile",
        metavar="FILE|NAME",
        help="start from a saved profile (a "
        "profile name or a YAML file as `vllm serve --config` reads)",
    )
    knobs.add_cli_options(p)


def add_device(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("device")
    g.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="plan for this machine's GPU (auto), its CPU, or a GPU described below",
    )
    g.add_argument(
        "--gpu-memory-gib",
        type=float,
        metavar="GIB",
        help="memory of each GPU, for planning a GPU that is not here",
    )
    g.add_argument("--num-gpus", type=int, default=1, metavar="N")
    g.add_argument("--compute-capability", default="9.0", metavar="X.Y")
    g.add_argument("--gpu-name", default="GPU")


def device_from(ns: argparse.Namespace) -> DeviceFacts:
    if ns.device == "cpu":
        return cpu_device()
    if ns.gpu_memory_gib is not None:
        try:
            major, minor = (int(x) for x in ns.compute_capability.split("."))
        except ValueError:
            raise ConfigError(
                f"--compute-capability: '{ns.compute_capability}' is not X.Y"
            ) from None
        if ns.gpu_memory_gib <= 0 or ns.num_gpus < 1:
            raise ConfigError("--gpu-memory-gib and --num-gpus must be positive")
        return cuda_device(
            ns.gpu_memory_gib,
            name=ns.gpu_name,
            count=ns.num_gpus,
            compute_capability=(major, minor),
        )
    dev = detect_device()
    if ns.device == "cuda" and not dev.is_cuda:
        raise ConfigError(
            "--device cuda: no NVIDIA GPU found here; give --gpu-memory-gib to plan for one"
        )
    return dev


def config_from(ns: argparse.Namespace) -> LaunchConfig:
    cfg = LaunchConfig()
    if ns.profile:
        p = Path(ns.profile)
        cfg = (
            profiles.load_file(p)
            if p.suffix in (".yaml", ".yml") or p.exists()
            else profiles.load_profile(ns.profile)
        )
    cfg = knobs.apply_cli_options(cfg, ns)
    if ns.path:
        cfg.model.model = ns.path
    if not cfg.model.model:
        from quantdeck.core.models import default_demo_dir, is_complete

        demo = default_demo_dir()
        if not is_complete(demo):
            raise ConfigError(
                "no model given and the demo model is not built yet: run "
                "`quantdeck demo-model` or pass a model folder"
            )
        cfg.model.model = str(demo)
    return validate(cfg)


def add_load_options(
    p: argparse.ArgumentParser, slo: bool = True, seed_flag: str = "--seed"
) -> None:
    g = p.add_argument_group("load")
    mode = g.add_mutually_exclusive_group()
    mode.add_argument("--concurrency", type=int, help="fixed number of requests in flight")
    mode.add_argument(
        "--request-rate",
        type=float,
        default=float("inf"),
        metavar="R",
        help="Poisson arrivals per second (default: all at once)",
    )
    g.add_argument(
        "--burstiness",
        type=float,
        default=1.0,
        help="gamma shape of arrival gaps (1: Poisson, <1 burstier)",
    )
    g.add_argument("--num-prompts", type=int, default=64)
    g.add_argument(
        "--input-len",
        type=int,
        default=128,
        help="prompt tokens (exact, through the server's tokenizer)",
    )
    g.add_argument("--output-len", type=int, default=128, help="max_tokens (with ignore_eos)")
    g.add_argument(
        "--prompts-file",
        metavar="JSONL",
        help='prompts instead of random ones: {"prompt": ..., "output_len": ...} per line',
    )
    g.add_argument("--sharegpt", metavar="JSON", help="a ShareGPT file")
    g.add_argument(
        "--dataset-name",
        choices=("corpus", "random"),  # quantdeck.core.bench.client.DATASETS
        default="corpus",
        help="synthetic prompts: windows of English text (corpus) or runs of "
        "token ids from random offsets, as vllm bench serve's random dataset",
    )
    g.add_argument(
        "--tokenizer",
        metavar="PATH",
        help="random dataset: the tokenizer's "
        "folder (default: the served model's, when it is on this machine)",
    )
    g.add_argument("--warmups", type=int, default=1, help="requests before the measurement")
    g.add_argument("--no-ignore-eos", action="store_true", help="stop at end of sequence")
    g.add_argument("--temperature", type=float)
    g.add_argument(
        seed_flag,
        dest="load_seed",
        type=int,
        default=0,
        help="seed of the prompts and arrival times",
    )
    if not slo:
        return
    s = p.add_argument_group("SLO (goodput)")
    s.add_argument("--slo-ttft-ms", type=float)
    s.add_argument("--slo-tpot-ms", type=float)
    s.add_argument("--slo-e2el-ms", type=float)
    s.add_argument(
        "--goodput",
        nargs="*",
        metavar="KEY:MS",
        help="as vllm bench serve: ttft:MS tpot:MS e2el:MS",
    )


def load_from(ns: argparse.Namespace) -> Any:
    from quantdeck.core.bench import LoadSpec

    return LoadSpec(
        num_prompts=ns.num_prompts,
        input_len=ns.input_len,
        output_len=ns.output_len,
        concurrency=ns.concurrency,
        request_rate=ns.request_rate,
        burstiness=ns.burstiness,
        prompts_file=ns.prompts_file,
        sharegpt=ns.sharegpt,
        dataset=ns.dataset_name,
        tokenizer=ns.tokenizer,
        warmups=ns.warmups,
        ignore_eos=not ns.no_ignore_eos,
        temperature=ns.temperature,
        seed=ns.load_seed,
    )


def slo_from(ns: argparse.Namespace) -> dict[str, float]:
    from quantdeck.core.bench import parse_slo

    return parse_slo(ns.goodput, ttft=ns.slo_ttft_ms, tpot=ns.slo_tpot_ms, e2el=ns.slo_e2el_ms)


def progress_printer(quiet: bool) -> Any:
    import threading

    lock = threading.Lock()

    def show(rec: Any, done: int, total: int) -> None:
        if quiet:
            return
        with lock:
            end = "\n" if done == total else ""
            print(f"\r{done}/{total} requests", end=end, file=sys.stderr, flush=True)

    return show


def served_model(url: str, api_key: str | None, model: str | None) -> str:
    if model:
        return model
    from quantdeck.core.runtime import AttachedServer

    names = AttachedServer(url, api_key=api_key).check()
    if len(names) != 1:
        raise ConfigError(
            f"{url} serves {len(names)} models ({', '.join(names)}): pick one with --model"
        )
    return names[0]


class EventPrinter:
    """Prints events as JSON lines (--json-events) or as short human lines; records them."""

    def __init__(self, json_events: bool, recorder: Any = None, logs: bool = False) -> None:
        self.json_events, self.recorder, self.logs = json_events, recorder, logs
        self._lock = __import__("threading").Lock()

    def __call__(self, event: Event) -> None:
        if isinstance(event, LogEvent):
            if self.logs:
                with self._lock:
                    text = json.dumps(event.to_json()) if self.json_events else event.line
                    print(text, flush=True)
            return
        if self.recorder is not None:
            self.recorder.write(event)
        with self._lock:
            if self.json_events:
                print(json.dumps(event.to_json(), default=str), flush=True)
            else:
                print(human_event(event), flush=True)


def human_event(event: Event) -> str:
    """One short line for a person (the JSON line's keys, laid out)."""
    kind, ev = event.kind, event.to_json()
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

        return (
            f"[metrics] kv {f(ev.get('kv_usage_pct'))}% ({ev.get('kv_blocks_used')}/"
            f"{ev.get('kv_blocks_total')} blocks) run {ev.get('running')} wait "
            f"{ev.get('waiting')} gen {f(ev.get('generation_tokens_per_s'))} tok/s "
            f"ttft p99 {f(ev.get('ttft_p99_ms'))} ms cpu {f(ev.get('host_cpu_pct'))}%"
        )
    return json.dumps(ev, default=str)


def until_signal(stop: Any) -> None:
    import signal

    def handler(signum: int, _frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)


class Progress:
    """Event printer for ab / tune: JSON lines or short human lines on stderr."""

    def __init__(self, json_events: bool) -> None:
        self.json_events = json_events

    def __call__(self, event: Event) -> None:
        ev = event.to_json()
        if self.json_events:
            print(json.dumps(ev, default=str), flush=True)
            return
        kind = event.kind
        if kind == "arm":
            print(
                f"[{ev['index'] + 1}/{ev['total']}] {ev['label']}: {ev['stage']}"
                + (f" ({ev['error']})" if ev.get("error") else ""),
                file=sys.stderr,
                flush=True,
            )
        elif kind == "point":
            vals = " ".join(f"{k}={v}" for k, v in ev["values"].items())
            if ev["stage"] == "done":
                good = "-" if ev.get("goodput") is None else f"{ev['goodput']:.2f} req/s"
                note = (
                    ev.get("dropped")
                    or ev.get("error")
                    or ("meets" if ev.get("meets") else "misses targets")
                )
                print(
                    f"point {ev['index']}: {vals}: goodput {good} ({note})",
                    file=sys.stderr,
                    flush=True,
                )
            else:
                print(f"point {ev['index']}: {vals}: starting", file=sys.stderr, flush=True)
        elif (
            isinstance(event, ArmServerEvent)
            and isinstance(event.server, StateEvent)
            and event.server.state == "crashed"
        ):
            print(f"  server crashed: {event.server.get('reason')}", file=sys.stderr, flush=True)
