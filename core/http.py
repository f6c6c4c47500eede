"""Settings shared by the HTTP clients that talk to vLLM servers."""

from __future__ import annotations


def tls_verify(url: str) -> bool:
    """Check certificates only where there is TLS. An ``http://`` server needs no CA bundle,
    and loading one (what ``httpx`` does for every new client by default: 20-40 ms here,
    holding the GIL) stalls a GUI's UI thread each time a worker makes a client."""
    return url.strip().lower().startswith("https://")


def auth_headers(api_key: str | None) -> dict[str, str]:
    """The ``Authorization`` header a vLLM server started with ``--api-key`` wants; none
    without a key."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}
