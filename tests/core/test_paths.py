"""How outputs are written (core/paths.py): atomic files and folders, refusing what Quantdeck did
not make, never writing into (or around) a source."""

from __future__ import annotations

import json
import stat
import threading
from pathlib import Path

import pytest
from conftest import snapshot

from quantdeck.core.errors import ConfigError, QuantdeckError
from quantdeck.core.paths import (
    CACHE_DIR_ENV,
    OUTPUT_MARKER,
    PROBE_DIR_ENV,
    atomic_dir,
    output_kind,
    probe_dir,
    refuse_overlap,
    write_atomic,
    write_json,
)


def leftovers(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if ".tmp" in p.name or ".old-" in p.name)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


# -- files -----------------------------------------------------------------------------------


def test_write_atomic_modes_and_no_temp_left(tmp_path: Path) -> None:
    write_json(tmp_path / "run.json", {"a": 1})
    assert mode(tmp_path / "run.json") == 0o600
    write_atomic(tmp_path / "page.html", "<p>", private=False)
    assert mode(tmp_path / "page.html") == 0o644
    assert json.loads((tmp_path / "run.json").read_text()) == {"a": 1}
    assert leftovers(tmp_path) == []


def test_write_atomic_concurrent_writers_use_unique_temp_names(tmp_path: Path) -> None:
    target = tmp_path / "same.json"
    texts = [f"writer {i} " * 2000 for i in range(16)]
    threads = [threading.Thread(target=write_atomic, args=(target, t)) for t in texts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert target.read_text() in texts  # one whole file, never two interleaved
    assert leftovers(tmp_path) == []


def test_write_atomic_without_replace_keeps_existing(tmp_path: Path) -> None:
    target = tmp_path / "run.json"
    target.write_text("the user's")
    with pytest.raises(FileExistsError):
        write_atomic(target, "ours", replace=False)
    assert target.read_text() == "the user's" and leftovers(tmp_path) == []


# -- folders ---------------------------------------------------------------------------------


def test_atomic_dir_builds_marks_and_renames(tmp_path: Path) -> None:
    target = tmp_path / "deep" / "out"
    with atomic_dir(target, "report") as tmp:
        assert tmp.parent == target.parent and tmp.name.startswith(".out.tmp-")
        assert not target.exists()  # nothing at the target while building
        (tmp / "index.html").write_text("x")
    assert (target / "index.html").read_text() == "x"
    assert json.loads((target / OUTPUT_MARKER).read_text())["kind"] == "report"
    assert output_kind(target) == "report" and mode(target) == 0o755
    assert leftovers(target.parent) == []


def test_atomic_dir_takes_an_empty_folder(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    with atomic_dir(tmp_path / "out", "report") as tmp:
        (tmp / "a").write_text("a")
    assert (tmp_path / "out" / "a").is_file()


def _foreign_targets(tmp_path: Path) -> dict[str, Path]:
    """Things at a target that Quantdeck did not make, one of each kind."""
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "notes.txt").write_text("mine")
    file = tmp_path / "file"
    file.write_bytes(b"\x7fELF system file")
    link = tmp_path / "link"
    link.symlink_to(folder)
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    empty_link = tmp_path / "empty-link"
    (tmp_path / "empty").mkdir()
    empty_link.symlink_to(tmp_path / "empty")
    return {"folder": folder, "file": file, "link": link, "dangling": dangling, "el": empty_link}


@pytest.mark.parametrize("overwrite", [False, True])
def test_atomic_dir_refuses_what_quantdeck_did_not_make(tmp_path: Path, overwrite: bool) -> None:
    targets = _foreign_targets(tmp_path)
    before = snapshot(tmp_path)
    for name, target in targets.items():
        ran = False
        with (
            pytest.raises(ConfigError) as e,
            atomic_dir(target, "demo-model", overwrite=overwrite),
        ):
            ran = True
        assert not ran, name
        assert str(target) in str(e.value) and "\n" not in str(e.value)
    assert snapshot(tmp_path) == before  # byte for byte, links and all
    assert leftovers(tmp_path) == []


def test_atomic_dir_replaces_its_own_kind_only_when_asked(tmp_path: Path) -> None:
    target = tmp_path / "rep"
    with atomic_dir(target, "report") as tmp:
        (tmp / "old.png").write_text("old")
    with pytest.raises(ConfigError, match="exists"), atomic_dir(target, "report"):
        pass
    with (
        pytest.raises(ConfigError, match="holds a Quantdeck report, not a conversion"),
        atomic_dir(target, "conversion", overwrite=True),
    ):
        pass
    assert (target / "old.png").is_file()
    with atomic_dir(target, "report", overwrite=True) as tmp:
        (tmp / "new.png").write_text("new")
    assert sorted(p.name for p in target.iterdir()) == [OUTPUT_MARKER, "new.png"]
    assert leftovers(tmp_path) == []


def test_atomic_dir_failure_leaves_target_as_before(tmp_path: Path) -> None:
    target = tmp_path / "rep"
    with atomic_dir(target, "report") as tmp:
        (tmp / "old.png").write_text("old")
    before = snapshot(tmp_path)
    with (
        pytest.raises(RuntimeError, match="chart failed"),
        atomic_dir(target, "report", overwrite=True) as tmp,
    ):
        (tmp / "half.png").write_text("half")
        raise RuntimeError("chart failed")
    with pytest.raises(RuntimeError), atomic_dir(tmp_path / "x" / "y" / "new", "report") as tmp:
        (tmp / "half.png").write_text("half")
        raise RuntimeError
    assert snapshot(tmp_path) == before  # no temp folder, nor the parents it made


def test_atomic_dir_target_appearing_meanwhile_is_not_replaced(tmp_path: Path) -> None:
    target = tmp_path / "out"
    with pytest.raises(QuantdeckError), atomic_dir(target, "conversion") as tmp:
        (tmp / "model.safetensors").write_text("new")
        target.mkdir()  # another program made it while we were busy
        (target / "theirs").write_text("theirs")
    assert [p.name for p in target.iterdir()] == ["theirs"] and leftovers(tmp_path) == []


def test_refuse_overlap(tmp_path: Path) -> None:
    src = tmp_path / "models" / "src"
    src.mkdir(parents=True)
    (tmp_path / "alias").symlink_to(src)
    for out, why in [
        (src, "is the source folder"),
        (src / "out", "inside the source"),
        (tmp_path / "alias" / "a" / "b", "inside the source"),
        (tmp_path / "models", "contains the source"),
        (tmp_path, "contains the source"),
    ]:
        with pytest.raises(ConfigError, match=why):
            refuse_overlap(out, src)
    refuse_overlap(tmp_path / "models" / "src-w8a8", src)  # a sibling is fine
    assert not (src / "out").exists() and not (tmp_path / "alias" / "a").exists()


# -- engine probes ---------------------------------------------------------------------------


def test_engine_probes_live_in_the_cache_folder_unless_a_folder_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(PROBE_DIR_ENV, raising=False)
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "cache"))
    assert probe_dir() == tmp_path / "cache" / "engines"
    monkeypatch.setenv(PROBE_DIR_ENV, str(tmp_path / "probes"))
    assert probe_dir() == tmp_path / "probes"
    monkeypatch.setenv(PROBE_DIR_ENV, "")  # empty: unset
    assert probe_dir() == tmp_path / "cache" / "engines"
