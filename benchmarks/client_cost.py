"""What the load generator's client itself adds to TTFT and costs in CPU, against `vllm bench
serve`'s request function, on a server that answers at once (no model: only the clients differ).

    python benchmarks/client_cost.py [--requests 300] [--rounds 3] [--concurrency 1 4 16]

The server is a bare asyncio process streaming 16 SSE chunks 5 ms apart, as vLLM's completions route
does. Per client and concurrency it prints the median and p90 of TTFT (send -> first chunk) and the
client's CPU time per request. Clients: Quantdeck's (`quantdeck.core.bench.client`), vLLM's
(`vllm.benchmarks.lib.endpoint_request_func`, needs vllm importable) and, for reference, the same
request through httpx."""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import statistics
import time
from collections.abc import Awaitable, Callable

from quantdeck.core.bench.client import Bench, LoadSpec, Request

TOKEN = (
    b'data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":'
    b'[{"index":0,"text":" a","logprobs":null,"finish_reason":null}],"usage":null}\n\n'
)
USAGE = (
    b'data: {"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":'
    b'[],"usage":{"prompt_tokens":128,"total_tokens":144,"completion_tokens":16}}\n\n'
    b"data: [DONE]\n\n"
)
PROMPT = "hello " * 127


def serve(port: int) -> None:
    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await r.readuntil(b"\r\n\r\n")
                n = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        n = int(line.split(b":")[1])
                await r.readexactly(n)
                w.write(
                    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                    b"transfer-encoding: chunked\r\n\r\n"
                )
                for _ in range(16):
                    w.write(b"%x\r\n%s\r\n" % (len(TOKEN), TOKEN))
                    await w.drain()
                    await asyncio.sleep(0.005)
                w.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(USAGE), USAGE))
                await w.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", port)
        await server.serve_forever()

    asyncio.run(main())


OneFn = Callable[[], Awaitable[float]]


async def _load(
    make: Callable[[], Awaitable[tuple[OneFn, Callable[[], Awaitable[None]]]]], c: int, n: int
) -> tuple[list[float], float]:
    one, close = await make()
    sem = asyncio.Semaphore(c)
    out: list[float] = []

    async def limited() -> None:
        async with sem:
            out.append(await one())

    await asyncio.gather(*(limited() for _ in range(2 * c)))  # connections up, code warm
    out.clear()
    cpu = time.process_time()
    await asyncio.gather(*(limited() for _ in range(n)))
    cpu = time.process_time() - cpu
    await close()
    return out, cpu


def on_aiohttp(sender: Callable[[], Callable]) -> Callable:
    """A client of one aiohttp session; ``sender()`` returns ``send(session) -> TTFT``."""

    async def make():
        import aiohttp

        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, ssl=False))
        send = sender()

        async def one() -> float:
            return await send(session)

        return one, session.close

    return make


def quantdeck(url: str) -> Callable:
    def sender() -> Callable:
        bench, req = Bench(url, "m", LoadSpec(output_len=16)), Request(PROMPT, 128, 16)

        async def send(session) -> float:
            rec = await bench._one(session, 0, req, time.perf_counter())
            assert rec.success, rec.error
            return rec.ttft

        return send

    return on_aiohttp(sender)


def vllm_bench(url: str) -> Callable:
    def sender() -> Callable:
        from vllm.benchmarks.lib.endpoint_request_func import (
            RequestFuncInput,
            async_request_openai_completions,
        )

        inp = RequestFuncInput(
            prompt=PROMPT,
            api_url=url + "/v1/completions",
            prompt_len=128,
            output_len=16,
            model="m",
            ignore_eos=True,
        )

        async def send(session) -> float:
            out = await async_request_openai_completions(inp, session)
            assert out.success, out.error
            return out.ttft

        return send

    return on_aiohttp(sender)


def httpx_client(url: str) -> Callable:
    async def make():
        import httpx

        client = httpx.AsyncClient(
            base_url=url,
            timeout=60,
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=None),
        )
        body = {
            "model": "m",
            "prompt": PROMPT,
            "max_tokens": 16,
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": True,
        }

        async def one() -> float:
            st, ttft = time.perf_counter(), 0.0
            async with client.stream("POST", "/v1/completions", json=body) as resp:
                async for _ in resp.aiter_raw():
                    ttft = ttft or time.perf_counter() - st
            return ttft

        return one, client.aclose

    return make


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 4, 16])
    ap.add_argument("--port", type=int, default=18777)
    a = ap.parse_args()
    server = mp.Process(target=serve, args=(a.port,), daemon=True)
    server.start()
    time.sleep(0.5)
    url = f"http://127.0.0.1:{a.port}"
    clients = {
        "quantdeck": quantdeck(url),
        "vllm bench": vllm_bench(url),
        "httpx": httpx_client(url),
    }
    try:
        for c in a.concurrency:
            figs: dict[str, list[tuple[float, float, float]]] = {k: [] for k in clients}
            for _ in range(a.rounds):
                for name, make in clients.items():
                    ttft, cpu = asyncio.run(_load(make, c, a.requests))
                    ttft.sort()
                    cpu = cpu / a.requests * 1000
                    figs[name].append(
                        (statistics.median(ttft) * 1000, ttft[int(0.9 * len(ttft))] * 1000, cpu)
                    )
            for name, rows in figs.items():
                med = statistics.median(r[0] for r in rows)
                p90 = statistics.median(r[1] for r in rows)
                cpu = statistics.median(r[2] for r in rows)
                print(
                    f"c={c:<3d} {name:<11s} TTFT median {med:5.2f} ms  p90 {p90:5.2f} ms  "
                    f"client CPU {cpu:5.2f} ms/request  (medians of {a.rounds} rounds)",
                    flush=True,
                )
    finally:
        server.terminate()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
