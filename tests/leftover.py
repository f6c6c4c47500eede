"""A leftover for tests: a process group whose lease names an owner that has ended (as a
Quantdeck killed before it could stop its child would leave it)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import psutil


def dead_owner() -> tuple[int, float]:
    """The pid and start time of a process that has ended."""
    p = subprocess.Popen(["sleep", "5"])
    created = psutil.Process(p.pid).create_time()
    p.kill()
    p.wait()
    return p.pid, created


def write_lease(leases: Path, pid: int, create_time: float | None = None, **extra: object) -> Path:
    """A lease for ``pid`` (its real start time unless given) owned by an ended process."""
    owner, owner_created = dead_owner()
    data = {
        "pid": pid,
        "pgid": os.getpgid(pid),
        "create_time": psutil.Process(pid).create_time() if create_time is None else create_time,
        "kind": "vLLM server",
        "owner_pid": owner,
        "owner_create_time": owner_created,
        "started": time.time(),
        "port": 8011,
        **extra,
    }
    leases.mkdir(parents=True, exist_ok=True)
    path = leases / f"{pid}.json"
    path.write_text(json.dumps(data))
    return path


def leftover(leases: Path, cmd: list[str] | None = None) -> subprocess.Popen:
    """Start ``cmd`` (default: ``sleep 60``) in its own session and lease it to a dead owner."""
    proc = subprocess.Popen(cmd or ["sleep", "60"], start_new_session=True)
    write_lease(leases, proc.pid)
    return proc
