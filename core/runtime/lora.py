"""LoRA adapters on a running vLLM server: load, unload, list what is loaded.

vLLM serves the endpoints ``/v1/load_lora_adapter`` and ``/v1/unload_lora_adapter`` only when
it was started with ``--enable-lora`` and ``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`` in its
environment (the launch setting ``allow_runtime_lora_updating``). A loaded adapter is then one
more model in ``/v1/models``, whose ``parent`` is the base model: requests pick it by name.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from quantdeck.core.errors import QuantdeckError, ServerError
from quantdeck.core.http import auth_headers, tls_verify
from quantdeck.core.models import read_adapter
from quantdeck.core.schema import Fields, load_json, shown

LORA_METRIC = "vllm:lora_requests_info"
_NAME_MAX = 256


@dataclass(frozen=True)
class LoadedAdapter:
    """An adapter the server serves: the name requests use, its base model, its folder."""

    name: str
    base: str
    path: str | None

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "base": self.base, "path": self.path}


@dataclass(frozen=True)
class LoraRequests:
    """vLLM's ``vllm:lora_requests_info`` gauge: adapters in the running and waiting requests."""

    max_lora: int | None
    running: tuple[str, ...]
    waiting: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"max_lora": self.max_lora, "running": self.running, "waiting": self.waiting}


def _request(
    method: str, url: str, path: str, api_key: str | None, timeout: float, **kw: Any
) -> httpx.Response:
    try:
        return httpx.request(
            method,
            url.rstrip("/") + path,
            headers=auth_headers(api_key),
            timeout=timeout,
            verify=tls_verify(url),
            **kw,
        )
    except (httpx.HTTPError, httpx.InvalidURL) as e:
        raise ServerError(f"{url}{path}: {type(e).__name__} ({e})") from None


def _refusal(r: httpx.Response, path: str) -> ServerError:
    """The server's reason, in one line: vLLM's error object, else the start of the body. A
    bare 404 (no such route: FastAPI's ``{"detail": "Not Found"}``) on the LoRA routes means
    the server was started without loading at run time."""
    try:
        body = load_json(r.content, path, error=ServerError)
        err = body.get("error", body) if isinstance(body, dict) else {}
        message = err.get("message") if isinstance(err, dict) else None
    except QuantdeckError:
        message = None
    if r.status_code == 404 and not isinstance(message, str) and "lora" in path:
        return ServerError(
            f"{path}: not found: the server does not load adapters at run time (start it with "
            "--enable-lora --allow-runtime-lora-updating)"
        )
    if r.status_code == 401:
        return ServerError(f"{path}: HTTP 401: the server wants an API key (VLLM_API_KEY)")
    text = message if isinstance(message, str) else r.text
    return ServerError(f"{path}: HTTP {r.status_code}: {' '.join(text.split())[:300]}")


def _check_name(name: str) -> None:
    if not name or len(name) > _NAME_MAX or any(c.isspace() for c in name):
        raise ServerError(f"adapter name {shown(name)}: must be 1-{_NAME_MAX} non-blank characters")


def load_adapter(
    url: str,
    name: str,
    path: str | os.PathLike[str],
    *,
    api_key: str | None = None,
    timeout: float = 120.0,
) -> str:
    """Load the adapter folder ``path`` under ``name``; return the path sent.

    A folder that exists here is read first (a bad adapter is one line from us, not a refusal
    from the server) and sent as an absolute path; any other path is sent as given, for a
    server on another machine to resolve."""
    _check_name(name)
    local = Path(path).expanduser()
    sent = str(path)
    if local.exists():
        sent = read_adapter(local).path
    r = _request(
        "POST",
        url,
        "/v1/load_lora_adapter",
        api_key,
        timeout,
        json={"lora_name": name, "lora_path": sent},
    )
    if r.status_code != 200:
        raise _refusal(r, "/v1/load_lora_adapter")
    return sent


def unload_adapter(
    url: str, name: str, *, api_key: str | None = None, timeout: float = 60.0
) -> None:
    """Unload the adapter ``name``: requests naming it are refused from then on."""
    _check_name(name)
    r = _request("POST", url, "/v1/unload_lora_adapter", api_key, timeout, json={"lora_name": name})
    if r.status_code != 200:
        raise _refusal(r, "/v1/unload_lora_adapter")


def loaded_adapters(
    url: str, *, api_key: str | None = None, timeout: float = 10.0
) -> list[LoadedAdapter]:
    """The adapters the server serves: the ``/v1/models`` entries that have a parent."""
    r = _request("GET", url, "/v1/models", api_key, timeout)
    if r.status_code != 200:
        raise _refusal(r, "/v1/models")
    models = load_json(r.content, "/v1/models", error=ServerError)
    data = Fields(models, "/v1/models", error=ServerError)
    out = []
    for item in data.items("data", max_len=10_000) or []:
        f = Fields(item, "/v1/models: an entry", error=ServerError)
        parent = f.text("parent", max_len=4096)
        if parent:
            name = f.text("id", max_len=4096, required=True)
            assert name is not None  # required
            out.append(LoadedAdapter(name, parent, f.text("root", max_len=4096)))
    return out


def lora_requests(
    url: str, *, api_key: str | None = None, timeout: float = 10.0
) -> LoraRequests | None:
    """The ``vllm:lora_requests_info`` gauge from ``/metrics``; None when the server has no
    LoRA (vLLM exposes the gauge only with ``--enable-lora``) or has served no request yet."""
    r = _request("GET", url, "/metrics", api_key, timeout)
    if r.status_code != 200:
        raise _refusal(r, "/metrics")
    return parse_lora_requests(r.text)


def parse_lora_requests(text: str) -> LoraRequests | None:
    """The newest ``vllm:lora_requests_info`` sample of a ``/metrics`` text (its value is a
    timestamp: the labels carry the facts), or None."""
    try:
        families = list(text_string_to_metric_families(text))
    except ValueError as e:
        raise ServerError(f"/metrics: not Prometheus text ({e})") from None
    samples = [s for fam in families if fam.name == LORA_METRIC for s in fam.samples if s.labels]
    if not samples:
        return None
    labels = max(samples, key=lambda s: s.value).labels

    def names(key: str) -> tuple[str, ...]:
        return tuple(n for n in labels.get(key, "").split(",") if n)

    max_lora = labels.get("max_lora", "")
    return LoraRequests(
        int(max_lora) if max_lora.isdigit() else None,
        names("running_lora_adapters"),
        names("waiting_lora_adapters"),
    )
