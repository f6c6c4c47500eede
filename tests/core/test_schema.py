"""The one schema check every reader uses: strict JSON (finite numbers, bounded nesting),
typed fields whose failures are one line naming the file and the key, regular files only."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import pytest
from ckpt import LLAMA3_8B, write_checkpoint

from quantdeck.core.errors import ConfigError, ModelError, QuantdeckError
from quantdeck.core.launch.profiles import load_file
from quantdeck.core.models import inspect_model
from quantdeck.core.monitor import read_recording
from quantdeck.core.schema import MAX_DEPTH, Fields, load_json, shown

TINY = dict(LLAMA3_8B, hidden_size=64, intermediate_size=128, num_hidden_layers=1, vocab_size=64)


@pytest.mark.parametrize(
    "text, message",
    [
        ("NaN", "NaN is not a finite number"),
        ('{"a": [-Infinity]}', "-Infinity is not a finite number"),
        ("1e999", "1e999 is not a finite number"),
        ("9" * 5000, "a number too long"),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
        ("[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1), f"nested more than {MAX_DEPTH} levels"),
        (b"\xff\xfe\x00", "not UTF-8 text"),
        ("{", "corrupt JSON (line 1"),
    ],
)
def test_load_json_refuses(text: str | bytes, message: str) -> None:
    with pytest.raises(ModelError, match=message.replace("(", r"\(")) as e:
        load_json(text, "f.json", error=ModelError)
    assert str(e.value).startswith("f.json: ")


def test_load_json_nonfinite_as_none_and_depth_at_the_bound() -> None:
    assert load_json("[NaN, Infinity, 1e999, 1.5]", "f", nonfinite_as_none=True) == [
        None,
        None,
        None,
        1.5,
    ]
    deep = "[" * MAX_DEPTH + "]" * MAX_DEPTH
    assert load_json(deep, "f") is not None


def test_fields_name_the_key_and_the_bound() -> None:
    f = Fields({"n": True, "s": 5, "x": -5, "o": [], "big": 10**400}, "c.json")
    with pytest.raises(ConfigError, match="c.json: 'n' must be an integer, got True"):
        f.integer("n")
    with pytest.raises(ConfigError, match="'x' must be an integer >= 1, got -5"):
        f.integer("x", lo=1)
    with pytest.raises(ConfigError, match="'big' must be a finite number <= 1e\\+15"):
        f.number("big", hi=1e15)
    with pytest.raises(ConfigError, match="'s' must be a string"):
        f.text("s")
    with pytest.raises(ConfigError, match="c.json: 'o' must be a JSON object, got \\[\\]"):
        f.sub("o")
    with pytest.raises(ConfigError, match="'missing' missing \\(expected true or false\\)"):
        f.boolean("missing", required=True)
    assert f.integer("absent") is None and f.first("absent", "x") == "x"
    with pytest.raises(ConfigError, match="c.json: expected a JSON object, got list"):
        Fields([], "c.json")


def test_shown_is_short_for_huge_values() -> None:
    nested: list = ["x" * 10_000]
    for _ in range(50):
        nested = [nested] * 10
    assert len(shown(nested)) < 200


def _model_with_fifo(path: Path) -> Path:
    """A model folder whose weights file is a FIFO, the reader is given the folder."""
    root = write_checkpoint(path.parent / "m", TINY)
    (root / "model.safetensors").unlink()
    os.mkfifo(root / "model.safetensors")
    return root


@pytest.mark.parametrize(
    "make, read",
    [
        (_model_with_fifo, inspect_model),
        (lambda p: p, read_recording),
        (lambda p: p, load_file),
    ],
    ids=["safetensors", "recording", "profile"],
)
def test_a_fifo_is_refused_not_waited_on(tmp_path: Path, make: Any, read: Any) -> None:
    fifo = tmp_path / "f.fifo"
    os.mkfifo(fifo)
    target = make(fifo)
    errors: list[BaseException] = []
    t = threading.Thread(target=lambda: _catch(read, target, errors), daemon=True)
    t.start()
    t.join(5)
    if t.is_alive():
        for f in (fifo, target / "model.safetensors"):
            if f.exists():
                with open(f, "wb"):  # let the blocked reader go
                    pass
        pytest.fail("the reader blocked on a FIFO")
    assert len(errors) == 1 and isinstance(errors[0], QuantdeckError), errors
    assert "not a regular file" in str(errors[0])


def _catch(read: Any, target: Path, errors: list[BaseException]) -> None:
    try:
        read(target)
    except BaseException as e:  # reported by the test
        errors.append(e)
