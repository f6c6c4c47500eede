"""Bad inputs a new user tries, through ``main(argv)`` in process: one ``quantdeck: error:``
line and exit 2, or the command's normal output; never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_sandbox import TINY, make_sandbox, run_cli


@pytest.fixture
def sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return make_sandbox(tmp_path, monkeypatch)


def test_models_lists_a_bad_folder_with_its_error(
    sandbox: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: one folder with ``head_dim: "x"`` made `quantdeck models` crash."""
    code, out, _ = run_cli(["models", "lib", "--no-hf-cache", "--json"], capsys)
    rows = {r["name"]: r for r in json.loads(out)}
    assert code == 0 and rows["good"]["error"] is None
    assert rows["good"]["architecture"] == "LlamaForCausalLM"
    assert "'head_dim' must be an integer" in rows["bad"]["error"]


@pytest.mark.parametrize(
    "argv, message",
    [
        (["inspect", "bad-model"], "'architectures' must be a list of names"),
        (["plan", "bad-model", "--device", "cpu"], "'architectures' must be a list of names"),
        (["replay", "bad-rec.jsonl"], "'version' must be an integer >= 1, got '1'"),
        (["replay", "rec.jsonl", "--size", "abc"], "'abc' is not WIDTHxHEIGHT"),
        (["replay", "rec.jsonl", "--size", "99999x1"], "must be 1 to 10000"),
        (["runs", "run.json", "bad-run.json"], "'output_throughput' must be a finite number"),
        (["report", "bad-run.json"], "'output_throughput' must be a finite number"),
        (["command", "model", "--gpu-memory-utilization", "nan"], "not a finite number"),
        (["command", "--profile", "deep.yaml"], "not valid YAML"),
        (["command", "model", "--max-model-len", "9" * 400 + "k"], "max_model_len"),
        (["profile", "save", "x\n", "model"], "profile name"),
    ],
)
def test_bad_inputs_are_one_line(
    sandbox: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, _, err = run_cli(argv, capsys)
    assert code == 2 and message in err and err.count("\n") == 1, err


@pytest.mark.parametrize(
    "field, value", [("max_position_embeddings", -5), ("num_key_value_heads", 0)]
)
def test_nonpositive_shapes_do_not_plan(
    sandbox: Path, capsys: pytest.CaptureFixture[str], field: str, value: int
) -> None:
    """Before: these planned as "fits" with negative concurrency."""
    (sandbox / "model" / "config.json").write_text(json.dumps({**TINY, field: value}))
    code, _, err = run_cli(["plan", "model", "--device", "cpu"], capsys)
    assert code == 2 and field in err


def test_no_command_opens_the_panel(sandbox: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli([], capsys)[0] == "reached"
