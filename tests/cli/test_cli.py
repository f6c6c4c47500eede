"""The headless CLI: JSON outputs and one-line errors with exit code 2, no traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from ckpt import LLAMA3_8B, write_checkpoint
from conftest import ROOT


def run(*args: str, env_extra: dict | None = None) -> subprocess.CompletedProcess:
    import os

    env = dict(os.environ, **(env_extra or {}))
    return subprocess.run(
        [sys.executable, "-m", "quantdeck.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


@pytest.fixture(scope="module")
def llama8b(tmp_path_factory) -> Path:
    return write_checkpoint(tmp_path_factory.mktemp("m") / "l8b", LLAMA3_8B, shards=4)


def test_inspect_json(llama8b: Path) -> None:
    r = run("inspect", str(llama8b), "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    for key in (
        "architecture",
        "model_type",
        "num_parameters",
        "num_layers",
        "hidden_size",
        "num_attention_heads",
        "num_kv_heads",
        "head_dim",
        "vocab_size",
        "max_position_embeddings",
        "torch_dtype",
        "weights_bytes",
        "quantization",
    ):
        assert key in d
    assert d["num_parameters"] == 8_030_261_248 and d["quantization"] is None


def test_plan_json_for_a_gpu_that_is_not_here(llama8b: Path) -> None:
    r = run(
        "plan",
        str(llama8b),
        "--max-model-len",
        "2048",
        "--gpu-memory-utilization",
        "0.85",
        "--device",
        "cuda",
        "--gpu-memory-gib",
        str(150754820096 / 2**30),
        "--json",
    )
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    for key in (
        "weights_bytes",
        "kv_bytes_per_token",
        "kv_cache_bytes",
        "block_size",
        "num_blocks",
        "kv_cache_tokens",
        "max_concurrency",
        "fits",
        "warnings",
    ):
        assert key in d
    assert abs(d["kv_cache_tokens"] / 834_496 - 1) < 0.05 and d["fits"] is True


def test_plan_reports_advice(llama8b: Path) -> None:
    r = run(
        "plan",
        str(llama8b),
        "--enforce-eager",
        "--device",
        "cuda",
        "--gpu-memory-gib",
        "140",
        "--json",
    )
    d = json.loads(r.stdout)
    assert any("eager mode costs" in w for w in d["warnings"])


def test_plan_exits_1_when_the_launch_does_not_fit(llama8b: Path) -> None:
    """A script can ask `plan` first: 1 when it does not fit (the plan printed all the same),
    0 when it does, 2 for a user's error."""
    small = ("--device", "cuda", "--gpu-memory-gib", "8")  # 16 GB of weights
    r = run("plan", str(llama8b), *small, "--json")
    assert r.returncode == 1, r.stderr
    d = json.loads(r.stdout)
    assert d["fits"] is False and d["reasons"]
    r = run("plan", str(llama8b), *small)
    assert r.returncode == 1 and "fits          no" in r.stdout and r.stderr == ""
    r = run("plan", "--help")
    assert r.returncode == 0 and "1 when it does not" in " ".join(r.stdout.split())


@pytest.mark.parametrize(
    "args, message",
    [
        (["inspect", "/nonexistent/model"], "/nonexistent/model: no such folder"),
        (["plan", "/nonexistent/model"], "no such folder"),
        (
            ["plan", "MODEL", "--gpu-memory-utilization", "1.7"],
            "gpu_memory_utilization: 1.7 is above the maximum 1",
        ),
        (
            ["plan", "MODEL", "--max-num-seqs", "64", "--max-num-batched-tokens", "8"],
            "smaller than scheduler.max_num_seqs",
        ),
        (["plan", "MODEL", "--profile", "/nonexistent.yaml"], "no such profile file"),
        (
            [
                "plan",
                "MODEL",
                "--device",
                "cuda",
                "--gpu-memory-gib",
                "80",
                "--compute-capability",
                "nine",
            ],
            "is not X.Y",
        ),
        (["profile", "show", "nope"], "no such profile file"),
    ],
)
def test_one_line_errors(llama8b: Path, args: list[str], message: str) -> None:
    args = [str(llama8b) if a == "MODEL" else a for a in args]
    r = run(*args)
    assert r.returncode == 2
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], r.stderr
    assert "Traceback" not in r.stderr


def test_corrupt_model_one_line(tmp_path: Path) -> None:
    root = write_checkpoint(tmp_path / "m", dict(LLAMA3_8B, num_hidden_layers=1))
    (root / "config.json").write_text("{oops")
    r = run("inspect", str(root), "--json")
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and "config.json: corrupt JSON" in r.stderr


def test_command_and_profiles(llama8b: Path, tmp_path: Path) -> None:
    env = {"QUANTDECK_CONFIG_DIR": str(tmp_path / "cfg")}
    r = run("command", str(llama8b), "--max-num-seqs", "32", "--enforce-eager", env_extra=env)
    assert r.returncode == 0
    assert r.stdout.split()[:3] == ["vllm", "serve", str(llama8b)]
    assert "--max-num-seqs=32" in r.stdout and "--enforce-eager" in r.stdout
    r = run(
        "profile",
        "save",
        "eager32",
        str(llama8b),
        "--max-num-seqs",
        "32",
        "--enforce-eager",
        env_extra=env,
    )
    assert r.returncode == 0, r.stderr
    saved = Path(r.stdout.strip())
    assert saved.is_file()
    r2 = run("command", "--profile", "eager32", env_extra=env)
    assert r2.stdout == run("command", "--profile", str(saved), env_extra=env).stdout
    assert "--max-num-seqs=32" in r2.stdout
    assert run("profile", "list", env_extra=env).stdout.split() == ["eager32"]
    r3 = run("command", "--profile", "eager32", "--yaml", env_extra=env)
    assert "max-num-seqs: 32" in r3.stdout


def test_models_lists_folders_and_hf_cache(llama8b: Path, tmp_path: Path) -> None:
    snap = tmp_path / "hub" / "models--org--tiny" / "snapshots" / "abc123"
    write_checkpoint(snap, dict(LLAMA3_8B, num_hidden_layers=1, vocab_size=512))
    (tmp_path / "hub" / "models--org--tiny" / "refs").mkdir()
    (tmp_path / "hub" / "models--org--tiny" / "refs" / "main").write_text("abc123")
    (tmp_path / "hub" / "models--org--tiny" / "blobs").mkdir()
    r = run(
        "models", str(llama8b.parent), "--json", env_extra={"HF_HUB_CACHE": str(tmp_path / "hub")}
    )
    assert r.returncode == 0, r.stderr
    found = {(e["name"], e["source"]) for e in json.loads(r.stdout)}
    assert ("l8b", "folder") in found and ("org/tiny", "hf-cache") in found


def test_kv_events_read_as_one_line_for_a_person() -> None:
    from quantdeck.cli._common import human_event
    from quantdeck.core.events import KvEvent

    line = human_event(KvEvent(30, 4, 26, 0.25, evicted_total=4, batches_lost=2))
    assert line == (
        "[kv] resident 26 blocks, stored 30 removed 4 evicted 4, prefix hits 25.0% lost 2 batches"
    )
    assert human_event(KvEvent(0, 0, 0, None)).endswith("prefix hits -")


def test_ab_and_tune_progress_lines_for_a_person(capsys: pytest.CaptureFixture[str]) -> None:
    """`ab`/`tune` without --json-events: each arm and point in one line on stderr, an arm's
    server only when it crashed; with --json-events the JSON object on stdout."""
    from quantdeck.cli._common import Progress
    from quantdeck.core.events import ArmEvent, ArmServerEvent, PointEvent, StateEvent

    show = Progress(json_events=False)
    show(ArmEvent(0, 2, "eager", "done", error="crashed", t=1.0))
    show(PointEvent(1, {"max_num_seqs": 4}, "starting", t=2.0))
    show(PointEvent(1, {"max_num_seqs": 4}, "done", {"goodput": 2.5, "meets": False}, t=3.0))
    show(ArmServerEvent(1, StateEvent("ready", t=4.0)))
    show(ArmServerEvent(1, StateEvent("crashed", reason="engine died", t=5.0)))
    out, err = capsys.readouterr()
    assert out == "" and err.splitlines() == [
        "[1/2] eager: done (crashed)",
        "point 1: max_num_seqs=4: starting",
        "point 1: max_num_seqs=4: goodput 2.50 req/s (misses targets)",
        "  server crashed: engine died",
    ]
    Progress(json_events=True)(ArmEvent(0, 2, "eager", "starting", t=1.0))
    out, err = capsys.readouterr()
    assert (
        json.loads(out)
        == {"t": 1.0, "event": "arm", "index": 0, "total": 2, "label": "eager", "stage": "starting"}
        and err == ""
    )
