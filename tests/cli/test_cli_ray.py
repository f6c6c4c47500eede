"""`--ray-address` on the command line: the command shows it as RAY_ADDRESS, plan probes the
cluster (a real subprocess) and reports the advisor's Ray findings, profiles keep it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from ckpt import TINY_LLAMA, write_checkpoint
from conftest import ROOT


def run(*args: str, home: Path) -> subprocess.CompletedProcess:
    env = dict(
        os.environ,
        QUANTDECK_CONFIG_DIR=str(home / "config"),
        QUANTDECK_DATA_DIR=str(home / "data"),
    )
    env.pop("RAY_ADDRESS", None)
    return subprocess.run(
        [sys.executable, "-m", "quantdeck.cli", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )


@pytest.fixture
def model(tmp_path: Path) -> Path:
    return write_checkpoint(tmp_path / "m", TINY_LLAMA)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


RAY = ("--distributed-executor-backend", "ray")


def test_command_puts_the_address_in_the_environment(model: Path, tmp_path: Path) -> None:
    r = run("command", str(model), *RAY, "--ray-address", "10.0.0.1:6379", home=tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("RAY_ADDRESS=10.0.0.1:6379 vllm serve ")
    assert r.stdout.count("10.0.0.1") == 1 and "--ray-address" not in r.stdout
    r = run("command", str(model), *RAY, "--ray-address", "10.0.0.1:6379", "--yaml", home=tmp_path)
    assert r.returncode == 0 and "ray" in r.stdout and "10.0.0.1" not in r.stdout


def test_plan_probes_the_cluster_and_says_it_does_not_answer(model: Path, tmp_path: Path) -> None:
    port = _closed_port()
    r = run(
        "plan", str(model), "--gpu-memory-gib", "80", *RAY,
        "--ray-address", f"127.0.0.1:{port}", "--json", home=tmp_path,
    )  # fmt: skip
    assert r.returncode == 1, r.stderr  # does not fit
    out = json.loads(r.stdout)
    assert out["fits"] is False
    assert out["ray"]["address"] == f"127.0.0.1:{port}" and out["ray"]["reachable"] is False
    refused = f"the Ray cluster at 127.0.0.1:{port} does not answer (Connection refused)"
    assert refused in out["errors"]


def test_plan_on_cpu_quotes_vllms_refusal(model: Path, tmp_path: Path) -> None:
    r = run("plan", str(model), "--device", "cpu", *RAY, home=tmp_path)
    assert r.returncode == 1, r.stderr  # an error of the advice: it does not fit
    assert "error: vLLM's CPU backend has no Ray executor" in r.stdout
    assert "'current platform cpu does not support ray.'" in r.stdout


def test_an_address_without_the_ray_backend_is_refused_with_the_fix(
    model: Path, tmp_path: Path
) -> None:
    r = run(
        "plan", str(model), "--gpu-memory-gib", "80", "--ray-address", "head:6379", "--json",
        home=tmp_path,
    )  # fmt: skip
    assert r.returncode == 1, r.stderr
    (msg,) = json.loads(r.stdout)["errors"]
    assert "set distributed_executor_backend to ray" in msg


def test_a_bad_address_is_one_line(model: Path, tmp_path: Path) -> None:
    r = run("plan", str(model), *RAY, "--ray-address", "http://x", home=tmp_path)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        "quantdeck: error: parallel.ray_address: 'http://x' is not a Ray address: "
        "use auto, HOST:PORT or ray://HOST:PORT"
    ]


def test_a_profile_keeps_the_address(model: Path, tmp_path: Path) -> None:
    args = (*RAY, "--ray-address", "ray://head:10001", "--tensor-parallel-size", "2")
    r = run("profile", "save", "cluster", str(model), *args, home=tmp_path)
    assert r.returncode == 0, r.stderr
    shown = run("profile", "show", "cluster", home=tmp_path)
    assert "ray-address: ray://head:10001" in shown.stdout.replace("'", "")
    assert "distributed-executor-backend: ray" in shown.stdout
    again = run("command", "--profile", "cluster", home=tmp_path)
    assert again.stdout.startswith("RAY_ADDRESS=ray://head:10001 vllm serve ")
