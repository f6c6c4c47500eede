"""Settings shared by the HTTP clients that talk to vLLM servers: TLS, the key, exposure."""

from __future__ import annotations

import ipaddress
import ssl
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from urllib.parse import urlsplit

from quantdeck.core.errors import ConfigError


@dataclass
class _Tls:
    ca_bundle: str | None = None
    insecure: bool = False


# One setting for the process: the CLI sets it from --ca-bundle / --insecure before it makes
# any client, so every client (bench, metrics, chat, attach) checks certificates alike.
_TLS = _Tls()


def configure_tls(*, ca_bundle: str | None = None, insecure: bool = False) -> None:
    """Check https servers against ``ca_bundle`` (a PEM file: a private CA), or not at all
    (``insecure``: a self-signed test server); neither means the system's CAs."""
    if ca_bundle and insecure:
        raise ConfigError("--ca-bundle and --insecure exclude each other")
    path = str(Path(ca_bundle).expanduser().resolve()) if ca_bundle else None
    if path:
        _ca_context(path)  # a bad bundle is refused now, not at the first request
    _TLS.ca_bundle, _TLS.insecure = path, insecure


@lru_cache(maxsize=4)
def _ca_context(path: str) -> ssl.SSLContext:
    try:
        return ssl.create_default_context(cafile=path)
    except (OSError, ssl.SSLError) as e:
        raise ConfigError(f"--ca-bundle {path}: not a readable PEM CA bundle ({e})") from None


def tls_verify(url: str) -> bool | ssl.SSLContext:
    """What a client's ``verify`` (httpx) / ``ssl`` (aiohttp) gets for ``url``. Certificates
    are checked only where there is TLS: an ``http://`` server needs no CA bundle, and loading
    one (what ``httpx`` does for every new client by default: 20-40 ms here, holding the GIL)
    stalls a GUI's UI thread each time a worker makes a client."""
    if not url.strip().lower().startswith("https://") or _TLS.insecure:
        return False
    return _ca_context(_TLS.ca_bundle) if _TLS.ca_bundle else True


def auth_headers(api_key: str | None) -> dict[str, str]:
    """The ``Authorization`` header a vLLM server started with ``--api-key`` wants; none
    without a key."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def is_loopback(host: str) -> bool:
    """True for an address only this machine reaches (127.0.0.0/8, ::1, localhost); any other
    name or address, and "" (every interface), counts as exposed."""
    h = host.strip().strip("[]").lower()
    if h == "localhost":
        return True
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        return False


def plain_http_warning(url: str, api_key: str | None) -> str | None:
    """One line when ``api_key`` would cross the network in clear text; None otherwise."""
    parts = urlsplit(url.strip())
    host = parts.hostname or ""
    if api_key and parts.scheme.lower() == "http" and not is_loopback(host):
        return (
            f"the API key goes to {host} over plain http: anyone on the way can read it (use https)"
        )
    return None
