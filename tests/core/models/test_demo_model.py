"""The built-in demo model: its build, its files, and that it really learned something."""

from __future__ import annotations

import hashlib
import json
import math
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from conftest import ROOT

from quantdeck.core.errors import ModelError
from quantdeck.core.models import demo as demo_model
from quantdeck.core.models.demo import (
    DEMO_MODEL_NAME,
    MARKER_NAME,
    default_demo_dir,
    ensure_demo_model,
    is_complete,
)

HELDOUT = ROOT / "assets" / "corpus" / "heldout.txt"
SENTENCE = "The class definition is an executable statement, evaluated at run time."


def sha256(path: Path) -> str:
    """Hex SHA-256 of a file."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def leftovers(parent: Path) -> list[str]:
    """Temp folders a build left next to its target."""
    return sorted(p.name for p in parent.iterdir() if ".tmp-" in p.name or ".old-" in p.name)


# --- the build itself -------------------------------------------------------------------------


def test_files_exist(demo_model: Path) -> None:
    for name in (
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "generation_config.json",
        MARKER_NAME,
    ):
        assert (demo_model / name).is_file(), name
    assert is_complete(demo_model)
    assert leftovers(demo_model.parent) == []


def test_config_shape(demo_model: Path) -> None:
    cfg = json.loads((demo_model / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert cfg["model_type"] == "llama"
    expected = {
        "hidden_size": 256,
        "num_hidden_layers": 4,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "intermediate_size": 768,
        "vocab_size": 2048,
        "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": False,
    }
    for key, value in expected.items():
        assert cfg[key] == value, key
    rope = cfg.get("rope_theta", (cfg.get("rope_parameters") or {}).get("rope_theta"))
    assert rope == 10000
    assert cfg.get("dtype", cfg.get("torch_dtype")) == "bfloat16"
    assert cfg["intermediate_size"] % 128 == 0 and cfg["hidden_size"] % 128 == 0


def test_weights_are_bfloat16(demo_model: Path) -> None:
    from safetensors import safe_open

    with safe_open(str(demo_model / "model.safetensors"), "pt") as f:
        keys = list(f.keys())
        assert "lm_head.weight" in keys  # untied
        assert {str(f.get_slice(k).get_dtype()) for k in keys} == {"BF16"}
        assert f.get_slice("model.embed_tokens.weight").get_shape() == [2048, 256]


def test_loss_decreased(demo_model: Path) -> None:
    # The marker records the build's "done" event.
    done = json.loads((demo_model / MARKER_NAME).read_text())
    assert done["initial_loss"] > math.log(2048) - 1.0  # starts near uniform
    assert done["final_loss"] < 0.6 * done["initial_loss"]


@pytest.mark.slow  # trains the demo model for 3 steps (about 10 s)
def test_short_build_events(tmp_path: Path) -> None:
    """The real builder's stdout protocol, on a 3-step run."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "quantdeck.core.workers.demo_train",
            str(tmp_path / "o"),
            "--steps",
            "3",
            "--seed",
            "7",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    events = [json.loads(line) for line in proc.stdout.splitlines()]
    progress = [e for e in events if e["event"] == "progress"]
    assert progress[0]["stage"] == "tokenizer" and progress[-1]["stage"] == "save"
    assert [e["stage"] for e in progress].count("train") == 3
    assert all(isinstance(e["loss"], float) for e in progress if e["stage"] == "train")
    pcts = [e["pct"] for e in progress]
    assert pcts == sorted(pcts) and pcts[-1] == 100.0
    done = events[-1]
    assert done["event"] == "done" and done["out"] == str(tmp_path / "o")
    assert done["seconds"] > 0 and done["steps"] == 3 and done["seed"] == 7
    assert isinstance(done["final_loss"], float)
    assert (tmp_path / "o" / "model.safetensors").is_file()


# --- tokenizer --------------------------------------------------------------------------------


def test_tokenizer_round_trip(demo_model: Path) -> None:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(demo_model / "tokenizer.json"))
    assert tok.get_vocab_size() == 2048
    enc = tok.encode(SENTENCE)
    assert enc.ids[0] == tok.token_to_id("<|begin_of_text|>") == 0
    assert len(enc.ids) < len(SENTENCE) / 2  # BPE merges actually compress English
    assert tok.decode(enc.ids, skip_special_tokens=True) == SENTENCE
    assert tok.decode(tok.encode("naïve café ✓").ids, skip_special_tokens=True) == "naïve café ✓"


def test_auto_tokenizer_and_chat_template(demo_model: Path) -> None:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(demo_model))
    assert (tok.bos_token, tok.eos_token, tok.pad_token) == (
        "<|begin_of_text|>",
        "<|end_of_text|>",
        "<|pad|>",
    )
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (0, 1, 2)
    ids = tok(SENTENCE)["input_ids"]
    assert ids[0] == 0 and ids.count(0) == 1
    assert tok.decode(ids, skip_special_tokens=True) == SENTENCE

    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is a class?"},
    ]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|begin_of_text|><|system|>\nBe brief.<|end_of_text|>\n"
        "<|user|>\nWhat is a class?<|end_of_text|>\n<|assistant|>\n"
    )
    no_prompt = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    assert not no_prompt.endswith("<|assistant|>\n")
    chat_ids = tok(text, add_special_tokens=False)["input_ids"]
    assert chat_ids[0] == 0 and chat_ids.count(0) == 1
    assert tok.convert_tokens_to_ids("<|assistant|>") in chat_ids


# --- the model --------------------------------------------------------------------------------


def test_heldout_perplexity(demo_model: Path) -> None:
    import torch
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM

    tok = Tokenizer.from_file(str(demo_model / "tokenizer.json"))
    ids = tok.encode(HELDOUT.read_text(encoding="utf-8"), add_special_tokens=False).ids[:2048]
    assert len(ids) == 2048
    model = AutoModelForCausalLM.from_pretrained(str(demo_model), dtype=torch.float32)
    model.eval()
    windows = torch.tensor(ids).view(8, 256)
    batch = torch.cat([torch.zeros(8, 1, dtype=torch.long), windows], dim=1)  # BOS + text
    with torch.no_grad():
        loss = model(input_ids=batch, labels=batch).loss.item()
    ppl = math.exp(loss)
    print(f"heldout perplexity: {ppl:.1f}")
    assert ppl < 200, ppl


def test_greedy_generation_is_text(demo_model: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(demo_model))
    model = AutoModelForCausalLM.from_pretrained(str(demo_model), dtype=torch.float32)
    inputs = tok("The return value of a function", return_tensors="pt")
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=20, do_sample=False)
    new = tok.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    print(f"generation: {new!r}")
    words = new.split()
    assert len(words) >= 5
    assert sum(w.strip('.,;:"()').isalpha() for w in words) >= len(words) // 2


# --- ensure_demo_model ------------------------------------------------------------------------


def test_ensure_returns_at_once_when_complete(demo_model: Path) -> None:
    calls: list[dict] = []
    t0 = time.monotonic()
    assert ensure_demo_model(demo_model, on_progress=calls.append) == demo_model
    assert time.monotonic() - t0 < 1.0
    assert calls == []


def test_default_demo_dir_honours_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("QUANTDECK_DATA_DIR", str(tmp_path))
    assert default_demo_dir() == tmp_path / "models" / DEMO_MODEL_NAME
    monkeypatch.delenv("QUANTDECK_DATA_DIR")
    assert default_demo_dir().parts[-2:] == ("models", DEMO_MODEL_NAME)


def test_is_complete_needs_current_marker(tmp_path: Path) -> None:
    assert not is_complete(tmp_path / "missing")
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        (copy / name).write_bytes(b"x")
    assert not is_complete(copy)
    (copy / MARKER_NAME).write_text(json.dumps({"recipe": demo_model.RECIPE_VERSION - 1}))
    assert not is_complete(copy)
    (copy / MARKER_NAME).write_text("{not json")
    assert not is_complete(copy)
    (copy / MARKER_NAME).write_text(json.dumps({"recipe": demo_model.RECIPE_VERSION}))
    assert is_complete(copy)


def _wrapper(tmp_path: Path, body: str) -> str:
    """An executable that stands in for the Python interpreter ensure_demo_model runs."""
    script = tmp_path / "fake-python"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return str(script)


def test_failing_build_raises_and_leaves_no_tmp(tmp_path: Path) -> None:
    # The real builder, made to fail by an invalid option (exit code 2, one stderr line).
    python = _wrapper(tmp_path, f'exec "{sys.executable}" "$@" --steps 0')
    target = tmp_path / "models" / DEMO_MODEL_NAME
    events: list[dict] = []
    with pytest.raises(ModelError, match="steps"):
        ensure_demo_model(target, python=python, on_progress=lambda ev: events.append(ev.to_json()))
    assert not target.exists()
    assert sorted(tmp_path.iterdir()) == [tmp_path / "fake-python"]  # no temp, no parent made
    assert events == []


def test_missing_interpreter_raises_model_error(tmp_path: Path) -> None:
    target = tmp_path / DEMO_MODEL_NAME
    with pytest.raises(ModelError):
        ensure_demo_model(target, python=str(tmp_path / "no-such-python"))
    assert leftovers(tmp_path) == []


def _old_build(target: Path) -> Path:
    """A demo build of an earlier recipe (so not complete) with a file of its own."""
    target.mkdir()
    (target / MARKER_NAME).write_text(json.dumps({"recipe": demo_model.RECIPE_VERSION - 1}))
    (target / "stale").write_text("from the earlier build")
    return target


def test_build_dying_midway_keeps_old_target(tmp_path: Path) -> None:
    python = _wrapper(
        tmp_path,
        textwrap.dedent("""\
        echo '{"event": "progress", "stage": "tokenizer", "pct": 0.0}'
        echo "killed by the test" >&2
        exit 1"""),
    )
    target = _old_build(tmp_path / DEMO_MODEL_NAME)
    events: list[dict] = []
    with pytest.raises(ModelError, match="killed by the test"):
        ensure_demo_model(target, python=python, on_progress=lambda ev: events.append(ev.to_json()))
    assert [e["event"] for e in events] == ["progress"]
    assert (target / "stale").exists()
    assert leftovers(tmp_path) == []


def test_earlier_build_is_replaced(tmp_path: Path) -> None:
    # A stand-in builder that writes the files at once, to check the move into place.
    python = _wrapper(
        tmp_path,
        textwrap.dedent("""\
        for out; do :; done  # the last argument: the folder the worker builds
        for f in config.json model.safetensors tokenizer.json tokenizer_config.json; do
          echo '{}' > "$out/$f"
        done
        echo 'not json'
        echo '{"event": "done", "out": "'"$out"'", "seconds": 0.1, "final_loss": 1.0}'"""),
    )
    target = _old_build(tmp_path / DEMO_MODEL_NAME)
    events: list[dict] = []
    assert (
        ensure_demo_model(target, python=python, on_progress=lambda ev: events.append(ev.to_json()))
        == target
    )
    assert is_complete(target)
    assert not (target / "stale").exists()
    assert [e["event"] for e in events] == ["log", "done"]
    assert leftovers(tmp_path) == []
    marker = json.loads((target / MARKER_NAME).read_text())
    assert marker["recipe"] == demo_model.RECIPE_VERSION and marker["final_loss"] == 1.0


def test_cli_error_is_one_line_exit_2(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "quantdeck.core.workers.demo_train",
            str(tmp_path / "o"),
            "--steps",
            "-3",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert proc.returncode == 2
    assert proc.stdout == ""
    assert len(proc.stderr.strip().splitlines()) == 1 and "--steps" in proc.stderr


@pytest.mark.slow
def test_same_seed_is_byte_identical(demo_model: Path, tmp_path: Path) -> None:
    events: list[dict] = []
    again = ensure_demo_model(
        tmp_path / DEMO_MODEL_NAME, on_progress=lambda ev: events.append(ev.to_json())
    )
    for name in ("model.safetensors", "tokenizer.json", "config.json", "tokenizer_config.json"):
        assert sha256(again / name) == sha256(demo_model / name), name
    stages = [e["stage"] for e in events if e["event"] == "progress"]
    assert stages[0] == "tokenizer" and stages[-1] == "save" and "train" in stages
    assert events[-1]["event"] == "done"
    assert (
        events[-1]["final_loss"] == json.loads((demo_model / MARKER_NAME).read_text())["final_loss"]
    )


def test_a_second_build_waits_for_the_first_and_uses_what_it_built(tmp_path: Path) -> None:
    """Two first starts at once (a panel and a CLI, two test workers): while one builds (holds
    the build lock), the other waits, then returns that build without building again (its
    interpreter here does not exist: a build of its own would raise)."""
    import fcntl
    import threading

    target = tmp_path / "models" / DEMO_MODEL_NAME
    target.parent.mkdir()
    outcome: list[object] = []

    def second() -> None:
        try:
            outcome.append(ensure_demo_model(target, python=str(tmp_path / "no-python")))
        except Exception as exc:  # reported by the assertions below
            outcome.append(exc)

    with open(demo_model.build_lock_path(target), "ab") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)  # the first build, under way
        waiter = threading.Thread(target=second, daemon=True)
        waiter.start()
        waiter.join(0.5)
        assert waiter.is_alive() and outcome == []  # waiting, not building
        target.mkdir()  # the first build lands
        for name in demo_model._REQUIRED_FILES:
            (target / name).write_text("{}")
        marker = {"recipe": demo_model.RECIPE_VERSION, "name": DEMO_MODEL_NAME}
        (target / MARKER_NAME).write_text(json.dumps(marker))
    waiter.join(10)
    assert outcome == [target]
