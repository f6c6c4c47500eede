"""A too-small filesystem for full-disk fault tests: a tmpfs mounted on a folder of the test's
own tmp_path where the test may mount one (root), else a file-size limit (RLIMIT_FSIZE) on the
processes that write, which fails their writes the same way (Python ignores SIGXFSZ)."""

from __future__ import annotations

import os
import resource
import shutil
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil

KEEP_FREE = 128 * 1024  # bytes left free when the disk is "filled": a few small files fit


class SmallDisk:
    """``path``: the folder on the small filesystem. :meth:`fill` takes its free space (tmpfs),
    or caps the size of any file this process and its children write (no tmpfs)."""

    def __init__(self, path: Path, tmpfs: bool) -> None:
        self.path, self.tmpfs = path, tmpfs
        self._limited: list[tuple[int, int, int]] = []

    def fill(self) -> None:
        if self.tmpfs:
            free = shutil.disk_usage(self.path).free - KEEP_FREE
            with open(self.path / "filler", "wb") as f:
                f.truncate(0)
                f.write(b"\0" * max(free, 0))
            return
        me = psutil.Process()  # children started later inherit the limit
        for p in [me, *me.children(recursive=True)]:
            soft, hard = resource.prlimit(p.pid, resource.RLIMIT_FSIZE)
            resource.prlimit(p.pid, resource.RLIMIT_FSIZE, (KEEP_FREE, hard))
            self._limited.append((p.pid, soft, hard))

    def restore(self) -> None:
        for pid, soft, hard in self._limited:
            try:
                resource.prlimit(pid, resource.RLIMIT_FSIZE, (soft, hard))
            except (ProcessLookupError, PermissionError):
                pass

    def entries(self) -> list[str]:
        """What is on the disk, besides the filler."""
        return sorted(p for p in os.listdir(self.path) if p != "filler")


@contextmanager
def small_disk(path: Path, size: int) -> Iterator[SmallDisk]:
    """A filesystem of ``size`` bytes at ``path`` (created), unmounted afterwards."""
    path.mkdir(parents=True, exist_ok=True)
    mounted = (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(path)],
            capture_output=True,
        ).returncode
        == 0
    )
    disk = SmallDisk(path, mounted)
    try:
        yield disk
    finally:
        disk.restore()
        if mounted:
            subprocess.run(["umount", "-l", str(path)], check=True)
