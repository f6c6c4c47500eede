"""A real conversion on a disk that fills up while it runs (issue 21, fault tests): a clear
error, the job "failed", nothing left at the target, the source untouched."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from small_disk import small_disk

from quantdeck.core.convert.jobs import JobQueue, QuantSpec
from quantdeck.core.events import Event, ProgressEvent, StateEvent
from quantdeck.core.models import CONVERSION_METHODS, inspect_model


def tree_hash(root: Path) -> str:
    h = hashlib.sha256()
    for p in sorted(root.rglob("*")):
        h.update(str(p.relative_to(root)).encode())
        if p.is_file():
            h.update(p.read_bytes())
    return h.hexdigest()


@pytest.fixture(autouse=True)
def _one_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # 2 shared cores


def test_disk_full_during_conversion(demo_model: Path, tmp_path: Path) -> None:
    before = tree_hash(demo_model)
    info = inspect_model(demo_model)
    # Big enough for the pre-check (weights x scratch + 64 MiB), then filled once the job runs.
    need = int(info.weights_bytes * (1 + CONVERSION_METHODS["w8a8"].scratch)) + 64 * 2**20
    with small_disk(tmp_path / "disk", need + 8 * 2**20) as disk:
        out = disk.path / "demo-w8a8"
        q = JobQueue()

        def fill_at_start(job: object, ev: Event) -> None:
            if isinstance(ev, ProgressEvent) and ev.stage == "start":
                disk.fill()  # another program takes the space: the save must fail

        q.subscribe(fill_at_start)
        job = q.submit(QuantSpec(str(demo_model), "w8a8", str(out), samples=4, seq_len=64))
        q.wait(job.id, timeout=600)
        q.close()
        disk.restore()
        assert job.state == "failed", (job.state, job.error)
        error = job.error or ""
        assert error.startswith(f"w8a8 conversion into {out} failed: ") and "\n" not in error
        assert "cannot write the converted model (" in error  # the worker's line, no traceback
        assert "no space left on device" in error.lower() or "file too large" in error.lower()
        assert disk.entries() == []  # no target, no temp folder, nothing marked done
        assert [e.state for e in job.events if isinstance(e, StateEvent)][-1] == "failed"
    assert tree_hash(demo_model) == before
