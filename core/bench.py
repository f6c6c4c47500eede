"""Load generator: OpenAI-compatible streaming requests against a running server, measured.

Definitions follow ``vllm bench serve`` (vllm/benchmarks/serve.py ``calculate_metrics``) so the
numbers are comparable one to one:

- TTFT: request sent -> first streamed chunk that carries a choice; ITL: gaps between later
  chunks; E2E latency: request sent -> last chunk; TPOT: (E2E - TTFT) / (output tokens - 1).
- Output tokens come from the stream's ``usage`` (``stream_options.include_usage``).
- Every streamed message is read as ``vllm bench serve`` reads it: parsed as JSON, its text kept
  (``generated_text`` in each record), an error the server sends mid-stream failing the
  request. The client's CPU per message matters: on a CPU-bound server it is taken from the
  server, so a lighter client reads a faster server than ``vllm bench serve`` does.
- Throughputs divide by the wall time of the whole run (first send -> last reply).
- Goodput: completed requests whose TTFT, TPOT and E2E are all within the SLO limits (ms), per s.
- Failed requests stay in the records and in ``failed``; nothing is dropped. Requests that were
  never sent because the run ended early (server gone, cancelled) count as failed, with the
  reason as their error.

The per-request records are kept in the result, so every aggregate can be recomputed from a
saved run (:func:`compute_metrics`).

The measured requests stream through aiohttp, the client library of ``vllm bench serve``; the
set-up calls (model check, ``/tokenize``) go through httpx like the rest of Quantdeck.
"""
from __future__ import annotations

import asyncio
import codecs
import contextlib
import gc
import json
import math
import random
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Sequence

import httpx
import numpy as np

from core.errors import ConfigError, ServerError
from core.http import tls_verify

if TYPE_CHECKING:
    import aiohttp

SLO_KEYS = ("ttft", "tpot", "e2el")
METRIC_KEYS = ("ttft", "tpot", "itl", "e2el")
DEFAULT_PERCENTILES = (50.0, 90.0, 99.0)
DATASETS = ("corpus", "random")
CORPUS = Path(__file__).resolve().parent.parent / "assets" / "corpus"


@dataclass(frozen=True)
class LoadSpec:
    """What to send. Exactly one prompt source: synthetic prompts of ``input_len`` tokens
    (``dataset``), a JSONL file or ShareGPT."""

    num_prompts: int = 64
    input_len: int = 128
    output_len: int = 128
    concurrency: int | None = None  # at most this many in flight (None: unbounded)
    request_rate: float = math.inf  # Poisson arrivals per s (inf: all at once)
    burstiness: float = 1.0  # gamma shape of inter-arrival times (1: Poisson)
    prompts_file: str | None = None  # JSONL: {"prompt": str, "output_len"?: int}
    sharegpt: str | None = None  # ShareGPT JSON: first human turn, reply length as output
    # synthetic prompts: "corpus" (windows of English text) or "random" (runs of consecutive
    # token ids from random offsets, as vllm bench serve's random dataset sends)
    dataset: str = "corpus"
    tokenizer: str | None = None  # "random": the tokenizer's folder (default: the model's)
    warmups: int = 1  # requests before the measured run, not counted
    ignore_eos: bool = True
    temperature: float | None = None  # None: the server's default, as vllm bench serve
    seed: int = 0
    request_timeout_s: float = 600.0

    def check(self) -> None:
        if self.num_prompts < 1:
            raise ConfigError("--num-prompts must be at least 1")
        if self.input_len < 1 or self.output_len < 1:
            raise ConfigError("--input-len and --output-len must be at least 1")
        if self.concurrency is not None and self.concurrency < 1:
            raise ConfigError("--concurrency must be at least 1")
        if not self.request_rate > 0:
            raise ConfigError("--request-rate must be > 0 (inf: all at once)")
        if not self.burstiness > 0:
            raise ConfigError("--burstiness must be > 0")
        if self.prompts_file and self.sharegpt:
            raise ConfigError("give --prompts-file or --sharegpt, not both")
        if self.dataset not in DATASETS:
            raise ConfigError(f"--dataset-name {self.dataset!r}: one of {', '.join(DATASETS)}")
        if self.dataset != "corpus" and (self.prompts_file or self.sharegpt):
            raise ConfigError(f"--dataset-name {self.dataset} makes its own prompts: not with "
                              "--prompts-file or --sharegpt")
        for f in (self.prompts_file, self.sharegpt):
            if f and not Path(f).is_file():
                raise ConfigError(f"{f}: no such file")


def parse_slo(items: Sequence[str] | None = None, *, ttft: float | None = None,
              tpot: float | None = None, e2el: float | None = None) -> dict[str, float]:
    """SLO limits in ms from ``KEY:MS`` items (as ``vllm bench serve --goodput``) and flags."""
    slo: dict[str, float] = {}
    if items is not None and not items:
        raise ConfigError("--goodput needs limits: KEY:MS with KEY one of ttft, tpot, e2el")
    for item in items or ():
        key, sep, value = item.partition(":")
        if not sep or key not in SLO_KEYS:
            raise ConfigError(f"--goodput {item!r}: expected KEY:MS with KEY one of "
                              + ", ".join(SLO_KEYS))
        try:
            slo[key] = float(value)
        except ValueError:
            raise ConfigError(f"--goodput {item!r}: {value!r} is not a number") from None
    for key, value in (("ttft", ttft), ("tpot", tpot), ("e2el", e2el)):
        if value is not None:
            slo[key] = float(value)
    for key, value in slo.items():
        if not value > 0:
            raise ConfigError(f"SLO {key} must be > 0 ms")
    return slo


@dataclass
class Request:
    prompt: str | list[int]
    prompt_len: int
    output_len: int


@dataclass
class RequestRecord:
    """One request's measurements (seconds, as vLLM's RequestFuncOutput)."""

    index: int
    prompt_len: int
    output_len: int  # asked for
    success: bool = False
    error: str = ""
    start_time: float = 0.0  # since the run's start
    ttft: float = 0.0
    itl: list[float] = field(default_factory=list)
    latency: float = 0.0
    output_tokens: int = 0
    generated_text: str = ""

    @property
    def tpot(self) -> float:
        return (self.latency - self.ttft) / (self.output_tokens - 1) if self.output_tokens > 1 \
            else 0.0


# -- metrics ---------------------------------------------------------------------------------

def _stats(values: list[float], name: str, percentiles: Sequence[float]) -> dict[str, float]:
    arr = np.asarray(values or [0.0], dtype=float) * 1000.0
    out = {f"mean_{name}_ms": float(arr.mean()), f"median_{name}_ms": float(np.median(arr)),
           f"std_{name}_ms": float(arr.std())}
    for p in percentiles:
        out[f"p{p:g}_{name}_ms"] = float(np.percentile(arr, p))
    return out


def compute_metrics(records: Sequence[RequestRecord], duration: float,
                    slo: dict[str, float] | None = None,
                    percentiles: Sequence[float] = DEFAULT_PERCENTILES) -> dict[str, Any]:
    """Aggregates with ``vllm bench serve``'s names and definitions."""
    ok = [r for r in records if r.success]
    total_in = sum(r.prompt_len for r in ok)
    total_out = sum(r.output_tokens for r in ok)
    ttfts = [r.ttft for r in ok]
    tpots = [r.tpot for r in ok if r.output_tokens > 1]
    itls = [x for r in ok for x in r.itl]
    e2els = [r.latency for r in ok]
    dur = max(duration, 1e-9)
    m: dict[str, Any] = {
        "duration": duration, "completed": len(ok), "failed": len(records) - len(ok),
        "total_input_tokens": total_in, "total_output_tokens": total_out,
        "request_throughput": len(ok) / dur, "request_goodput": None,
        "output_throughput": total_out / dur, "total_token_throughput": (total_in + total_out) / dur,
    }
    if slo:
        limits = {k: v / 1000.0 for k, v in slo.items()}
        good = sum(1 for r in ok if all(
            {"ttft": r.ttft, "tpot": r.tpot, "e2el": r.latency}[k] <= lim
            for k, lim in limits.items()))
        m["good_completed"] = good
        m["request_goodput"] = good / dur
    for name, values in (("ttft", ttfts), ("tpot", tpots), ("itl", itls), ("e2el", e2els)):
        m.update(_stats(values, name, percentiles))
    return m


# -- prompts ---------------------------------------------------------------------------------

class _Tokenizer:
    """The server's own tokenizer, through vLLM's /tokenize and /detokenize routes."""

    def __init__(self, client: httpx.Client, model: str) -> None:
        self.client, self.model = client, model

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        r = self.client.post(path, json={"model": self.model, **body})
        if r.status_code == 404:
            raise ServerError(f"the server has no {path} route; give --prompts-file instead")
        if r.status_code != 200:
            raise ServerError(f"{path}: HTTP {r.status_code}: {r.text[:160]}")
        return r.json()

    def encode(self, text: str, special: bool) -> list[int]:
        return list(self._post("/tokenize", {"prompt": text,
                                             "add_special_tokens": special})["tokens"])

    def count(self, text: str) -> int:
        return int(self._post("/tokenize", {"prompt": text})["count"])

    def decode(self, ids: list[int]) -> str:
        return str(self._post("/detokenize", {"tokens": ids})["prompt"])


def _corpus_text() -> str:
    return "\n".join(p.read_text(encoding="utf-8") for p in sorted(CORPUS.glob("*.txt")))


def exact_prompt(tok: _Tokenizer, source: list[int], length: int, rng: random.Random
                 ) -> Request:
    """Text that the server counts as exactly ``length`` prompt tokens (special tokens
    included), cut from ``source`` at a random place; token ids if text cannot hit it."""
    extra = tok.count("") if length > 1 else 0  # BOS and friends the server adds
    want = max(1, length - extra)
    start = rng.randrange(0, max(1, len(source) - want))
    n = want
    for _ in range(4):
        ids = (source * (1 + (start + n) // len(source)))[start:start + n]
        text = tok.decode(ids)
        got = tok.count(text)
        if got == length:
            return Request(text, length, 0)
        n = max(1, n + (length - got))
    ids = (source * (1 + (start + length) // len(source)))[start:start + length]
    return Request(ids, length, 0)  # token ids: exact by construction


def tokenizer_vocab(folder: str | Path) -> tuple[int, list[int]]:
    """What ``vllm bench serve``'s random dataset draws from: the tokenizer's base vocabulary
    size (``vocab_size``) and its ids less the special tokens, read from ``tokenizer.json``
    (no tokenizer library needed)."""
    path = Path(folder) / "tokenizer.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        vocab = data["model"]["vocab"]  # a dict (BPE, WordPiece) or a list (Unigram)
    except FileNotFoundError:
        raise ConfigError(f"{path}: not found; --dataset-name random needs the tokenizer's "
                          "folder (--tokenizer PATH)") from None
    except (ValueError, KeyError, TypeError):
        raise ConfigError(f"{path}: not a tokenizer.json with a model vocabulary") from None
    special = {int(t["id"]) for t in data.get("added_tokens") or [] if t.get("special")}
    ids = [i for i in range(len(vocab)) if i not in special]
    if not ids:
        raise ConfigError(f"{path}: no ordinary tokens")
    return len(vocab), ids


def random_dataset(tok: _Tokenizer, vocab: tuple[int, list[int]], input_len: int,
                   output_len: int, count: int, measured: int, seed: int) -> list[Request]:
    """``vllm bench serve --dataset-name random --seed SEED`` (range ratio 0, no prefix),
    prompt for prompt: request i is the text of ``allowed[(offset_i + i + k) % len(allowed)]``,
    k < input_len - special tokens, re-tokenized until it is that long (random ids appended
    or the tail cut, at most 10 times; like vLLM's, a prompt can stay a token or two off).
    The first ``measured`` are vLLM's requests; the rest (warm-ups) continue its generator."""
    vocab_size, allowed = vocab
    rng = np.random.default_rng(seed)
    special = tok.count("")  # the BOS and friends the server adds to text
    inner = input_len - special
    if inner < 1:
        raise ConfigError(f"--input-len {input_len} leaves no token next to the tokenizer's "
                          f"{special} special one(s)")

    def sample(n: int, first: int) -> list[Request]:
        if first == 0:  # vLLM draws the lengths, then the offsets
            rng.integers(inner, inner + 1, size=n)
            rng.integers(output_len, output_len + 1, size=n)
        offsets = rng.integers(0, vocab_size, size=n)
        out = []
        for j in range(n):
            i = first + j
            seq = [allowed[(int(offsets[j]) + i + k) % len(allowed)] for k in range(inner)]
            tries = 10
            while True:
                text = tok.decode(seq)
                seq = tok.encode(text, False)
                if tries <= 0 or len(seq) == inner:
                    break
                if len(seq) < inner:
                    seq += rng.integers(0, vocab_size, size=inner - len(seq)).tolist()
                else:
                    seq = seq[:inner]
                tries -= 1
            out.append(Request(text, input_len + len(seq) - inner, output_len))
        return out

    reqs = sample(min(count, measured), 0)
    if count > measured:
        reqs += sample(count - measured, measured)
    return reqs


def build_requests(spec: LoadSpec, tok: _Tokenizer | None, count: int, seed: int,
                   vocab: tuple[int, list[int]] | None = None) -> list[Request]:
    """The first ``spec.num_prompts`` are measured, the rest warm-ups. ``vocab``: what
    ``dataset="random"`` draws from (:func:`tokenizer_vocab`)."""
    rng = random.Random(seed)
    if spec.prompts_file:
        rows = _read_jsonl(spec.prompts_file)
        reqs = []
        for i in range(count):
            row = rows[i % len(rows)]
            n = tok.count(row["prompt"]) if tok else 0
            reqs.append(Request(row["prompt"], n, int(row.get("output_len", spec.output_len))))
        return reqs
    if spec.sharegpt:
        pairs = _read_sharegpt(spec.sharegpt)
        rng.shuffle(pairs)
        reqs = []
        for i in range(count):
            human, reply = pairs[i % len(pairs)]
            n = tok.count(human) if tok else 0
            out = len(tok.encode(reply, False)) if tok else spec.output_len
            reqs.append(Request(human, n, max(1, out)))
        return reqs
    assert tok is not None
    if spec.dataset == "random":
        if not vocab:
            raise ConfigError("--dataset-name random needs the tokenizer's vocabulary")
        return random_dataset(tok, vocab, spec.input_len, spec.output_len, count,
                              spec.num_prompts, seed)
    source = tok.encode(_corpus_text(), False)
    reqs = []
    for _ in range(count):
        r = exact_prompt(tok, source, spec.input_len, rng)
        r.output_len = spec.output_len
        reqs.append(r)
    return reqs


def _read_jsonl(path: str) -> list[dict[str, Any]]:
    rows = []
    for n, line in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            raise ConfigError(f"{path}:{n}: not a JSON line") from None
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
            raise ConfigError(f"{path}:{n}: expected an object with a 'prompt' string")
        rows.append(row)
    if not rows:
        raise ConfigError(f"{path}: no prompts")
    return rows


def _read_sharegpt(path: str) -> list[tuple[str, str]]:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not JSON ({e.msg})") from None
    pairs = []
    for item in data if isinstance(data, list) else []:
        conv = item.get("conversations") if isinstance(item, dict) else None
        if isinstance(conv, list) and len(conv) >= 2:
            pairs.append((str(conv[0].get("value", "")), str(conv[1].get("value", ""))))
    pairs = [p for p in pairs if p[0] and p[1]]
    if not pairs:
        raise ConfigError(f"{path}: no ShareGPT conversations with a prompt and a reply")
    return pairs


# -- the run ---------------------------------------------------------------------------------

ProgressFn = Callable[[RequestRecord, int, int], None]


class Bench:
    """One measured run. ``run()`` blocks (call it from a worker thread); ``cancel()`` from any
    thread ends it early with what was measured. ``stop_when(records)`` may end it early too
    (the tuner drops hopeless points that way)."""

    def __init__(self, url: str, model: str, spec: LoadSpec, *, api_key: str | None = None,
                 slo: dict[str, float] | None = None,
                 percentiles: Sequence[float] = DEFAULT_PERCENTILES,
                 on_record: ProgressFn | None = None,
                 stop_when: Callable[[list[RequestRecord]], str | None] | None = None) -> None:
        spec.check()
        self.url, self.model, self.spec = url.rstrip("/"), model, spec
        self.api_key, self.slo, self.percentiles = api_key, dict(slo or {}), tuple(percentiles)
        self.on_record, self.stop_when = on_record, stop_when
        self._cancel = threading.Event()
        self._lock = threading.Lock()
        self._wake: Callable[[], None] | None = None  # wakes the running loop on cancel
        self.ended: str | None = None  # why the run ended early
        self.client_cpu_s: float | None = None
        self.model_root: str | None = None

    def cancel(self) -> None:
        """From any thread: stop sending, abort the requests in flight (they count as failed)."""
        with self._lock:
            self._cancel.set()
            if self._wake is not None:
                with contextlib.suppress(RuntimeError):  # its loop has just closed
                    self._wake()

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def check_server(self, client: httpx.Client) -> dict[str, Any]:
        """The model is served there; returns the server's /version (if any)."""
        try:
            r = client.get("/v1/models")
        except httpx.HTTPError as e:
            raise ServerError(f"{self.url}: unreachable ({type(e).__name__})") from None
        if r.status_code in (401, 403):
            raise ServerError(f"{self.url}: HTTP {r.status_code} (API key?)")
        if r.status_code != 200:
            raise ServerError(f"{self.url}/v1/models: HTTP {r.status_code}")
        models = r.json().get("data", [])
        names = [m.get("id") for m in models]
        # where the served model lies (vLLM's "root"): its tokenizer files, if on this machine
        self.model_root = next((m.get("root") for m in models if m.get("id") == self.model),
                               None)
        if self.model not in names:
            raise ConfigError(f"model '{self.model}' is not served at {self.url} "
                              f"(it serves: {', '.join(map(str, names)) or 'nothing'})")
        try:
            v = client.get("/version")
            return v.json() if v.status_code == 200 else {}
        except (httpx.HTTPError, ValueError):
            return {}

    def run(self) -> dict[str, Any]:
        with httpx.Client(base_url=self.url, headers=self.headers, timeout=30.0,
                          verify=tls_verify(self.url)) as client:
            version = self.check_server(client)
            tok = _Tokenizer(client, self.model)
            if self.spec.prompts_file and not self._has_tokenizer(client):
                tok = None  # type: ignore[assignment]
            n = self.spec.num_prompts
            vocab = None
            if self.spec.dataset == "random":  # check(): never with a prompts file
                folder = self.spec.tokenizer or self.model_root
                if not folder:
                    raise ConfigError("--dataset-name random: the server does not say where "
                                      "its model lies; give --tokenizer PATH")
                vocab = tokenizer_vocab(folder)
            reqs = build_requests(self.spec, tok, n + self.spec.warmups, self.spec.seed,
                                  vocab)
        warm, reqs = reqs[n:], reqs[:n]
        # as `vllm bench serve` does: objects alive now are not traversed again by the run's
        # collections (one full collection of this process's heap pauses it ~30 ms here). No
        # gc.collect() first, unlike vLLM's: in the panel that would stall the UI thread.
        gc.freeze()
        try:
            records, duration, started = asyncio.run(self._run_async(warm, reqs))
        finally:
            gc.unfreeze()
        metrics = compute_metrics(records, duration, self.slo, self.percentiles)
        return {
            "date": time.strftime("%Y%m%d-%H%M%S", time.localtime(started)),
            "backend": "vllm", "endpoint_type": "openai", "base_url": self.url,
            "model_id": self.model, "server_version": version.get("version"),
            "num_prompts": n,
            "request_rate": "inf" if math.isinf(self.spec.request_rate)
            else self.spec.request_rate,
            "burstiness": self.spec.burstiness, "max_concurrency": self.spec.concurrency,
            "input_len": self.spec.input_len, "output_len": self.spec.output_len,
            "slo_ms": self.slo or None, "ended_early": self.ended,
            "client_cpu_s": self.client_cpu_s,  # what the measured run cost the client's thread
            **metrics,
            "load": asdict(self.spec),
            "requests": [asdict(r) for r in records],
        }

    def _has_tokenizer(self, client: httpx.Client) -> bool:
        try:
            return client.post("/tokenize", json={"model": self.model, "prompt": "a"}
                               ).status_code == 200
        except httpx.HTTPError:
            return False

    async def _run_async(self, warm: list[Request], reqs: list[Request]
                         ) -> tuple[list[RequestRecord], float, float]:
        import aiohttp  # the worker's import, not the GUI's start-up

        # aiohttp, as `vllm bench serve`: per request ~1 ms less TTFT than httpx and a quarter
        # to a half of its CPU (benchmarks/client_cost.py); on a small box that CPU is the
        # server's. Connections are reused, any number at once (the semaphore bounds them).
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60,
                                         ssl=tls_verify(self.url))
        # as httpx's read timeout was: a request fails after that long without a byte
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10.0,
                                        sock_read=self.spec.request_timeout_s)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout,
                                         headers=self.headers, trust_env=True) as client:
            # warm-ups at the load's concurrency, as `vllm bench serve` sends them: the batch
            # shapes the measured run will use are warm too, not only batch 1
            warm_sem = asyncio.Semaphore(self.spec.concurrency or max(1, len(warm)))

            async def warm_one(i: int, r: Request) -> RequestRecord:
                async with warm_sem:
                    return await self._one(client, -1 - i, r, time.perf_counter())

            for rec in await asyncio.gather(*(warm_one(i, r) for i, r in enumerate(warm))):
                if not rec.success:
                    raise ServerError(f"warm-up request failed: {rec.error}")
            records: list[RequestRecord] = []
            sem = asyncio.Semaphore(self.spec.concurrency or len(reqs))
            rng = np.random.default_rng(self.spec.seed)
            stop = asyncio.Event()
            t0 = time.perf_counter()
            started = time.time()
            cpu0 = time.thread_time()  # the loop's thread: the client's own CPU, not the panel's

            async def one(i: int, r: Request) -> None:
                try:
                    async with sem:
                        if stop.is_set():
                            raise asyncio.CancelledError
                        rec = await self._one(client, i, r, t0)  # handles its own cancel
                except asyncio.CancelledError:
                    records.append(RequestRecord(i, r.prompt_len, r.output_len,
                                                 error=f"not sent: {self.ended or 'cancelled'}"))
                    return
                records.append(rec)
                if not rec.success and not stop.is_set() and not await self._alive(client):
                    self.ended = self.ended or f"server gone ({rec.error})"
                    stop.set()
                if self.stop_when is not None and not stop.is_set():
                    why = self.stop_when(records)
                    if why:
                        self.ended = self.ended or why
                        stop.set()
                if self.on_record is not None:
                    self.on_record(rec, len(records), len(reqs))

            # cancel() wakes the loop itself: no timer polls for it, since at batch 1 on a
            # small box every wake-up of the client is taken from the server's cores
            cancelled = asyncio.Event()
            loop = asyncio.get_running_loop()
            with self._lock:
                self._wake = lambda: loop.call_soon_threadsafe(cancelled.set)
                if self._cancel.is_set():
                    cancelled.set()

            async def watch_cancel() -> None:
                await cancelled.wait()
                self.ended = self.ended or "cancelled"
                stop.set()

            watcher = asyncio.create_task(watch_cancel())
            tasks = []
            for i, r in enumerate(reqs):
                if stop.is_set():
                    records.append(RequestRecord(i, r.prompt_len, r.output_len,
                                                 error=f"not sent: {self.ended}"))
                    continue
                tasks.append(asyncio.create_task(one(i, r)))
                if not math.isinf(self.spec.request_rate) and i < len(reqs) - 1:
                    gap = rng.gamma(self.spec.burstiness,
                                    1.0 / (self.spec.request_rate * self.spec.burstiness))
                    try:
                        await asyncio.wait_for(stop.wait(), timeout=gap)
                    except asyncio.TimeoutError:
                        pass
            try:
                await self._gather_or_abort(tasks, watcher)
            finally:
                with self._lock:
                    self._wake = None
            duration = time.perf_counter() - t0
            self.client_cpu_s = time.thread_time() - cpu0
            stop.set()
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
        records.sort(key=lambda r: r.index)
        return records, duration, started

    @staticmethod
    async def _gather_or_abort(tasks: list[asyncio.Task[None]], watcher: asyncio.Task[None]
                               ) -> None:
        """Wait for the requests; once the cancel watcher ends, abort those in flight (they
        count as failed)."""
        everything = asyncio.gather(*tasks, return_exceptions=True)
        await asyncio.wait({everything, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if not everything.done():
            for t in tasks:
                t.cancel()
        await everything

    async def _alive(self, client: aiohttp.ClientSession) -> bool:
        import aiohttp

        try:
            async with client.get(self.url + "/health",
                                  timeout=aiohttp.ClientTimeout(total=5.0)) as r:
                return r.status == 200
        except (aiohttp.ClientError, asyncio.TimeoutError):
            return False

    async def _one(self, client: aiohttp.ClientSession, index: int, req: Request, t0: float
                   ) -> RequestRecord:
        import aiohttp

        body: dict[str, Any] = {"model": self.model, "prompt": req.prompt,
                                "max_tokens": req.output_len, "stream": True,
                                "stream_options": {"include_usage": True},
                                "repetition_penalty": 1.0}
        if self.spec.ignore_eos:
            body["ignore_eos"] = True
        if self.spec.temperature is not None:
            body["temperature"] = self.spec.temperature
        rec = RequestRecord(index, req.prompt_len, req.output_len)
        url = self.url + "/v1/completions"
        st = time.perf_counter()
        rec.start_time = st - t0
        last = st
        first = False
        try:
            async with client.post(url, json=body) as resp:
                if resp.status != 200:
                    text = await resp.text(errors="replace")
                    rec.error = f"HTTP {resp.status}: {text[:160]}"
                    return rec
                pieces: list[str] = []
                async for now, message in _sse_messages(resp):
                    kind, data = sse_message(message)
                    if kind == "token":
                        if not first:
                            first = True
                            rec.ttft = now - st
                        else:
                            rec.itl.append(now - last)
                        last = now
                        pieces.append(data["choices"][0].get("text") or "")
                    elif kind == "usage":
                        usage = data["usage"]
                        rec.output_tokens = int(usage.get("completion_tokens") or 0)
                        if usage.get("prompt_tokens") is not None:
                            rec.prompt_len = int(usage["prompt_tokens"])
                    elif kind == "error":
                        rec.error = f"server error mid-stream: {_error_text(data)}"[:200]
                rec.generated_text = "".join(pieces)
                if rec.error:
                    return rec
        except asyncio.CancelledError:
            rec.error = "cancelled in flight"
            return rec
        except (aiohttp.ClientError, asyncio.TimeoutError, json.JSONDecodeError) as e:
            rec.error = f"{type(e).__name__}: {e}"[:200]
            return rec
        if not first:
            rec.error = "no token streamed"
            return rec
        rec.success = True
        rec.latency = last - st
        if not rec.output_tokens:
            rec.output_tokens = 1 + len(rec.itl)
        return rec


async def _sse_messages(resp: Any) -> AsyncIterator[tuple[float, str]]:
    """The server-sent messages of a streamed response, each with when it arrived (the read
    that completed it), split on blank lines after an incremental UTF-8 decode."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    buf, now = "", time.perf_counter()
    async for chunk in resp.content.iter_any():
        now = time.perf_counter()
        buf += decoder.decode(chunk)
        *messages, buf = buf.split("\n\n")
        for message in messages:
            yield now, message
    buf += decoder.decode(b"", final=True)
    if buf.strip():  # a last message without its blank line
        yield now, buf


def sse_message(message: str) -> tuple[str | None, dict[str, Any]]:
    """One server-sent message of a streamed completion, read as ``vllm bench serve`` reads
    it: its JSON payload and what it carries: "token" (a chunk with a choice, even one with
    empty text), "usage" (the closing usage chunk), "error" (the server gave up mid-stream) or
    None (``[DONE]``, SSE comments used as pings, other fields)."""
    message = message.strip()
    if not message.startswith("data:"):
        return None, {}
    payload = message[5:].strip()
    if not payload or payload == "[DONE]":
        return None, {}
    data = json.loads(payload)
    if not isinstance(data, dict):
        return None, {}
    if data.get("choices"):
        return "token", data
    if data.get("usage"):
        return "usage", data
    if data.get("error") or data.get("object") == "error":
        return "error", data
    return None, data


def _error_text(data: dict[str, Any]) -> str:
    err = data.get("error", data)
    return str(err.get("message") or err) if isinstance(err, dict) else str(err)


def records_from(result: dict[str, Any]) -> list[RequestRecord]:
    """The per-request records of a saved result."""
    return [RequestRecord(**r) for r in result.get("requests", [])]


VLLM_KEYS = ("completed", "failed", "duration", "total_input_tokens", "total_output_tokens",
             "request_throughput", "request_goodput", "output_throughput",
             "total_token_throughput")


def summary_lines(result: dict[str, Any]) -> list[str]:
    """The human summary, laid out like ``vllm bench serve``'s."""
    w = 40
    lines = [" Serving Benchmark Result ".center(50, "="),
             f"{'Successful requests:':<{w}}{result['completed']}",
             f"{'Failed requests:':<{w}}{result['failed']}"]
    if result.get("max_concurrency"):
        lines.append(f"{'Maximum request concurrency:':<{w}}{result['max_concurrency']}")
    lines += [f"{'Benchmark duration (s):':<{w}}{result['duration']:.2f}",
              f"{'Total input tokens:':<{w}}{result['total_input_tokens']}",
              f"{'Total generated tokens:':<{w}}{result['total_output_tokens']}",
              f"{'Request throughput (req/s):':<{w}}{result['request_throughput']:.2f}"]
    if result.get("request_goodput") is not None:
        lines.append(f"{'Request goodput (req/s):':<{w}}{result['request_goodput']:.2f}")
    lines += [f"{'Output token throughput (tok/s):':<{w}}{result['output_throughput']:.2f}",
              f"{'Total token throughput (tok/s):':<{w}}{result['total_token_throughput']:.2f}"]
    for name, title in (("ttft", "Time to First Token"),
                        ("tpot", "Time per Output Token (excl. 1st token)"),
                        ("itl", "Inter-token Latency"), ("e2el", "End-to-end Latency")):
        lines.append(title.center(50, "-"))
        for key in sorted((k for k in result if k.endswith(f"_{name}_ms")), key=_stat_order):
            label = key.split("_")[0]
            label = {"mean": "Mean", "median": "Median", "std": "Std"}.get(label, label.upper())
            lines.append(f"{label + ' ' + name.upper() + ' (ms):':<{w}}{result[key]:.2f}")
    if result.get("ended_early"):
        lines.append(f"ended early: {result['ended_early']}")
    lines.append("=" * 50)
    return lines


def _stat_order(key: str) -> tuple[int, float]:
    head = key.split("_")[0]
    order = {"mean": 0, "median": 1, "std": 2}
    if head in order:
        return order[head], 0.0
    return 3, float(head[1:])
