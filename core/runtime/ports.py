"""Where a server listens: a port free or taken, a free one, the URL that reaches a host, and
which process listens on a port (this server's, or another's)."""

from __future__ import annotations

import errno
import socket

import psutil

from quantdeck.core.errors import ConfigError
from quantdeck.core.launch import LaunchConfig


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def port_free(host: str, port: int) -> bool:
    """True if nothing listens on host:port (we try to bind it, as the server will); a host
    this machine cannot listen on is a ConfigError."""
    host = host.strip("[]")
    with socket.socket(_family(host), socket.SOCK_STREAM) as s:
        # as uvicorn does: connections of a stopped server in TIME_WAIT do not block the port,
        # a listening socket does
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except socket.gaierror as e:
            raise ConfigError(f"host '{host}' is not an address here ({e.strerror})") from None
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return False
            raise ConfigError(f"cannot listen on {host} port {port}: {e.strerror}") from None
    return True


def free_port(host: str = "127.0.0.1") -> int:
    host = host.strip("[]")
    with socket.socket(_family(host), socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def url_host(host: str) -> str:
    """``host`` as a URL to reach it writes it: a wildcard address as loopback, an IPv6
    address in brackets (``::1`` -> ``[::1]``)."""
    host = host.strip("[]")
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def base_url(cfg: LaunchConfig) -> str:
    return f"http://{url_host(cfg.server.host)}:{cfg.server.port}"


def listens(pids: set[int], port: int) -> bool:
    """Whether one of ``pids`` listens on ``port``."""
    for pid in pids:
        try:
            conns = psutil.Process(pid).net_connections(kind="inet")
        except psutil.Error:
            continue
        if any(c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port for c in conns):
            return True
    return False
