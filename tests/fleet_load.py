"""What the real-parts tests of live trials share: a fleet file of one demo instance, and a
steady client load through the router."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import yaml

from quantdeck.core.runtime import free_port


def tiny_fleet_file(folder: Path) -> Path:
    """``folder/fleet.yaml``: one instance 'a' (max-num-seqs 2) of a tiny random checkpoint, on
    fixed ports: for views and runners tested without starting it."""
    from ckpt import TINY_LLAMA, write_checkpoint

    model = write_checkpoint(folder / "model", TINY_LLAMA)
    doc = {
        "router": {"port": 18080, "policy": "round_robin"},
        "instances": [
            {"name": "a", "port": 18001, "profile": {"model": str(model), "max-num-seqs": 2}}
        ],
    }
    path = folder / "fleet.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def fleet_file_of_one(
    demo_model: Path, folder: Path, max_num_seqs: int = 1, restart: str = "no"
) -> tuple[Path, int]:
    """``folder/fleet.yaml``: one demo instance 'a' (eager, 64 MiB of KV cache, its profile in
    ``folder/a.yaml``, ``restart``) behind the router on a free port, round robin; the file and
    that port."""
    profile = {
        "model": str(demo_model),
        "enforce-eager": True,
        "kv-cache-memory-bytes": 64 * 2**20,
        "max-num-seqs": max_num_seqs,
    }
    (folder / "a.yaml").write_text(yaml.safe_dump(profile))
    router = free_port()
    doc = {
        "router": {"port": router, "policy": "round_robin", "retries": 5},
        "instances": [{"name": "a", "port": free_port(), "profile": "a.yaml", "restart": restart}],
    }
    path = folder / "fleet.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path, router


@dataclass
class Load:
    """``n`` clients sending short completions through the router until the block ends; what
    they sent and why any failed."""

    router: str
    model: str
    n: int = 6
    sent: int = 0
    failed: list[str] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def _client(self) -> None:
        with httpx.Client(timeout=120) as c:
            while not self.stop.is_set():
                body = {"model": self.model, "prompt": "Hello there " * 8, "max_tokens": 12}
                try:
                    r = c.post(self.router + "/v1/completions", json=body)
                    if r.status_code != 200:
                        self.failed.append(f"{r.status_code} {r.text[:200]}")
                except httpx.HTTPError as e:
                    self.failed.append(repr(e))
                self.sent += 1

    def __enter__(self) -> Load:
        self.threads = [threading.Thread(target=self._client, daemon=True) for _ in range(self.n)]
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for t in self.threads:
            t.join(timeout=150)
