"""Streamed chat and completion requests with per-reply timing (TTFT, tokens/s)."""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from quantdeck.core.errors import ServerError
from quantdeck.core.http import auth_headers, tls_verify


@dataclass
class ReplyStats:
    ttft_ms: float | None = None
    completion_tokens: int = 0
    prompt_tokens: int = 0
    elapsed_s: float = 0.0
    finish_reason: str | None = None
    text: str = ""
    chunks: list[float] = field(default_factory=list)  # arrival times (s since send)

    @property
    def tokens_per_s(self) -> float | None:
        """Decode rate after the first token, as operators read it."""
        if self.ttft_ms is None or self.completion_tokens < 2:
            return None
        decode = self.elapsed_s - self.ttft_ms / 1000.0
        return (self.completion_tokens - 1) / decode if decode > 0 else None


def request_of(
    model: str,
    *,
    messages: list[dict[str, str]] | None = None,
    prompt: str | None = None,
    max_tokens: int = 128,
    temperature: float = 0.7,
    top_p: float = 1.0,
    extra: dict[str, Any] | None = None,
) -> tuple[str, dict[str, Any]]:
    """The path and body of one streamed request: chat if ``messages`` given."""
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": max_tokens,
        "stream": True,
        "temperature": temperature,
        "top_p": top_p,
        "stream_options": {"include_usage": True},
        **(extra or {}),
    }
    if messages is not None:
        body["messages"] = messages
    else:
        body["prompt"] = prompt or ""
    return ("/v1/chat/completions" if messages is not None else "/v1/completions"), body


KEY_VARIABLE = "VLLM_API_KEY"  # what a copied command reads the key from: never the key itself


def curl_command(url: str, path: str, body: dict[str, Any], *, keyed: bool) -> str:
    """The request as a shell command (``curl -N`` streams it), quoted for POSIX shells; a
    keyed server's key is read from $VLLM_API_KEY, never written out."""
    parts = ["curl", "-N", shlex.quote(url.rstrip("/") + path)]
    parts += ["-H", shlex.quote("Content-Type: application/json")]
    if keyed:
        parts += ["-H", f'"Authorization: Bearer ${KEY_VARIABLE}"']
    parts += ["-d", shlex.quote(json.dumps(body, ensure_ascii=False))]
    return " ".join(parts)


def stream(
    url: str,
    model: str,
    *,
    messages: list[dict[str, str]] | None = None,
    prompt: str | None = None,
    api_key: str | None = None,
    max_tokens: int = 128,
    temperature: float = 0.7,
    top_p: float = 1.0,
    timeout: float = 300.0,
    extra: dict[str, Any] | None = None,
) -> Iterator[tuple[str, ReplyStats]]:
    """Yield (text delta, running stats) as the server streams; chat if ``messages`` given."""
    chat = messages is not None
    path, body = request_of(
        model,
        messages=messages,
        prompt=prompt,
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        extra=extra,
    )
    stats = ReplyStats()
    t0 = time.perf_counter()
    try:
        with httpx.stream(
            "POST",
            url.rstrip("/") + path,
            json=body,
            headers=auth_headers(api_key),
            timeout=timeout,
            verify=tls_verify(url),
        ) as r:
            if r.status_code != 200:
                r.read()
                raise ServerError(f"{path}: HTTP {r.status_code}: {r.text[:200]}")
            for line in r.iter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data.strip() == "[DONE]":
                    break
                obj = json.loads(data)
                if obj.get("usage"):
                    stats.completion_tokens = obj["usage"].get("completion_tokens", 0)
                    stats.prompt_tokens = obj["usage"].get("prompt_tokens", 0)
                for ch in obj.get("choices") or []:
                    delta = (ch.get("delta") or {}).get("content") if chat else ch.get("text")
                    if ch.get("finish_reason"):
                        stats.finish_reason = ch["finish_reason"]
                    if delta:
                        now = time.perf_counter() - t0
                        if stats.ttft_ms is None:
                            stats.ttft_ms = now * 1000.0
                        stats.chunks.append(now)
                        stats.text += delta
                        stats.elapsed_s = now
                        yield delta, stats
    except httpx.HTTPError as e:
        raise ServerError(f"{url}{path}: {type(e).__name__}") from None
    stats.elapsed_s = time.perf_counter() - t0
    if not stats.completion_tokens:
        stats.completion_tokens = len(stats.chunks)
    yield "", stats
