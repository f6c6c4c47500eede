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
  reason as their error. Whatever goes wrong with one request (a malformed or oversized
  stream message, an ``error`` object, a reset connection, a bug) fails that request with its
  reason; it never escapes the request's task, so ``completed + failed`` is always the number
  of requests.

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
import logging
import math
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

import httpx
import numpy as np

from quantdeck.core.errors import ConfigError, ServerError
from quantdeck.core.http import auth_headers, tls_verify

if TYPE_CHECKING:
    import aiohttp

from quantdeck.core.bench.datasets import _Tokenizer, build_requests, tokenizer_vocab
from quantdeck.core.bench.load import DEFAULT_PERCENTILES, LoadSpec, Request, RequestRecord
from quantdeck.core.bench.results import BenchResult
from quantdeck.core.bench.stats import compute_metrics

log = logging.getLogger("quantdeck.bench")

# What one response may bring (vLLM's messages are well under 1 KiB each): past these the
# request fails rather than the client's memory filling up.
MAX_MESSAGE_CHARS = 4 * 2**20  # one server-sent message
MAX_RESPONSE_BYTES = 64 * 2**20  # one response's whole stream
ERROR_BODY_BYTES = 4096  # what is read of a non-200 answer's body


class StreamError(ValueError):
    """A streamed answer the client cannot read as a completion: the request fails with this
    message as its reason."""


# -- the run ---------------------------------------------------------------------------------

ProgressFn = Callable[[RequestRecord, int, int], None]


class Bench:
    """One measured run. ``run()`` blocks (call it from a worker thread); ``cancel()`` from any
    thread ends it early with what was measured. ``stop_when(records)`` may end it early too
    (the tuner drops hopeless points that way)."""

    def __init__(
        self,
        url: str,
        model: str,
        spec: LoadSpec,
        *,
        api_key: str | None = None,
        slo: dict[str, float] | None = None,
        percentiles: Sequence[float] = DEFAULT_PERCENTILES,
        on_record: ProgressFn | None = None,
        stop_when: Callable[[list[RequestRecord]], str | None] | None = None,
        resume: int = 0,
    ) -> None:
        """``resume``: how many times one request whose stream is cut (the connection lost,
        mid-stream or before its first token, or an HTTP 5xx from a router that ran out of
        retries) is continued: sent again with what arrived appended to its prompt and the
        tokens still owed as ``max_tokens``, as a client of a fleet would, so that the user
        sees one answer. Its TTFT stays the first attempt's; the gap is one long ITL.
        ``RequestRecord.resumed`` counts the continuations; 0 (the default) fails such a
        request, as ``vllm bench serve`` does."""
        spec.check()
        if resume < 0:
            raise ConfigError("--resume-streams must be 0 or more")
        self.url, self.model, self.spec = url.rstrip("/"), model, spec
        self.api_key, self.slo, self.percentiles = api_key, dict(slo or {}), tuple(percentiles)
        self.on_record, self.stop_when, self.resume = on_record, stop_when, resume
        self._cancel = threading.Event()
        self._lock = threading.Lock()
        self._wake: Callable[[], None] | None = None  # wakes the running loop on cancel
        self.ended: str | None = None  # why the run ended early
        self.client_cpu_s: float | None = None
        self.model_root: str | None = None
        self._failed_callbacks: set[str] = set()

    def cancel(self) -> None:
        """From any thread: stop sending, abort the requests in flight (they count as failed)."""
        with self._lock:
            self._cancel.set()
            if self._wake is not None:
                with contextlib.suppress(RuntimeError):  # its loop has just closed
                    self._wake()

    @property
    def headers(self) -> dict[str, str]:
        return auth_headers(self.api_key)

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
        try:
            models = [m for m in r.json().get("data", []) if isinstance(m, dict)]
        except (ValueError, AttributeError, TypeError):
            raise ServerError(f"{self.url}/v1/models: not an OpenAI model list") from None
        names = [m.get("id") for m in models]
        # where the served model lies (vLLM's "root"): its tokenizer files, if on this machine;
        # a LoRA adapter's root is the adapter folder: its base model's ("parent") has them
        roots = {m.get("id"): m.get("root") for m in models}
        entry = next((m for m in models if m.get("id") == self.model), {})
        self.model_root = roots.get(entry.get("parent")) or entry.get("root")
        if self.model not in names:
            raise ConfigError(
                f"model '{self.model}' is not served at {self.url} "
                f"(it serves: {', '.join(map(str, names)) or 'nothing'})"
            )
        try:
            v = client.get("/version")
            return v.json() if v.status_code == 200 else {}
        except (httpx.HTTPError, ValueError):
            return {}

    def run(self) -> BenchResult:
        with httpx.Client(
            base_url=self.url, headers=self.headers, timeout=30.0, verify=tls_verify(self.url)
        ) as client:
            version = self.check_server(client)
            tok = _Tokenizer(client, self.model)
            if self.spec.prompts_file and not self._has_tokenizer(client):
                tok = None  # type: ignore[assignment]
            n = self.spec.num_prompts
            vocab = None
            if self.spec.dataset == "random":  # check(): never with a prompts file
                folder = self.spec.tokenizer or self.model_root
                if not folder:
                    raise ConfigError(
                        "--dataset-name random: the server does not say where "
                        "its model lies; give --tokenizer PATH"
                    )
                vocab = tokenizer_vocab(folder)
            reqs = build_requests(self.spec, tok, n + self.spec.warmups, self.spec.seed, vocab)
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
        # the keys in the order a run file was always written in (BenchResult keeps it)
        return BenchResult.from_json(
            {
                "date": time.strftime("%Y%m%d-%H%M%S", time.localtime(started)),
                # wall clock at the first send (requests' start_time is after)
                "started_at": started,
                "backend": "vllm",
                "endpoint_type": "openai",
                "base_url": self.url,
                "model_id": self.model,
                "server_version": version.get("version"),
                "num_prompts": n,
                "request_rate": "inf"
                if math.isinf(self.spec.request_rate)
                else self.spec.request_rate,
                "burstiness": self.spec.burstiness,
                "max_concurrency": self.spec.concurrency,
                "input_len": self.spec.input_len,
                "output_len": self.spec.output_len,
                "slo_ms": self.slo or None,
                "ended_early": self.ended,
                "client_cpu_s": self.client_cpu_s,  # what the measured run cost the client's thread
                **metrics,
                "load": asdict(self.spec),
                "requests": [asdict(r) for r in records],
            }
        )

    def _has_tokenizer(self, client: httpx.Client) -> bool:
        try:
            return (
                client.post("/tokenize", json={"model": self.model, "prompt": "a"}).status_code
                == 200
            )
        except httpx.HTTPError:
            return False

    async def _run_async(
        self, warm: list[Request], reqs: list[Request]
    ) -> tuple[list[RequestRecord], float, float]:
        import aiohttp  # the worker's import, not the GUI's start-up

        # aiohttp, as `vllm bench serve`: per request ~1 ms less TTFT than httpx and a quarter
        # to a half of its CPU (benchmarks/client_cost.py); on a small box that CPU is the
        # server's. Connections are reused, any number at once (the semaphore bounds them).
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60, ssl=tls_verify(self.url))
        # as httpx's read timeout was: a request fails after that long without a byte
        timeout = aiohttp.ClientTimeout(
            total=None, sock_connect=10.0, sock_read=self.spec.request_timeout_s
        )
        async with aiohttp.ClientSession(
            connector=connector, timeout=timeout, headers=self.headers, trust_env=True
        ) as client:
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
                    records.append(
                        RequestRecord(
                            i,
                            r.prompt_len,
                            r.output_len,
                            error=f"not sent: {self.ended or 'cancelled'}",
                        )
                    )
                    return
                records.append(rec)
                if not rec.success and not stop.is_set() and not await self._alive(client):
                    self.ended = self.ended or f"server gone ({rec.error})"
                    stop.set()
                if self.stop_when is not None and not stop.is_set():
                    why = self._call("stop_when", self.stop_when, records)
                    if why:
                        self.ended = self.ended or why
                        stop.set()
                if self.on_record is not None:
                    self._call("on_record", self.on_record, rec, len(records), len(reqs))

            # cancel() wakes the loop itself: no timer polls for it, since at batch 1 on a
            # small box every wake-up of the client is taken from the server's cores
            cancelled = asyncio.Event()
            loop = asyncio.get_running_loop()

            def wake() -> None:
                loop.call_soon_threadsafe(cancelled.set)

            with self._lock:
                self._wake = wake
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
                    records.append(
                        RequestRecord(
                            i, r.prompt_len, r.output_len, error=f"not sent: {self.ended}"
                        )
                    )
                    continue
                tasks.append(asyncio.create_task(one(i, r)))
                if not math.isinf(self.spec.request_rate) and i < len(reqs) - 1:
                    gap = rng.gamma(
                        self.spec.burstiness, 1.0 / (self.spec.request_rate * self.spec.burstiness)
                    )
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
        # a task cancelled before its first step never runs its body: it counts as not sent
        seen = {r.index for r in records}
        records += [
            RequestRecord(
                i, r.prompt_len, r.output_len, error=f"not sent: {self.ended or 'cancelled'}"
            )
            for i, r in enumerate(reqs)
            if i not in seen
        ]
        records.sort(key=lambda r: r.index)
        return records, duration, started

    def _call(self, name: str, fn: Callable[..., Any], *args: Any) -> Any:
        """A caller's callback: its error is logged once with its traceback, and the run
        goes on (as an observer of a :class:`~quantdeck.core.events.Publisher`)."""
        try:
            return fn(*args)
        except Exception:
            if name not in self._failed_callbacks:
                self._failed_callbacks.add(name)
                log.exception("the bench's %s callback failed", name)
            return None

    @staticmethod
    async def _gather_or_abort(
        tasks: list[asyncio.Task[None]], watcher: asyncio.Task[None]
    ) -> None:
        """Wait for the requests; once the cancel watcher ends, abort those in flight (they
        count as failed)."""
        everything = asyncio.gather(*tasks, return_exceptions=True)
        first: set[asyncio.Future[Any]] = {everything, watcher}
        await asyncio.wait(first, return_when=asyncio.FIRST_COMPLETED)
        if not everything.done():
            for t in tasks:
                t.cancel()
        for result in await everything:  # a request task never raises: one that did is a bug
            if isinstance(result, Exception):
                raise result

    async def _alive(self, client: aiohttp.ClientSession) -> bool:
        import aiohttp

        try:
            async with client.get(
                self.url + "/health", timeout=aiohttp.ClientTimeout(total=5.0)
            ) as r:
                return r.status == 200
        except (aiohttp.ClientError, asyncio.TimeoutError):
            return False

    async def _one(
        self, client: aiohttp.ClientSession, index: int, req: Request, t0: float
    ) -> RequestRecord:
        import aiohttp

        body: dict[str, Any] = {
            "model": self.model,
            "prompt": req.prompt,
            "max_tokens": req.output_len,
            "stream": True,
            "stream_options": {"include_usage": True},
            "repetition_penalty": 1.0,
        }
        if self.spec.ignore_eos:
            body["ignore_eos"] = True
        if self.spec.temperature is not None:
            body["temperature"] = self.spec.temperature
        rec = RequestRecord(index, req.prompt_len, req.output_len)
        url = self.url + "/v1/completions"
        st = time.perf_counter()
        rec.start_time = st - t0
        got = _Received(st)
        while True:
            cut = False
            try:
                await self._stream(client, url, body, rec, got)
                cut = rec.error.startswith("HTTP 5")
            except asyncio.CancelledError:
                rec.error = "cancelled in flight"
            except StreamError as e:
                rec.error = str(e)
            except json.JSONDecodeError as e:
                rec.error = f"malformed stream message: not JSON ({e.msg})"
            except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError) as e:
                rec.error, cut = f"{type(e).__name__}: {e}", True  # the connection was lost
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError) as e:
                rec.error = f"{type(e).__name__}: {e}"
            except Exception as e:  # whatever it was, it fails this request, not the run
                rec.error = f"client error: {type(e).__name__}: {e}"
            rec.generated_text = "".join(got.pieces)
            prompt = req.prompt  # a prompt of token ids is not continued (no text to append)
            if not (cut and rec.resumed < self.resume and isinstance(prompt, str)):
                break
            if self._cancel.is_set():
                break
            rec.resumed, rec.error = rec.resumed + 1, ""
            owed = req.output_len - got.tokens
            if owed <= 0:  # every token arrived; only the stream's end was lost
                self._finish(rec, got)
                break
            body = {**body, "prompt": prompt + rec.generated_text, "max_tokens": owed}
        rec.error = rec.error[:200]
        return rec

    @staticmethod
    def _finish(rec: RequestRecord, got: _Received) -> None:
        rec.success = True
        rec.latency = got.last - got.sent
        if not rec.output_tokens:
            rec.output_tokens = got.tokens

    async def _stream(
        self,
        client: aiohttp.ClientSession,
        url: str,
        body: dict[str, Any],
        rec: RequestRecord,
        got: _Received,
    ) -> None:
        """Send one request and read its stream into ``rec`` and ``got`` (what arrived, kept
        across a continuation: success when a token streamed and no error); raises on what it
        cannot read."""
        before = got.tokens  # tokens of earlier attempts (a continuation's usage counts its own)
        async with client.post(url, json=body) as resp:
            if resp.status != 200:
                text = (await resp.content.read(ERROR_BODY_BYTES)).decode(errors="replace")
                rec.error = f"HTTP {resp.status}: {text[:160]}"
                return
            async for now, message in _sse_messages(resp):
                kind, data = sse_message(message)
                if kind == "token":
                    if not got.pieces:  # the first token
                        rec.ttft = now - got.sent
                    else:
                        rec.itl.append(now - got.last)
                    got.last = now
                    got.tokens += 1
                    got.pieces.append(data["choices"][0].get("text") or "")
                elif kind == "usage":
                    usage = data["usage"]
                    rec.output_tokens = before + (usage.get("completion_tokens") or 0)
                    if usage.get("prompt_tokens") is not None and not before:
                        rec.prompt_len = usage["prompt_tokens"]
                elif kind == "error":
                    rec.error = f"server error mid-stream: {_error_text(data)}"
        if rec.error:
            return
        if not got.pieces:
            rec.error = "no token streamed"
            return
        self._finish(rec, got)


@dataclass
class _Received:
    """What one request's stream brought so far, across its continuations: the text pieces,
    how many token messages, when the first attempt was sent and the last token came."""

    sent: float
    last: float = 0.0
    tokens: int = 0
    pieces: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.last = self.sent


async def _sse_messages(resp: Any) -> AsyncIterator[tuple[float, str]]:
    """The server-sent messages of a streamed response, each with when it arrived (the read
    that completed it), split on blank lines after an incremental UTF-8 decode. Raises
    :class:`StreamError` past :data:`MAX_MESSAGE_CHARS` in one message or
    :data:`MAX_RESPONSE_BYTES` in all."""
    decoder = codecs.getincrementaldecoder("utf-8")("replace")
    buf, now, total = "", time.perf_counter(), 0
    async for chunk in resp.content.iter_any():
        now = time.perf_counter()
        total += len(chunk)
        if total > MAX_RESPONSE_BYTES:
            raise StreamError(f"the response passed {MAX_RESPONSE_BYTES // 2**20} MiB")
        buf += decoder.decode(chunk)
        *messages, buf = buf.split("\n\n")
        for message in (*messages, buf):
            if len(message) > MAX_MESSAGE_CHARS:
                raise StreamError(f"a stream message over {MAX_MESSAGE_CHARS // 2**20} MiB")
        for message in messages:
            yield now, message
    buf += decoder.decode(b"", final=True)
    if buf.strip():  # a last message without its blank line
        yield now, buf


def sse_message(message: str) -> tuple[str | None, dict[str, Any]]:
    """One server-sent message of a streamed completion, read as ``vllm bench serve`` reads
    it: its JSON payload and what it carries: "token" (a chunk with a choice, even one with
    empty text), "usage" (the closing usage chunk), "error" (the server gave up mid-stream) or
    None (``[DONE]``, SSE comments used as pings, other fields). What it returns has the
    shapes its kind promises (a "token"'s first choice is an object whose text is a string or
    None; a "usage"'s token counts are whole numbers >= 0 or None); a message that does not
    raises :class:`StreamError` (``json.JSONDecodeError`` when it is not JSON)."""
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
        choices = data["choices"]
        if not isinstance(choices, list) or not isinstance(choices[0], dict):
            raise StreamError(f"malformed stream message: 'choices' is {_short(choices)}")
        text = choices[0].get("text")
        if text is not None and not isinstance(text, str):
            raise StreamError(f"malformed stream message: 'text' is {_short(text)}")
        return "token", data
    if data.get("usage"):
        usage = data["usage"]
        if not isinstance(usage, dict):
            raise StreamError(f"malformed stream message: 'usage' is {_short(usage)}")
        for key in ("completion_tokens", "prompt_tokens"):
            v = usage.get(key)
            if v is not None and (type(v) is not int or v < 0):
                raise StreamError(f"malformed stream message: '{key}' is {_short(v)}")
        return "usage", data
    if data.get("error") or data.get("object") == "error":
        return "error", data
    return None, data


def _short(value: Any) -> str:
    """A value as a reason shows it: its JSON, cut short."""
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _error_text(data: dict[str, Any]) -> str:
    err = data.get("error", data)
    return str(err.get("message") or err) if isinstance(err, dict) else str(err)
