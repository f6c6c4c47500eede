"""The bench client against a server that misbehaves: every request ends done or failed, with
its reason, and none is lost.

The server here is a fault injector on 127.0.0.1 (``http.server``), not an imitation of vLLM:
each prompt names the fault its answer carries.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quantdeck.core.bench import Bench, LoadSpec
from quantdeck.core.bench.client import MAX_MESSAGE_CHARS, StreamError, sse_message

TOKEN = b'data: {"choices":[{"index":0,"text":"a"}]}\n\n'
USAGE = b'data: {"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":3}}\n\n'
DONE = b"data: [DONE]\n\n"

# prompt -> (the stream it gets, the reason its record must give, "|" between alternatives;
# None: it succeeds)
FAULTS: dict[str, tuple[list[bytes], str | None]] = {
    "ok": ([TOKEN, TOKEN, TOKEN, USAGE, DONE], None),
    "choices-string": ([b'data: {"choices": "x"}\n\n', DONE], "'choices' is \"x\""),
    "choices-of-strings": ([b'data: {"choices": ["x"]}\n\n'], "'choices' is [\"x\"]"),
    "text-number": ([b'data: {"choices": [{"text": 5}]}\n\n'], "'text' is 5"),
    "usage-number": ([TOKEN, b'data: {"choices": [], "usage": 5}\n\n', DONE], "'usage' is 5"),
    "tokens-many": (
        [TOKEN, b'data: {"usage": {"completion_tokens": "many"}}\n\n', DONE],
        "'completion_tokens' is \"many\"",
    ),
    "tokens-negative": (
        [TOKEN, b'data: {"usage": {"completion_tokens": -3}}\n\n'],
        "'completion_tokens' is -3",
    ),
    "not-json": ([TOKEN, b"data: {not json\n\n", DONE], "not JSON"),
    "error-object": (
        [TOKEN, b'data: {"error": {"message": "engine dead", "code": 500}}\n\n', DONE],
        "server error mid-stream: engine dead",
    ),
    "huge-line": ([b"data: " + b"x" * (MAX_MESSAGE_CHARS + 2**20)], "stream message over"),
    # then the connection is reset: aiohttp names it by when the reset came
    "reset": ([TOKEN, TOKEN], "ClientPayloadError|ClientOSError|ServerDisconnected"),
    "nothing": ([DONE], "no token streamed"),
}


class FaultHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    asked: list[tuple[str, int]] = []  # (prompt, max_tokens) of every completion request

    def log_message(self, *args: object) -> None:  # quiet
        pass

    def end_headers(self) -> None:
        self.send_header("Connection", "close")  # no connection is reused after a fault
        super().end_headers()

    def _json(self, status: int, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path == "/v1/models":
            self._json(200, {"data": [{"id": "m", "root": None}]})
        elif self.path == "/health":
            self._json(200, {})
        else:
            self._json(404, {"error": "no such route"})

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path != "/v1/completions":
            self._json(404, {"error": "no such route"})
            return
        prompt = body["prompt"]
        FaultHandler.asked.append((prompt, body["max_tokens"]))
        try:
            if prompt.startswith(("cut-", "fail-once")):
                self._continued(prompt, body["max_tokens"])
                return
            self._answer(prompt)
        except OSError:  # the client gave up on a fault (as it should)
            pass

    def _answer(self, prompt: str) -> None:
        if prompt == "http-500":  # a huge error page: the client reads only its head
            self.send_response(500)
            self.send_header("Content-Length", str(32 * 2**20))
            self.end_headers()
            for _ in range(32):
                self.wfile.write(b"E" * 2**20)
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for part in FAULTS[prompt][0]:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
        self.wfile.flush()
        if prompt == "reset":
            self._reset()
            return
        self.wfile.write(b"0\r\n\r\n")

    def _continued(self, prompt: str, max_tokens: int) -> None:
        """The faults a client may continue: "cut-then-ok" streams two "a" tokens and is reset;
        its continuation (the prompt with "aa" appended) streams ``max_tokens`` "b" tokens.
        "cut-always" is reset after two tokens every time. "fail-once" answers HTTP 502 (a
        router out of retries) the first time its prompt comes, then streams normally."""
        if prompt == "fail-once" and FaultHandler.asked.count((prompt, max_tokens)) == 1:
            self._json(502, {"error": "error sending request"})
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        done = prompt in ("cut-then-okaa", "fail-once")
        text = b"b" if done else b"a"
        token = b'data: {"choices":[{"index":0,"text":"%s"}]}\n\n' % text
        usage = b'data: {"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":%d}}\n\n'
        parts = [token] * max_tokens + [usage % max_tokens, DONE] if done else [token, token]
        for part in parts:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
        if done:
            self.wfile.write(b"0\r\n\r\n")
        else:
            self._reset()

    def _reset(self) -> None:
        """Close with a TCP reset (SO_LINGER 0), as a dying server's kernel does."""
        self.wfile.flush()
        self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.close_connection = True
        self.connection.close()


@pytest.fixture
def fault_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), FaultHandler)
    server.daemon_threads = True
    t = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        t.join(5)


def _prompts(tmp_path: Path, names: list[str]) -> str:
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps({"prompt": n}) + "\n" for n in names))
    return str(path)


def test_every_bad_stream_fails_its_request_with_its_reason(fault_server, tmp_path) -> None:
    names = [*FAULTS, "http-500"]
    spec = LoadSpec(
        num_prompts=len(names), prompts_file=_prompts(tmp_path, names), concurrency=4, warmups=0
    )
    seen: list[int] = []
    result = Bench(
        fault_server, "m", spec, on_record=lambda rec, done, total: seen.append(done)
    ).run()
    assert result.completed + result.failed == len(names) == len(result.requests)
    assert len(seen) == len(names) and max(seen) == len(names)  # each request reported once
    by_prompt = dict(zip(names, result.requests, strict=True))
    assert by_prompt["ok"]["success"] and by_prompt["ok"]["output_tokens"] == 3
    assert result.completed == 1 and result.ended_early is None
    for name, (_, reason) in FAULTS.items():
        if reason is not None:
            rec = by_prompt[name]
            assert not rec["success"], name
            assert any(alt in rec["error"] for alt in reason.split("|")), (name, rec["error"])
            assert len(rec["error"]) <= 200
    assert by_prompt["http-500"]["error"].startswith("HTTP 500: EEE")


def test_a_cut_stream_is_continued_where_it_broke(fault_server, tmp_path) -> None:
    """With ``resume``, a stream reset after two tokens is sent again with those tokens' text
    appended to its prompt and the tokens still owed as max_tokens; the record is one answer
    (its text, all its tokens, the first attempt's TTFT) marked resumed. A stream cut every
    time fails after the allowed continuations; an HTTP 502 before any token is sent again
    as it was. Without ``resume`` the cut request fails (test above)."""
    FaultHandler.asked.clear()
    path = tmp_path / "prompts.jsonl"
    rows = [("cut-then-ok", 6), ("cut-always", 6), ("fail-once", 3)]
    path.write_text("".join(json.dumps({"prompt": p, "output_len": n}) + "\n" for p, n in rows))
    spec = LoadSpec(num_prompts=3, prompts_file=str(path), concurrency=1, warmups=0)
    result = Bench(fault_server, "m", spec, resume=2).run()
    cut, always, once = result.requests
    assert cut["success"] and cut["resumed"] == 1 and cut["error"] == ""
    assert cut["generated_text"] == "aabbbb" and cut["output_tokens"] == 6
    assert len(cut["itl"]) == 5 and 0 < cut["ttft"] <= cut["latency"]
    assert not always["success"] and always["resumed"] == 2
    assert any(e in always["error"] for e in ("ClientPayloadError", "ServerDisconnected"))
    assert once["success"] and once["resumed"] == 1 and once["generated_text"] == "bbb"
    assert result.resumed_requests == 3 and result.failed == 1
    assert FaultHandler.asked == [
        ("cut-then-ok", 6),
        ("cut-then-okaa", 4),
        ("cut-always", 6),
        ("cut-alwaysaa", 4),
        ("cut-alwaysaaaa", 2),
        ("fail-once", 3),
        ("fail-once", 3),
    ]


def test_a_failing_callback_is_logged_and_loses_no_request(fault_server, tmp_path, caplog):
    """An observer's bug is logged once with its traceback; the run and its counts go on."""

    def broken(rec, done, total):
        raise RuntimeError("observer bug")

    spec = LoadSpec(num_prompts=4, prompts_file=_prompts(tmp_path, ["ok"]), warmups=0)
    result = Bench(fault_server, "m", spec, on_record=broken).run()
    assert result.completed == 4 and result.failed == 0
    logged = [r for r in caplog.records if "on_record callback failed" in r.getMessage()]
    assert len(logged) == 1 and logged[0].exc_info is not None


def test_a_model_list_that_is_not_one_is_a_server_error(tmp_path) -> None:
    from quantdeck.core.errors import ServerError

    class Odd(FaultHandler):
        def do_GET(self) -> None:
            self._json(200, ["not", "a", "model", "list"])

    server = ThreadingHTTPServer(("127.0.0.1", 0), Odd)
    t = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    t.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}"
        spec = LoadSpec(num_prompts=1, prompts_file=_prompts(tmp_path, ["ok"]), warmups=0)
        with pytest.raises(ServerError, match="not an OpenAI model list"):
            Bench(url, "m", spec).run()
    finally:
        server.shutdown()
        server.server_close()


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=8,
)
_field = st.sampled_from(["choices", "usage", "error", "object", "text", "completion_tokens"])


@settings(max_examples=100, deadline=None)
@given(
    st.dictionaries(_field, _json | st.dictionaries(_field, _json, max_size=3), max_size=3)
    | st.lists(st.dictionaries(_field, _json, max_size=2), max_size=2).map(lambda c: {"choices": c})
)
def test_any_message_reads_as_its_kind_or_a_stream_error(data) -> None:
    """Whatever a message holds: its kind with the shapes the client reads, or StreamError."""
    try:
        kind, got = sse_message("data: " + json.dumps(data))
    except StreamError as e:
        assert str(e).startswith("malformed stream message: ")
        return
    if kind == "token":
        assert isinstance(got["choices"][0].get("text") or "", str)
    elif kind == "usage":
        for key in ("completion_tokens", "prompt_tokens"):
            v = got["usage"].get(key)
            assert v is None or (type(v) is int and v >= 0)
