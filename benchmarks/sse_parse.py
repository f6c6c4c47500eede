"""CPU a streamed message costs the client: Quantdeck's reader (quantdeck.core.bench.client) against
the one of `vllm bench serve` (its StreamedResponseHandler and request loop), on a synthetic stream
of one completion chunk per read, as batch-1 decoding delivers them; "bare" is the loop alone.

    python benchmarks/sse_parse.py   # prints microseconds of CPU per message, twice each
"""

from __future__ import annotations

import asyncio
import json
import time

from vllm.benchmarks.lib.endpoint_request_func import StreamedResponseHandler

from quantdeck.core.bench.client import _sse_messages, sse_message

MESSAGE = (
    b'data: {"id":"cmpl-8f2a","object":"text_completion","created":1764700000,'
    b'"model":"demo","choices":[{"index":0,"text":" word","logprobs":null,'
    b'"finish_reason":null,"stop_reason":null,"prompt_token_ids":null,'
    b'"token_ids":null}],"usage":null}\n\n'
)
N = 20000  # messages a pass


class Content:
    async def iter_any(self):
        for _ in range(N):
            yield MESSAGE
            await asyncio.sleep(0)


class Response:
    content = Content()


async def bare() -> None:
    async for _ in Content().iter_any():
        pass


async def ours() -> None:
    pieces = []
    async for _, message in _sse_messages(Response()):
        kind, data = sse_message(message)
        if kind == "token":
            pieces.append(data["choices"][0].get("text") or "")


async def theirs() -> None:  # vllm/benchmarks/lib/endpoint_request_func.py, completions
    handler, text, itl, last = StreamedResponseHandler(), "", [], time.perf_counter()
    async for chunk in Content().iter_any():
        for message in handler.add_chunk(chunk.strip()):
            if message.startswith(":"):
                continue
            payload = message.removeprefix("data: ")
            if payload != "[DONE]":
                data = json.loads(payload)
                if choices := data.get("choices"):
                    now = time.perf_counter()
                    itl.append(now - last)
                    last = now
                    text += choices[0].get("text") or ""


if __name__ == "__main__":
    for fn in (bare, ours, theirs) * 2:
        t = time.thread_time()
        asyncio.run(fn())
        print(f"{fn.__name__:7s}{(time.thread_time() - t) / N * 1e6:6.2f} us/msg")
