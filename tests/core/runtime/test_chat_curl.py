"""A Playground request as a curl command: the same path and body the panel sends, quoted for
a POSIX shell whatever the text holds, and a keyed server's key read from $VLLM_API_KEY, never
written out (it would land in the clipboard, a shell history, a ticket)."""

from __future__ import annotations

import json
import shlex

from hypothesis import given
from hypothesis import strategies as st

from quantdeck.core.runtime import curl_command, request_of


def _parse(command: str) -> tuple[list[str], dict[str, object]]:
    argv = shlex.split(command)
    return argv, json.loads(argv[argv.index("-d") + 1])


@given(st.text(max_size=200))
def test_the_body_survives_the_shell_whatever_the_text(text: str) -> None:
    path, body = request_of("demo", messages=[{"role": "user", "content": text}])
    argv, sent = _parse(curl_command("http://127.0.0.1:8000/", path, body, keyed=False))
    assert argv[:3] == ["curl", "-N", "http://127.0.0.1:8000/v1/chat/completions"]
    assert sent == body and "Authorization" not in " ".join(argv)


def test_a_keyed_servers_key_is_read_from_the_environment() -> None:
    path, body = request_of("demo", prompt="Hello", max_tokens=8)
    command = curl_command("http://h:1", path, body, keyed=True)
    assert '-H "Authorization: Bearer $VLLM_API_KEY"' in command
    argv, sent = _parse(command)
    assert argv[2] == "http://h:1/v1/completions"
    assert sent["prompt"] == "Hello" and sent["max_tokens"] == 8 and sent["stream"] is True
