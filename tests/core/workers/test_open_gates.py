"""The bounds on what answers without the key (:class:`~quantdeck.core.workers.engine.KeyGuard`'s
open gates), with no server: the middleware called as ASGI with a receive and a send of the
test's own, around an app that records what reaches it (this is Quantdeck's middleware alone).

On the real server, against the audit's 30 MB ``/tokenize``: tests/cli/test_open_routes_server.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from types import SimpleNamespace
from typing import Any

import pytest

from quantdeck.core.workers import engine

KEY = "gate-KEY-1"
Message = dict[str, Any]


class App:
    """The app behind the guard: reads the whole body as Starlette does, answers 200 with its
    length; ``hold`` (an event) keeps it running until set."""

    def __init__(self, hold: asyncio.Event | None = None) -> None:
        self.bodies: list[bytes] = []
        self.hold = hold

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        chunks = []
        while True:
            m = await receive()
            chunks.append(m.get("body", b""))
            if not m.get("more_body"):
                break
        self.bodies.append(b"".join(chunks))
        if self.hold is not None:
            await self.hold.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": str(len(self.bodies[-1])).encode()})


def scope(path: str, *headers: tuple[str, str], method: str = "POST", **extra: Any) -> Message:
    return {
        "type": "http",
        "method": method,
        "path": path,
        "headers": [(k.encode(), v.encode()) for k, v in headers],
        **extra,
    }


def chunks(*parts: bytes, then: Message | None = None) -> tuple[Callable[[], Any], list[int]]:
    """A receive giving ``parts`` as one body (more_body on all but the last), then ``then``
    (default: the client's disconnect, as a server gives once the body is read); and how
    many times it was called."""
    calls = [0]
    queue = [
        {"type": "http.request", "body": p, "more_body": i < len(parts) - 1}
        for i, p in enumerate(parts)
    ]

    async def receive() -> Message:
        calls[0] += 1
        if queue:
            return queue.pop(0)
        if then is None:
            return {"type": "http.disconnect"}
        return then

    return receive, calls


def never() -> Callable[[], Awaitable[Message]]:
    async def receive() -> Message:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")

    return receive


async def call(guard: engine.KeyGuard, sc: Message, receive: Any) -> list[Message]:
    sent: list[Message] = []

    async def send(m: Message) -> None:
        sent.append(m)

    await guard(sc, receive, send)
    return sent


def status(sent: list[Message]) -> int:
    return int(sent[0]["status"])


def header(sent: list[Message], name: bytes) -> bytes | None:
    return dict(sent[0]["headers"]).get(name)


def test_a_declared_length_over_the_cap_is_refused_before_a_byte_is_read() -> None:
    app = App()
    guard = engine.KeyGuard(app, keys=[KEY], gates={"tokenizer": engine.OpenGate(2, 1000)})
    receive, calls = chunks(b"x" * 30)
    sent = asyncio.run(call(guard, scope("/tokenize", ("content-length", "30000000")), receive))
    assert status(sent) == 413 and calls == [0] and app.bodies == []
    assert b"at most 1000 bytes" in sent[1]["body"]
    assert guard.gates["tokenizer"].busy == 0
    # a bad Content-Length: 400, nothing read either
    huge = scope("/tokenize", ("content-length", "9" * 5000))
    assert status(asyncio.run(call(guard, huge, receive))) == 413
    for bad in ("12x", "-1", "", " "):
        sent = asyncio.run(call(guard, scope("/tokenize", ("content-length", bad)), receive))
        assert status(sent) == 400, bad
    two = scope("/tokenize", ("content-length", "5"), ("content-length", "6"))
    assert status(asyncio.run(call(guard, two, receive))) == 400
    assert calls == [0] and app.bodies == []


def test_a_chunked_body_is_counted_as_it_comes_and_stopped_past_the_cap() -> None:
    app = App()
    guard = engine.KeyGuard(app, keys=[KEY], gates={"tokenizer": engine.OpenGate(2, 1000)})
    receive, calls = chunks(*[b"y" * 300] * 100)  # 30 kB, no Content-Length
    sent = asyncio.run(call(guard, scope("/tokenize"), receive))
    assert status(sent) == 413 and app.bodies == []
    assert calls == [4]  # 1,200 bytes read: the fourth chunk passed the cap, no more was asked
    # at the cap exactly: the app gets it whole, as one message, then the client's own receive
    receive, calls = chunks(*[b"z" * 250] * 4)
    sent = asyncio.run(call(guard, scope("/detokenize"), receive))
    assert status(sent) == 200 and app.bodies == [b"z" * 1000]


def test_the_app_still_hears_the_client_go_after_its_body() -> None:
    """vLLM's routes watch for the disconnect (``with_cancellation``): the receive the app
    gets passes it on once the body read here is given."""
    seen: list[str] = []

    async def app(sc: Any, receive: Any, send: Any) -> None:
        seen.append((await receive())["type"])
        seen.append((await receive())["type"])

    guard = engine.KeyGuard(app, keys=[KEY])
    receive, _ = chunks(b'{"prompt": "hi"}')
    asyncio.run(call(guard, scope("/tokenize", ("content-length", "16")), receive))
    assert seen == ["http.request", "http.disconnect"]
    # gone while its body came: nothing answered, the app never called, the slot given back
    messages = [{"type": "http.request", "body": b"ab", "more_body": True}]

    async def gone() -> Message:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    assert asyncio.run(call(guard, scope("/tokenize"), gone)) == []
    assert seen == ["http.request", "http.disconnect"] and guard.gates["tokenizer"].busy == 0


def test_a_full_gate_answers_503_at_once_and_the_key_and_other_gates_pass() -> None:
    async def go() -> None:
        hold = asyncio.Event()
        app = App(hold)
        every = engine.LIVENESS_PATHS + engine.TOKENIZER_PATHS + engine.METRICS_PATHS
        gates = {"tokenizer": engine.OpenGate(2, 100)}
        guard = engine.KeyGuard(app, keys=[KEY], open_paths_=every, gates=gates)
        running = [
            asyncio.create_task(call(guard, scope("/tokenize"), chunks(b"a")[0])) for _ in range(2)
        ]
        while guard.gates["tokenizer"].busy < 2 or len(app.bodies) < 2:
            await asyncio.sleep(0)
        receive, calls = chunks(b"b")
        sent = await call(guard, scope("/detokenize"), receive)  # the same group: full
        assert status(sent) == 503 and header(sent, b"retry-after") == b"1"
        assert calls == [0]  # refused before its body was read
        # with the key: no gate; /health and /metrics have their own
        keyed = scope("/tokenize", ("authorization", f"Bearer {KEY}"))
        for sc in (keyed, scope("/health", method="GET"), scope("/metrics", method="GET")):
            task = asyncio.create_task(call(guard, sc, chunks(b"")[0]))
            await asyncio.sleep(0.01)
            hold.set()
            assert status(await task) == 200, sc["path"]
            hold.clear()
        hold.set()
        assert [status(s) for s in await asyncio.gather(*running)] == [200, 200]
        assert guard.gates["tokenizer"].busy == 0
        assert status(await call(guard, scope("/tokenize"), chunks(b"c")[0])) == 200
        # a wrong key is no key: gated (and a closed path still 401)
        wrong = ("authorization", f"Bearer {KEY}x")
        assert status(await call(guard, scope("/tokenize", wrong), chunks(b"x" * 101)[0])) == 413
        assert status(await call(guard, scope("/v1/completions", wrong), chunks(b"")[0])) == 401

    asyncio.run(go())


def test_a_body_that_does_not_come_gives_its_slot_back() -> None:
    async def go() -> None:
        app = App()
        guard = engine.KeyGuard(app, keys=[KEY], body_read_s=0.2)
        t = asyncio.get_running_loop().time()
        sent = await call(guard, scope("/tokenize", ("content-length", "100")), never())
        assert status(sent) == 408 and app.bodies == []
        assert 0.15 < asyncio.get_running_loop().time() - t < 2
        assert guard.gates["tokenizer"].busy == 0

    asyncio.run(go())


@pytest.mark.parametrize(
    ("context", "expected"),
    [
        (None, engine.OPEN_BODY_UNKNOWN),  # the app does not say: a 128k context's worth
        (2048, engine.OPEN_BODY_MIN),  # the demo model: the floor
        (32768, 256 * 2**10),
        (131072, 2**20),
        (262144, 2 * 2**20),
        (10_000_000, engine.OPEN_BODY_MAX),
    ],
)
def test_the_body_cap_follows_the_served_models_context(context: int | None, expected: int) -> None:
    assert engine.open_body_max(context) == expected
    state = SimpleNamespace(
        vllm_config=SimpleNamespace(model_config=SimpleNamespace(max_model_len=context))
    )
    sc = scope("/tokenize", app=SimpleNamespace(state=state))
    assert engine.served_context(sc) == context
    gate = engine.OpenGate(2)
    assert gate.body_limit(sc) == expected
    assert gate.body_limit(scope("/tokenize")) == expected  # learnt once (the app's own)
    # the cap read from the app is the one applied
    guard = engine.KeyGuard(App(), keys=[KEY])
    over = scope(
        "/tokenize", ("content-length", str(expected + 1)), app=SimpleNamespace(state=state)
    )
    assert status(asyncio.run(call(guard, over, chunks(b"")[0]))) == 413


def test_what_the_app_does_not_say_is_not_a_context() -> None:
    for app in (None, object(), SimpleNamespace(state=SimpleNamespace())):
        assert engine.served_context(scope("/tokenize", app=app)) is None
    for bad in (True, 0, -5, "4096", 4096.0):
        model = SimpleNamespace(max_model_len=bad)
        state = SimpleNamespace(vllm_config=SimpleNamespace(model_config=model))
        assert engine.served_context(scope("/x", app=SimpleNamespace(state=state))) is None
    gate = engine.OpenGate(2)
    assert gate.body_limit(scope("/tokenize")) == engine.OPEN_BODY_UNKNOWN
    assert gate.body_max is None  # asked again next time
