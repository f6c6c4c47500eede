"""What the command groups share: option groups, the config and load they build, printers."""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from quantdeck.core.errors import ConfigError, QuantdeckError, mask_credentials
from quantdeck.core.events import (
    ArmEvent,
    ArmServerEvent,
    Event,
    LogEvent,
    PointEvent,
    StateEvent,
)
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
from quantdeck.core.procs import STOP_SIGNALS
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
    g.add_argument(
        "--vllm-version",
        metavar="X.Y.Z",
        help="plan with this vLLM's defaults (prefix caching of hybrid models changed in 0.28; "
        "default: the vLLM installed here, else the newest)",
    )


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
    if cfg.server.api_key is None and os.environ.get("VLLM_API_KEY"):
        # as `vllm serve` does: a key in the environment stays out of argv (/proc/PID/cmdline)
        cfg.server.api_key = os.environ["VLLM_API_KEY"]
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


def add_client_options(p: argparse.ArgumentParser) -> None:
    """The key and TLS options of a command that talks to a server at a URL."""
    p.add_argument("--api-key", help="the server's API key (sent as a Bearer token)")
    tls = p.add_mutually_exclusive_group()
    tls.add_argument("--ca-bundle", metavar="PEM", help="check https against these CAs")
    tls.add_argument(
        "--insecure", action="store_true", help="do not check the https certificate at all"
    )


def client_from(ns: argparse.Namespace) -> None:
    """Apply the TLS options; warn once when the key would cross the network in clear."""
    from quantdeck.core.http import configure_tls, plain_http_warning

    configure_tls(ca_bundle=ns.ca_bundle, insecure=ns.insecure)
    warning = plain_http_warning(ns.url, ns.api_key)
    if warning:
        print(f"quantdeck: warning: {warning}", file=sys.stderr)


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
            try:
                self.recorder.write(event)
            except QuantdeckError as e:  # raised once (a full disk, its cap): say so, go on
                from quantdeck.core.monitor import RecordingCapped

                what = "" if isinstance(e, RecordingCapped) else "error: "  # a cap: a note
                print(f"quantdeck: {what}{e}", file=sys.stderr, flush=True)
        with self._lock:
            if self.json_events:
                text = json.dumps(event.to_json(), default=str)
            else:
                text = human_event(event)
            print(mask_credentials(text), flush=True)


def human_event(event: Event) -> str:
    """One short line for a person: the event's own :meth:`~Event.describe`."""
    return event.describe()


class Stopped(KeyboardInterrupt):
    """Raised by a stop signal where no clean stop is under way: the command ends at once
    (its ``finally`` blocks run) and exits with 128 + the signal's number."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.exit_code = 128 + signum


def _raise_stopped(signum: int, _frame: Any) -> None:
    raise Stopped(signum)


@contextlib.contextmanager
def stop_signals_raise() -> Iterator[None]:
    """While a command runs, every stop signal raises :class:`Stopped` in the main thread
    (commands with a clean stop of their own install :class:`StopSignals` over this); the
    handlers from before come back afterwards."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = {sig: signal.getsignal(sig) for sig in STOP_SIGNALS}
    for sig in before:
        signal.signal(sig, _raise_stopped)
    try:
        yield
    finally:
        for sig, handler in before.items():
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)


class StopSignals:
    """SIGINT, SIGTERM and SIGHUP all ask for the same clean stop: the first sets ``event``
    and calls ``on_stop`` (in a thread of its own: the handler may have interrupted the
    main thread inside a lock that ``on_stop`` takes); a second one stops waiting and raises
    :class:`Stopped` (the children still go: they die with us)."""

    def __init__(self, on_stop: Callable[[], None] | None = None) -> None:
        self.event = threading.Event()
        self.signum: int | None = None
        self._on_stop = on_stop
        if threading.current_thread() is threading.main_thread():
            for sig in STOP_SIGNALS:
                signal.signal(sig, self._handle)

    def _handle(self, signum: int, _frame: Any) -> None:
        if self.signum is not None:
            raise Stopped(signum)
        self.signum = signum
        self.event.set()
        if self._on_stop is not None:
            threading.Thread(target=self._on_stop, name="quantdeck-stop", daemon=True).start()

    def exit_code(self, default: int) -> int:
        """``default``, or 128 + the signal's number when a signal stopped the command."""
        return default if self.signum is None else 128 + self.signum


def until_signal(stop: threading.Event) -> StopSignals:
    """Set ``stop`` on the first stop signal."""
    return StopSignals(stop.set)


def add_engine(p: argparse.ArgumentParser, does: str) -> None:
    """``--engine NAME|PY`` (alias ``--engine-python``): the interpreter that ``does``."""
    p.add_argument(
        "--engine",
        "--engine-python",
        dest="engine",
        metavar="NAME|PY",
        help=f"the engine that {does}: a name from `quantdeck engines`, or a Python with vLLM "
        "(default: this Python; a standalone bundle's first engine)",
    )


def engine_from(ns: argparse.Namespace) -> str:
    """The interpreter ``--engine`` names (one ConfigError line when it names none), or the
    default engine."""
    from quantdeck.core.engines import default_engine, resolve_engine

    return resolve_engine(ns.engine) if ns.engine is not None else default_engine()


def fit_for_engine(ns: argparse.Namespace, cfg: LaunchConfig) -> tuple[LaunchConfig, list[str]]:
    """``cfg`` made fit for the engine ``--engine`` names (default: the default engine): a
    ``--profile`` saved with another vLLM migrated (:mod:`quantdeck.core.launch.migrate`),
    then everything checked against that engine's own ``vllm serve`` parser (its capabilities,
    probed once and cached). Returns the config and the migration's notes; one ConfigError
    line naming the engine's and the profile's vLLM versions when it cannot launch there."""
    from quantdeck.core.launch.migrate import fit_to_engine
    from quantdeck.core.runtime.engine import EngineEnv

    saved = None
    if ns.profile:
        p = Path(ns.profile)
        if not (p.suffix in (".yaml", ".yml") or p.exists()):
            p = profiles.profile_path(ns.profile)
        saved = profiles.read_file(p)[1]
    caps = EngineEnv(engine_from(ns)).capabilities()
    return fit_to_engine(
        cfg, saved_with=saved, target=caps, engine=ns.engine, profile=bool(ns.profile)
    )


RECORD_MAX_MIB = 128  # a recording's cap: the most a replay reads (core.monitor.recording)


def record_mib(text: str) -> int:
    """An argparse type: a recording's cap in MiB, 1 to :data:`RECORD_MAX_MIB`."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a whole number of MiB") from None
    if not 1 <= value <= RECORD_MAX_MIB:
        raise argparse.ArgumentTypeError(
            f"{value}: a recording's cap is 1 to {RECORD_MAX_MIB} MiB (what a replay reads)"
        )
    return value


def add_record_cap(p: argparse.ArgumentParser) -> None:
    """``--record-max-mib N``: where a recording stops (None: at the most a replay reads)."""
    p.add_argument(
        "--record-max-mib",
        type=record_mib,
        metavar="N",
        help=f"stop recording at N MiB, its last line saying so (default {RECORD_MAX_MIB}: "
        "what a replay reads)",
    )


def positive_seconds(text: str) -> float:
    """An argparse type: a finite number of seconds above zero."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not a number of seconds") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"'{text}' is not a positive number of seconds")
    return value


class Progress:
    """Event printer for ab / tune: JSON lines or short human lines on stderr."""

    def __init__(self, json_events: bool) -> None:
        self.json_events = json_events

    def __call__(self, event: Event) -> None:
        if self.json_events:
            print(json.dumps(event.to_json(), default=str), flush=True)
            return
        match event:
            case ArmEvent() | PointEvent():
                print(event.describe(), file=sys.stderr, flush=True)
            case ArmServerEvent(server=StateEvent(state="crashed", reason=reason)):
                print(f"  server crashed: {reason or None}", file=sys.stderr, flush=True)
