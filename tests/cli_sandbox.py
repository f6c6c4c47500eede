"""A sandbox for running ``quantdeck`` commands in process: the working folder, home and user
folders in ``tmp_path``, sample files of every kind there (good and damaged), and every entry
point that would start a server, a job, a window or a network call replaced by one that raises
:class:`Reached`, so a test sees parsing and validation only."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from ckpt import TINY_LLAMA, write_checkpoint

from quantdeck.cli.main import build_parser, main

TINY = TINY_LLAMA
BENCH_RUN = {"completed": 4, "failed": 0, "output_throughput": 10.0, "median_ttft_ms": 5.0}

HEAVY = [
    "quantdeck.cli.gui.cmd_gui",
    "quantdeck.cli.gui.cmd_screenshots",
    "quantdeck.gui.monitor.replay.main",
    "quantdeck.gui.report.write_report",
    "quantdeck.core.models.ensure_demo_model",
    "quantdeck.core.models.demo.ensure_demo_model",
    "quantdeck.core.runtime.ServerProcess.start",
    "quantdeck.core.runtime.AttachedServer.check",
    "quantdeck.core.convert.run_job",
    "quantdeck.core.convert.compare_quality",
    "quantdeck.core.bench.Bench.run",
    "quantdeck.core.bench.ABRun.run",
    "quantdeck.core.bench.Tuner.run",
    "quantdeck.core.runtime.lora.load_adapter",
    "quantdeck.core.runtime.lora.unload_adapter",
    "quantdeck.core.doctor.run_doctor",
    "quantdeck.core.engines.registry.check_engine",
    "quantdeck.core.runtime.EngineEnv.capabilities",  # the engine probe: imports vLLM there
    "quantdeck.core.runtime.lora.loaded_adapters",
    "quantdeck.core.fleet.Fleet.start_instances",
]


class Reached(Exception):
    """A heavy entry point was reached: the command's options parsed and validated."""


def _reached(*_: Any, **__: Any) -> None:
    raise Reached


def make_sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    from quantdeck.core import http

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("QUANTDECK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(signal, "signal", lambda *_: None)  # the test process keeps its own
    for target in HEAVY:
        monkeypatch.setattr(target, _reached)
    parser = build_parser()  # built once, with the stand-ins above (argparse parsers are reusable)
    monkeypatch.setattr("quantdeck.cli.main.build_parser", lambda: parser)
    # --ca-bundle / --insecure set process-wide TLS: give it back after the test
    monkeypatch.setattr(http._TLS, "ca_bundle", http._TLS.ca_bundle)
    monkeypatch.setattr(http._TLS, "insecure", http._TLS.insecure)

    write_checkpoint(tmp_path / "model", TINY)
    bad = write_checkpoint(tmp_path / "bad-model", TINY)
    (bad / "config.json").write_text(json.dumps(dict(TINY, architectures=[1])))
    write_checkpoint(tmp_path / "lib" / "good", TINY)
    bad = write_checkpoint(tmp_path / "lib" / "bad", TINY)
    (bad / "config.json").write_text(json.dumps(dict(TINY, head_dim="x")))
    header = {"event": "recording", "version": 1, "t": 1.0, "title": "<b>x</b>"}
    metrics = {"event": "metrics", "t": 2.0, "kv_usage_pct": 5.0, "gpus": []}
    _lines(tmp_path / "rec.jsonl", header, metrics)
    _lines(tmp_path / "bad-rec.jsonl", {**header, "version": "1"}, metrics)
    (tmp_path / "run.json").write_text(json.dumps(BENCH_RUN))
    (tmp_path / "bad-run.json").write_text(json.dumps({**BENCH_RUN, "output_throughput": "x"}))
    runs = tmp_path / "data" / "runs"
    runs.mkdir(parents=True)
    (runs / "20260101-000000-r.json").write_text(json.dumps(BENCH_RUN))
    (tmp_path / "profile.yaml").write_text("max-num-seqs: 8\n")
    (tmp_path / "deep.yaml").write_text("[" * 1000)
    (tmp_path / "garbage.bin").write_bytes(bytes(range(256)) * 4)
    (tmp_path / "text.txt").write_text("The quick brown fox. " * 20)
    (tmp_path / "prompts.jsonl").write_text(json.dumps({"prompt": "hi", "output_len": 4}) + "\n")
    (tmp_path / "empty-dir").mkdir()
    return tmp_path


# codes a report command gives besides 0 and 2 (documented): `fleet status` 3, none running;
# `plan` 1, the launch does not fit
REPORT_CODES: dict[tuple[str, ...], tuple[int, ...]] = {("fleet", "status"): (3,), ("plan",): (1,)}


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int | str, str, str]:
    """``main(argv)``'s exit code ("reached" past validation), stdout and stderr, checked:
    0 or 2 (or a report's own code), one error line last for 2, no traceback, under 5 s."""
    t0 = time.monotonic()
    try:
        code: int | str = main(argv)
    except SystemExit as e:  # argparse
        code = 0 if e.code is None else int(e.code)
    except Reached:
        code = "reached"
    out, err = capsys.readouterr()
    assert time.monotonic() - t0 < 5, argv
    assert "Traceback" not in err, (argv, err)
    reports = (*REPORT_CODES.get(tuple(argv[:1]), ()), *REPORT_CODES.get(tuple(argv[:2]), ()))
    assert code in (0, 2, "reached", *reports), (argv, code, err)
    if code == 2:
        last = [line for line in err.splitlines() if line.strip()][-1]
        assert last.startswith("quantdeck") and ": error: " in last, (argv, err)
    return code, out, err


def _lines(path: Path, *objs: Any) -> None:
    path.write_text("".join(json.dumps(o) + "\n" for o in objs))


# Values for any option: valid ones (so validation runs past parsing), hostile numbers, and
# the sandbox's files, good and damaged (relative names: the working folder is the sandbox).
VALUES = [
    *("", " ", "0", "1", "8", "64", "-1", "0.5", "2", "1e-300"),
    *("nan", "inf", "-inf", "1e999", "9" * 400, "9" * 400 + "k", "1.5G", "4GiB", "1k"),
    *("abc", "auto", "none", "x", "a=b", "-", "--", "=", "a,b", "1,2", "\n", "\t"),
    *("eager=--enforce-eager", "graphs=", "e=model --max-num-seqs 4", "max_num_seqs=1,2"),
    *("ttft:100", "ttft:nan", "e2el:-1", "tpot", "ttft:1e999"),
    *("http://127.0.0.1:9", "http://[::1]:9", "https://localhost:9", "ftp://x", "::1"),
    *("1400x900", "0x0", "99999x1", "10x", "float16", "fp8", "gptq", "cpu", "cuda"),
    *("model", "bad-model", "lib", "rec.jsonl", "bad-rec.jsonl", "run.json", "bad-run.json"),
    *("profile.yaml", "deep.yaml", "garbage.bin", "text.txt", "prompts.jsonl", "missing"),
    *("new-out", "empty-dir", "new.jsonl", "saved-profile", "20260101-000000-r.json"),
]
