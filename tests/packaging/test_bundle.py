"""The standalone bundle: ``packaging/build-app.sh OUTDIR`` (PyInstaller, onedir) and its
tarball's ``install.sh``. The frozen app starts and prints its version, holds neither torch nor
vLLM, reports no engine until one is registered, then runs a worker that needs Quantdeck's core
(the quality check) in that engine; ``install.sh`` puts the command and the desktop entry in a
temporary prefix and takes them away again, and refuses what a bundle did not make.

Slow: the build (a light venv from pip's cache, then PyInstaller) takes one to two minutes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from conftest import ROOT

pytestmark = pytest.mark.slow
BUILD = ROOT / "packaging" / "build-app.sh"


def run(cmd: list[str], env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def user_env(tmp: Path) -> dict[str, str]:
    """An environment of a user of its own: home, XDG folders and Quantdeck's folders under
    ``tmp``, no active venv or conda env."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "CONDA_PREFIX")}
    env.update(HOME=str(tmp / "home"), XDG_DATA_HOME=str(tmp / "home" / "share"))
    for folder in ("config", "cache", "data"):
        env[f"QUANTDECK_{folder.upper()}_DIR"] = str(tmp / folder)
    return env


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("app")
    env = {**os.environ, "PYTHON": sys.executable}
    r = run(["bash", str(BUILD), str(out)], env, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    return out


def test_bundle_starts_prints_its_version_and_holds_no_engine(bundle: Path, tmp_path: Path) -> None:
    app = bundle / "quantdeck" / "quantdeck"
    env = user_env(tmp_path)
    r = run([str(app), "--version"], env)
    assert r.returncode == 0 and r.stdout.strip() == "quantdeck 0.1.0", r.stdout + r.stderr
    internal = bundle / "quantdeck" / "_internal"
    assert not [p.name for p in internal.iterdir() if p.name in ("torch", "vllm", "triton")]
    # the workers an engine runs lie there as source files
    assert (internal / "quantdeck" / "core" / "workers" / "engine.py").is_file()
    (tarball,) = bundle.glob("quantdeck-0.1.0-linux-*.tar.gz")
    with tarfile.open(tarball) as t:
        names = set(t.getnames())
    assert {"quantdeck/quantdeck", "quantdeck/install.sh", "quantdeck/.quantdeck-bundle"} <= names
    # no Python of its own: no engine until one is registered
    r = run([str(app), "doctor", "--json"], env)
    report = json.loads(r.stdout)
    assert r.returncode == 1 and report["engines"] == [], r.stdout + r.stderr
    assert any("quantdeck engines add" in p["fix"] for p in report["problems"])


def test_bundle_runs_a_core_worker_in_its_engine(
    bundle: Path, tmp_path: Path, demo_model: Path
) -> None:
    app = str(bundle / "quantdeck" / "quantdeck")
    env = user_env(tmp_path)
    r = run([app, "engines", "add", sys.executable, "--name", "dev"], env)
    assert r.returncode == 0, r.stderr
    # the quality check imports Quantdeck's core: the engine runs it from the bundle's sources
    r = run(
        [app, "compare", str(demo_model), str(demo_model), "--max-tokens", "128", "--json"], env
    )
    assert r.returncode == 0, r.stderr[-2000:]
    result = json.loads(r.stdout)
    assert result["top1_agreement"] == 1.0 and result["kl_mean"] < 1e-6, result
    (link,) = (tmp_path / "cache" / "core-path").glob("*/quantdeck/core")
    assert link.resolve() == (bundle / "quantdeck" / "_internal" / "quantdeck" / "core").resolve()


def test_install_script_installs_and_uninstalls_only_its_own(bundle: Path, tmp_path: Path) -> None:
    unpacked = tmp_path / "unpacked"
    unpacked.mkdir()
    (tarball,) = bundle.glob("quantdeck-*.tar.gz")
    with tarfile.open(tarball) as t:
        t.extractall(unpacked, filter="tar")
    env = user_env(tmp_path)
    prefix = tmp_path / "home" / ".local"
    env["PREFIX"] = str(prefix)
    install = str(unpacked / "quantdeck" / "install.sh")
    link = prefix / "bin" / "quantdeck"
    # another program's command of that name: refused, left as it was
    link.parent.mkdir(parents=True)
    link.write_text("#!/bin/sh\necho other\n")
    r = run(["bash", install], env)
    assert r.returncode == 2 and "is not a Quantdeck bundle's link" in r.stderr, r.stderr
    assert link.read_text() == "#!/bin/sh\necho other\n" and not (prefix / "opt").exists()
    link.unlink()
    r = run(["bash", install], env)
    assert r.returncode == 0, r.stdout + r.stderr
    r = run([str(link), "--version"], env)
    assert r.stdout.strip() == "quantdeck 0.1.0", r.stderr
    entry = tmp_path / "home" / "share" / "applications" / "quantdeck.desktop"
    installed_app = prefix / "opt" / "quantdeck" / "quantdeck"
    assert f"Exec={installed_app}" in entry.read_text()
    r = run(["bash", install, "--uninstall"], env)
    assert r.returncode == 0, r.stderr
    assert (
        not link.exists() and not link.is_symlink() and not (prefix / "opt" / "quantdeck").exists()
    )
    assert not entry.exists()
