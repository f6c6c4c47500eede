"""The extra engines of the cross-version tests (``pytest -m engines``): vllm-cpu 0.29.0, 0.30.0
and 0.31.0 in venvs of their own, made once by ``packaging/make-engines.sh`` in a cache folder
outside the repository (0.32.0 is the main venv's vLLM). Also the recorder of the parsers'
differences, ``tests/fixtures/engine-options-diff.json``, which the fast tests of
``core/launch/migrate.py`` read:

    .venv/bin/python tests/engines.py    # needs the three venvs; probes each engine (~10 s)
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "engine-options-diff.json"
EXTRA_VERSIONS = ("0.29.0", "0.30.0", "0.31.0")  # packaging/make-engines.sh's defaults
MAIN_VERSION = "0.32.0"  # pyproject's [cpu]
SETUP = "bash packaging/make-engines.sh"


def engines_root() -> Path:
    """Where make-engines.sh keeps the venvs (its ``root``)."""
    env = os.environ.get("QUANTDECK_ENGINES_DIR")
    if env:
        return Path(env)
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "quantdeck" / "engine-venvs"


def engine_python(version: str) -> Path | None:
    """The interpreter of the vllm-cpu ``version`` venv once make-engines.sh finished it
    (its marker written after ``import vllm`` worked), else None."""
    venv = engines_root() / f"vllm-cpu-{version}"
    if not (venv / ".quantdeck-engine").is_file():
        return None
    python = venv / "bin" / "python"
    return python if python.exists() else None


def engine_name(version: str) -> str:
    """The name the tests register an engine under: ``vllm-cpu-0.29``."""
    return "vllm-cpu-" + ".".join(version.split(".")[:2])


# -- the recorded differences ------------------------------------------------------------------

_FIELDS = ("dest", "default", "choices", "nargs")
_MAX_DEFAULT = 160  # characters of a default's text kept (config objects print long)


def _trim(value: Any) -> Any:
    if isinstance(value, str) and len(value) > _MAX_DEFAULT:
        return value[: _MAX_DEFAULT - 1] + "…"
    return value


def kept_flags() -> set[str]:
    """The options the fixture keeps of each parser: those the migration tables name and
    those Quantdeck's knobs set."""
    from quantdeck.core.launch import migrate
    from quantdeck.core.launch.knobs import COMPILATION_PREFIX, iter_knobs

    flags = {"--compilation-config", *migrate.ADDED_IN}
    flags |= {f for r in migrate.RENAMED for f in (r.old, r.new)}
    flags |= {r.flag for r in migrate.REMOVED}
    flags |= {r.flag for r in migrate.VALUE_RENAMED}
    flags |= {d.flag for d in migrate.DEFAULTS_CHANGED}
    flags.add("--collect-detailed-traces")
    for k in iter_knobs():
        if not (k.quantdeck_only or k.positional or k.flag.startswith(COMPILATION_PREFIX)):
            flags.add(k.flag)
    return flags


def record(options: dict[str, dict[str, dict[str, Any]]]) -> dict[str, Any]:
    """The fixture from every engine's options (version -> ``Capabilities.options``): the
    differences of each version from the one before, and the options :func:`kept_flags`
    names, as each version has them."""
    from quantdeck.core.launch.migrate import diff_options

    versions = sorted(options, key=lambda v: tuple(int(x) for x in v.split(".")))
    slim = {v: {s: {f: o.get(f) for f in _FIELDS} for s, o in options[v].items()} for v in versions}
    diffs = {}
    for a, b in zip(versions, versions[1:], strict=False):
        d = diff_options(slim[a], slim[b])
        shown, deep = {}, []
        for s, x in d["defaults"].items():
            old, new = _trim(x["old"]), _trim(x["new"])
            if old == new:  # a config object's text, changed past what is kept
                deep.append(s)
            else:
                shown[s] = {"old": old, "new": new}
        d["defaults"], d["defaults_changed_deep"] = shown, deep
        diffs[f"{a}..{b}"] = d
    for v in versions:
        for o in slim[v].values():
            o["default"] = _trim(o["default"])
    keep = kept_flags()
    return {
        "about": "vllm serve's options of vllm-cpu, recorded by tests/engines.py from each "
        "engine's own parser: the differences between versions, and the options the "
        "migration tables (core/launch/migrate.py) and Quantdeck's knobs name",
        "versions": versions,
        "counts": {v: len(slim[v]) for v in versions},
        "diffs": diffs,
        "options": {v: {s: o for s, o in sorted(slim[v].items()) if s in keep} for v in versions},
    }


def main() -> int:
    from quantdeck.core.runtime.engine import EngineEnv

    pythons = {v: engine_python(v) for v in EXTRA_VERSIONS}
    missing = [v for v, p in pythons.items() if p is None]
    if missing:
        print(f"no venv for vllm-cpu {', '.join(missing)}: run {SETUP}", file=sys.stderr)
        return 1
    options = {v: EngineEnv(str(p)).capabilities().options for v, p in pythons.items()}
    options[MAIN_VERSION] = EngineEnv(sys.executable).capabilities().options
    FIXTURE.write_text(json.dumps(record(options), indent=1, sort_keys=False) + "\n")
    print(f"wrote {FIXTURE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
