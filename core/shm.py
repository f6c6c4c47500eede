"""The POSIX shared memory a dead vLLM server leaves in /dev/shm, found and removed.

vLLM's processes share memory the way Python's multiprocessing does: segments named
``psm_<hex>`` (``shared_memory.SharedMemory``: its message queues) and named semaphores
``sem.mp-<random>`` (its locks, under the ``spawn`` start method). Their resource tracker
removes them at a clean exit; a server killed with its group (kill -9, a hung instance's
SIGKILL, a crash taken down) leaves them behind, each tmpfs memory until the next reboot.

A file in /dev/shm names no creator, so ownership is what was seen. :class:`ShmLedger` lists
/dev/shm when the server starts, notes the entries its processes map while it runs, and after
its death removes an entry only when all of these hold:

1. it is named as multiprocessing names them, a regular file of this user;
2. it was not there when the server started (name and inode);
3. a process of the server's group was seen mapping it (the same inode);
4. no process maps it or holds it open now (the server's group is gone by then).

Anything else is left alone: a segment another program made, one a live process still uses,
one the server made but was never seen using (it stays, as before). Processes of other users
cannot be looked into; they cannot open this user's 0600 segments either (root aside).

What was seen is also kept on disk (``record``: a file beside the server's lease, rewritten
when the set grows), so that when the Quantdeck that watched the server dies with it (kill -9
of the panel or of ``fleet up``: the server follows by its parent-death signal), the next
Quantdeck that reads the leases (:func:`quantdeck.core.procs.leftovers`: ``serve``, the
panel's start, ``leftovers``) removes them by the same rules (:func:`sweep_record`).
"""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Iterable
from pathlib import Path

from quantdeck.core.paths import write_atomic

SHM_ROOT = Path("/dev/shm")
# multiprocessing's names: shared_memory's "psm_" + hex, SemLock's "mp-" + 8 of [a-z0-9_] (glibc
# keeps a named semaphore as /dev/shm/sem.NAME)
_OURS = re.compile(r"^(psm_[0-9a-f]+|sem\.mp-[a-z0-9_]+)$")


def _listing(root: Path) -> dict[str, int]:
    """The multiprocessing entries in ``root``, with their inodes."""
    try:
        with os.scandir(root) as it:
            return {e.name: e.inode() for e in it if _OURS.match(e.name)}
    except OSError:
        return {}  # no /dev/shm (not Linux)


def _device(root: Path) -> str | None:
    """``root``'s device as /proc/PID/maps writes it (``00:1b``)."""
    try:
        dev = root.stat().st_dev
    except OSError:
        return None
    return f"{os.major(dev):02x}:{os.minor(dev):02x}"


def _mapped(pid: int, root: Path, device: str | None) -> set[int]:
    """The inodes of the files under ``root`` that process ``pid`` maps. By inode, not name:
    glibc makes a named semaphore as a temporary file, maps it, links it to its name and
    removes the temporary one, so a map shows ``/dev/shm/sem.XXXXXX (deleted)``."""
    try:
        with open(f"/proc/{pid}/maps", "rb") as f:
            data = f.read()
    except OSError:
        return set()
    prefix = os.fsencode(root) + b"/"
    out: set[int] = set()
    if prefix not in data or device is None:
        return out
    dev = device.encode()
    for line in data.splitlines():
        # address perms offset dev inode path
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and parts[5].startswith(prefix) and parts[3] == dev:
            out.add(int(parts[4]))
    return out


def _held_open(pid: int, root: Path) -> set[int]:
    """The inodes of the files under ``root`` that process ``pid`` holds open."""
    fd_dir = f"/proc/{pid}/fd"
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        return set()
    prefix = str(root) + "/"
    out = set()
    for fd in fds:
        try:
            if os.readlink(f"{fd_dir}/{fd}").startswith(prefix):
                out.add(os.stat(f"{fd_dir}/{fd}").st_ino)
        except OSError:
            continue
    return out


def in_use(inodes: set[int], root: Path = SHM_ROOT) -> set[int]:
    """The ``inodes`` (files under ``root``) that a live process, one this user may look
    into, maps or holds open."""
    device = _device(root)
    used: set[int] = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            pid = int(entry)
            used |= (_mapped(pid, root, device) | _held_open(pid, root)) & inodes
    return used


class ShmLedger:
    """One start of a server: what /dev/shm held before it, what its processes were seen
    mapping, and (:meth:`sweep`) the removal of what it left."""

    def __init__(self, root: Path = SHM_ROOT, record: Path | None = None) -> None:
        self.root = root
        self.before = set(_listing(root).items())
        self.seen: dict[str, int] = {}  # name: inode, mapped by a process of the server
        self.record = record  # where :attr:`seen` is kept on disk (None: in memory only)
        self._device = _device(root)

    def note(self, pids: Iterable[int]) -> None:
        """Note the entries the server's processes ``pids`` map now."""
        inodes: set[int] = set()
        for pid in pids:
            inodes |= _mapped(pid, self.root, self._device)
        if inodes:
            grew = False
            for name, inode in _listing(self.root).items():
                if inode in inodes and (name, inode) not in self.before:
                    grew |= self.seen.get(name) != inode
                    self.seen[name] = inode
            if grew:
                self._keep()

    def _keep(self) -> None:
        """Write :attr:`seen` to :attr:`record` (a failed write: memory only, as before)."""
        if self.record is None:
            return
        try:
            text = json.dumps({"seen": dict(self.seen)})
            write_atomic(self.record, text)
        except OSError:
            pass

    def sweep(self) -> list[str]:
        """Remove what the server made and left, by the rules above (call it once the
        server's group is gone); the names removed."""
        left = {}
        for name, inode in list(self.seen.items()):  # (the watcher may still note)
            try:
                st = (self.root / name).lstat()
            except OSError:
                continue  # removed already (a clean exit)
            if stat.S_ISREG(st.st_mode) and st.st_uid == os.getuid() and st.st_ino == inode:
                left[name] = inode
        self.seen.clear()
        if self.record is not None:
            self.record.unlink(missing_ok=True)
        if not left:
            return []
        used = in_use(set(left.values()), self.root)
        removed = []
        for name, inode in sorted(left.items()):
            if inode not in used:
                try:
                    (self.root / name).unlink()
                    removed.append(name)
                except OSError:
                    pass
        return removed


RECORD_MAX_BYTES = 1 << 20  # a record names a few entries: anything bigger is not one


def sweep_record(record: Path, root: Path = SHM_ROOT) -> list[str]:
    """Remove what the dead server whose ledger was kept in ``record`` left in ``root`` (the
    rules above), then the record; the names removed. Call it once the server's group is
    gone. An unreadable or malformed record is removed and nothing else."""
    try:
        with open(record, "rb") as f:
            raw = f.read(RECORD_MAX_BYTES + 1)
        if len(raw) > RECORD_MAX_BYTES:
            raise ValueError("too big for a record")
        seen = json.loads(raw)["seen"]
        if not isinstance(seen, dict):
            raise TypeError("not a record")
    except FileNotFoundError:
        return []
    except (OSError, ValueError, TypeError, KeyError):
        record.unlink(missing_ok=True)
        return []
    ledger = ShmLedger(root, record)
    ledger.before = set()  # what it saw at the start was left out when the record was kept
    ledger.seen = {k: v for k, v in seen.items() if _OURS.match(k) and type(v) is int and v > 0}
    return ledger.sweep()
