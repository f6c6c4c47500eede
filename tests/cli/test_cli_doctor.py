"""``quantdeck doctor``: the report of this machine and its engines, in a subprocess; engines
that cannot serve (a bare venv, a broken vLLM) say so and exit 1; a path naming no program
exits 2."""

from __future__ import annotations

import importlib.metadata as md
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from fake_engines import make_broken_vllm

from quantdeck.core import doctor
from quantdeck.core.engines import Engine, Library

QUANTDECK = str(Path(sys.executable).parent / "quantdeck")


def run_doctor(*args: str) -> tuple[int, dict[str, Any]]:
    r = subprocess.run(
        [QUANTDECK, "doctor", "--json", *args], capture_output=True, text=True, timeout=600
    )
    assert r.returncode in (0, 1), r.stderr
    return r.returncode, json.loads(r.stdout)


def cpuinfo_flags() -> set[str]:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.split(":")[0].strip() in ("flags", "Features"):
            return set(line.split(":", 1)[1].split())
    return set()


@pytest.mark.slow
def test_doctor_reports_this_venv_as_an_engine_that_serves() -> None:
    code, report = run_doctor()
    assert code == 0 and report["can_serve"] is True
    engine = report["engines"][0]
    assert engine["python"] == str(Path(sys.executable).absolute())
    assert engine["vllm_distribution"] == "vllm-cpu"
    assert engine["vllm_version"] == md.version("vllm-cpu")
    assert engine["vllm_imports"] is True and engine["vllm_platform"] == "cpu"
    assert engine["torch_version"] == md.version("torch")
    assert engine["torch_cuda"] is None  # the CPU build of torch
    for lib in engine["libraries"]:  # as find_spec sees them here (nothing imported)
        name = lib["name"].replace("-", "_")
        assert lib["importable"] == (importlib.util.find_spec(name) is not None), name
    assert set(report["cpu"]["flags"]) == cpuinfo_flags()
    assert not [p for p in report["problems"] if p["check"] == "engine" and p["level"] == "error"]
    # FP8 and W8A8 convert here without llmcompressor: the doctor does not ask for it
    assert not [p for p in report["problems"] if "llmcompressor" in p["message"]]


def test_doctor_without_vllm_says_so_and_exits_1(bare_venv: Path) -> None:
    code, report = run_doctor("--engine-python", str(bare_venv))
    assert code == 1 and report["can_serve"] is False
    (engine,) = report["engines"]
    assert engine["python"] == str(bare_venv)
    assert engine["python_version"] and engine["vllm_distribution"] is None
    assert not engine["vllm_imports"]
    errors = [p for p in report["problems"] if p["level"] == "error"]
    assert [p["message"] for p in errors] == [f"{bare_venv}: vLLM is not installed there"]
    assert "pip install" in errors[0]["fix"]
    # the machine's part of the report is there all the same
    assert set(report["cpu"]["flags"]) == cpuinfo_flags()
    kernels = report["cpu"]["vllm_cpu_kernels"]
    have = cpuinfo_flags()
    assert kernels == ("avx512" if "avx512f" in have else "avx2" if "avx2" in have else kernels)
    assert {d["role"] for d in report["disk"]} == {"models", "cache", "hf-cache"}
    assert report["ports"][0]["port"] == 8000


def test_doctor_with_a_vllm_that_does_not_import(bare_venv: Path, tmp_path: Path) -> None:
    """A venv whose vLLM is installed (its metadata says 9.9.0) but fails on import."""
    broken = make_broken_vllm(bare_venv, tmp_path / "broken")
    code, report = run_doctor("--engine-python", str(broken))
    assert code == 1
    (engine,) = report["engines"]
    assert (engine["vllm_distribution"], engine["vllm_version"]) == ("vllm", "9.9.0")
    assert engine["vllm_error"] == "ImportError: libcudart.so.12: not found"
    (error,) = [p for p in report["problems"] if p["level"] == "error"]
    assert "does not import" in error["message"] and "vllm==9.9.0" in error["fix"]


def test_doctor_refuses_a_path_that_names_no_program(tmp_path: Path) -> None:
    """A missing path or a file that cannot run is the user's typo: one line, exit 2, no
    report (an executable that is not a Python with vLLM is a finding: exit 1, above)."""
    text = tmp_path / "notes.txt"
    text.write_text("hello\n")
    for bad in (str(tmp_path / "missing"), str(text), ""):
        r = subprocess.run(
            [QUANTDECK, "doctor", "--json", "--engine-python", bad],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 2 and r.stdout == "", (bad, r.stdout)
        assert r.stderr.strip().splitlines() == [
            f"quantdeck: error: --engine-python {bad!r}: not an executable file"
        ]


def test_doctor_text_report(bare_venv: Path) -> None:
    r = subprocess.run(
        [QUANTDECK, "doctor", "--engine-python", str(bare_venv)], capture_output=True, text=True
    )
    assert r.returncode == 1
    assert f"Engine    {bare_venv}: no vLLM" in r.stdout
    assert "Verdict: cannot serve" in r.stdout
    assert "fix: " in r.stdout


# -- the machine's checks, on given inputs ---------------------------------------------------


def test_cpu_kernels_follow_the_flags(tmp_path: Path) -> None:
    info = tmp_path / "cpuinfo"
    for flags, kernels, level in (
        ("fpu sse2 avx avx2 avx512f avx512_bf16 amx_tile", "avx512", None),
        ("fpu sse2 avx avx2", "avx2", "info"),
        ("fpu sse2", "none", "error"),
    ):
        info.write_text(f"model name\t: Test CPU\nflags\t\t: {flags}\n\nflags\t: other\n")
        cpu = doctor.check_cpu(str(info))
        assert cpu.flags == tuple(sorted(flags.split())) and cpu.vllm_cpu_kernels == kernels
        problems = doctor._cpu_problems(cpu)
        assert [p.level for p in problems] == ([level] if level else [])


def test_qt_problems_name_the_packages() -> None:
    def libs(missing: set[str]) -> doctor.QtLibraries:
        return doctor.QtLibraries(
            "x11",
            tuple(
                doctor.QtLibrary(s, n, None if s in missing else f"/lib/{s}.so", d, f)
                for s, n, d, f in doctor.QT_LIBRARIES
            ),
        )

    assert doctor._qt_problems(libs(set())) == []
    (p,) = doctor._qt_problems(libs({"libxcb-cursor"}))  # X11 session, Wayland complete
    assert p.level == "warning" and "libxcb-cursor0" in p.fix and "xcb-util-cursor" in p.fix
    (p,) = doctor._qt_problems(libs({"libwayland-cursor"}))  # not the session's platform
    assert p.level == "info"
    (p,) = doctor._qt_problems(libs({"libxcb-cursor", "libwayland-egl", "libEGL"}))
    assert "cannot open a window" in p.message and "libegl1" in p.fix


def test_qt_libraries_are_found_as_the_linker_finds_them() -> None:
    known = doctor._ldconfig_sonames()
    if known is None:
        pytest.skip("no ldconfig")
    for stem, path in (("libc", "libc.so.6"), ("libxcb", "libxcb.so.1")):
        if path in known:
            assert doctor.find_shared_library(stem, known) == known[path]
    assert doctor.find_shared_library("libquantdeck-none", known) is None
    assert doctor.find_shared_library("libxcb", {"libxcb-cursor.so.0": "/x"}) is None


def test_a_taken_port_is_a_problem_with_a_free_one_named() -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        taken = doctor.check_port("127.0.0.1", port)
    assert not taken.free and taken.suggestion and taken.suggestion != port
    (p,) = doctor._port_problems(taken)
    assert f"--port {taken.suggestion}" in p.fix
    assert doctor.check_port("127.0.0.1", port).free  # closed again


def test_library_notes_say_what_each_conversion_needs() -> None:
    """A missing library is a note naming the ``quantize`` methods that use it (each method's
    backend); llmcompressor converts nothing here (FP8 and W8A8 go through compressed-tensors
    itself), so its absence is not asked about."""
    libs = (
        Library("bitsandbytes", False, None),
        Library("gptqmodel", False, None),
        Library("compressed-tensors", False, None),
        Library("llmcompressor", False, None),
    )
    engine = Engine(python="/py", vllm_imports=True, libraries=libs)
    gpus = doctor.Gpus(False, "no driver", None, None)
    notes = {p.message: p for p in doctor._engine_problems(engine, gpus)}
    assert list(notes) == [
        "/py: bitsandbytes is not installed (needed for quantize --method bnb-nf4, bnb-int8; "
        "serving bitsandbytes checkpoints)",
        "/py: gptqmodel is not installed (needed for quantize --method gptq, awq)",
        "/py: compressed-tensors is not installed (needed for quantize --method fp8, "
        "fp8-tensor, w8a8; serving compressed-tensors checkpoints)",
    ]
    assert all(
        p.level == "info" and p.fix.startswith("/py -m pip install ") for p in notes.values()
    )
    # every conversion method's library is one the engine check looks for
    from quantdeck.core.models import CONVERSION_METHODS
    from quantdeck.core.workers.engine_check import LIBRARIES

    assert {m.library for m in CONVERSION_METHODS.values()} <= set(LIBRARIES.values())
