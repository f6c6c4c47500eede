"""CPU a streamed message costs the client: Quantdeck's reader (core.bench) against the one of
`vllm bench serve` (its StreamedResponseHandler and request loop), on a synthetic stream of
one completion chunk per read, as batch-1 decoding delivers them; "bare" is the loop alone.

    python benchmarks/sse_parse.py   # prints microseconds of CPU per message, twice each
"""
import asyncio, time, json
from core.bench import _sse_messages, sse_message
from vllm.benchmarks.lib.endpoint_request_func import StreamedResponseHandler
msg = ('data: {"id":"cmpl-8f2a","object":"text_completion","created":1764700000,"model":"demo","choices":[{"index":0,"text":" word","logprobs":null,"finish_reason":null,"stop_reason":null,"prompt_token_ids":null,"token_ids":null}],"usage":null}\n\n').encode()
N = 20000  # messages a pass
class C:
    async def iter_any(self):
        for _ in range(N):
            yield msg
            await asyncio.sleep(0)
R = type("R", (), {"content": C()})()
async def ours():
    pieces = []
    async for now, m in _sse_messages(R):
        kind, data = sse_message(m)
        if kind == "token": pieces.append(data["choices"][0].get("text") or "")
async def theirs():
    h = StreamedResponseHandler(); text = ""; itl=[]; last=time.perf_counter()
    async for chunk in C().iter_any():
        chunk = chunk.strip()
        for message in h.add_chunk(chunk):
            if message.startswith(":"): continue
            c = message.removeprefix("data: ")
            if c != "[DONE]":
                data = json.loads(c)
                if choices := data.get("choices"):
                    t = time.perf_counter(); itl.append(t-last); last=t; text += choices[0].get("text") or ""
async def bare():
    async for chunk in C().iter_any(): pass
for f in (bare, ours, theirs, bare, ours, theirs):
    t = time.thread_time(); asyncio.run(f()); print(f.__name__, round((time.thread_time()-t)/N*1e6, 2), "us/msg")
