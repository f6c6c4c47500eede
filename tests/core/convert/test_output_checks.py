"""Where a conversion may write, checked before anything is created (issue 21, "conversion
output inside the source model"), and a job that fails on anything ends "failed"."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
from ckpt import LLAMA3_8B, write_checkpoint

from quantdeck.core.convert import jobs
from quantdeck.core.convert.jobs import JobQueue, QuantSpec
from quantdeck.core.errors import ConfigError
from quantdeck.core.events import StateEvent

TINY = dict(
    LLAMA3_8B,
    hidden_size=256,
    intermediate_size=512,
    num_attention_heads=4,
    num_key_value_heads=2,
    num_hidden_layers=1,
    vocab_size=512,
)


def snapshot(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): (
            hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
        )
        for p in sorted(root.rglob("*"))
    }


@pytest.fixture
def src(tmp_path: Path) -> Path:
    return write_checkpoint(tmp_path / "models" / "tiny", TINY)


def test_output_inside_the_source_is_refused_creating_nothing(src: Path, tmp_path: Path) -> None:
    (tmp_path / "alias").symlink_to(src)
    before = snapshot(tmp_path)
    for out, why in [
        (src / "quantized" / "w8a8", "inside the source"),
        (tmp_path / "alias" / "w8a8", "inside the source"),
        (tmp_path / "alias", "is the source folder"),
        (src.parent, "contains the source"),
    ]:
        with pytest.raises(ConfigError, match=why):
            QuantSpec(str(src), "w8a8", str(out)).check()
        with pytest.raises(ConfigError, match=why):
            JobQueue().submit(QuantSpec(str(src), "w8a8", str(out)))
    assert snapshot(tmp_path) == before


def test_check_creates_nothing_and_refuses_foreign_targets(src: Path, tmp_path: Path) -> None:
    QuantSpec(str(src), "w8a8", str(tmp_path / "a" / "b" / "out")).check()
    assert not (tmp_path / "a").exists()
    (tmp_path / "file").write_text("keep")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes").write_text("keep")
    (tmp_path / "link").symlink_to(tmp_path / "other")
    before = snapshot(tmp_path)
    for name in ("file", "link", "other"):
        with pytest.raises(ConfigError, match="Quantdeck"):
            QuantSpec(str(src), "w8a8", str(tmp_path / name)).check()
    assert snapshot(tmp_path) == before and (tmp_path / "link").is_symlink()


def test_a_job_failing_on_anything_ends_failed(
    src: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full_disk(*args: object, **kwargs: object) -> None:
        raise OSError(28, os.strerror(28), str(tmp_path / "out"))

    monkeypatch.setattr(jobs, "run_job", full_disk)
    q = JobQueue()
    job = q.submit(QuantSpec(str(src), "w8a8", str(tmp_path / "out")))
    q.wait(job.id, timeout=10)
    q.close()
    assert job.state == "failed" and "No space left on device" in (job.error or "")
    last = job.events[-1]
    assert isinstance(last, StateEvent) and last.state == "failed"
