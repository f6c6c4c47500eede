"""Every subcommand's options, fuzzed in process (``main(argv)``): exit 0 or 2, argparse's
included, never a traceback, and quickly. Entry points that would start a server, a job, a
window or a network call raise ``Reached`` instead (see ``cli_sandbox``): what is checked is
parsing and validation, with every path inside the test's folder."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from cli_sandbox import VALUES, make_sandbox, run_cli
from fuzz import fuzz_settings
from hypothesis import given
from hypothesis import strategies as st

from quantdeck.cli.main import build_parser


def _leaves(
    parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()
) -> list[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every runnable command: (its words, its parser); nested actions (profile save) too, and
    a command whose actions are optional (``engines``, ``engines add``) with and without."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return [(prefix, parser)]
    own = [] if subs[0].required or not prefix else [(prefix, parser)]
    return own + [
        leaf for name, p in subs[0].choices.items() for leaf in _leaves(p, (*prefix, name))
    ]


COMMANDS = dict(_leaves(build_parser()))
# Text a user could type: no path separators or home (paths stay in the sandbox), no NUL.
TEXT = st.text(
    st.characters(blacklist_categories=("Cs", "Cc"), blacklist_characters="/\\~"), max_size=12
).filter(lambda s: s not in (".", ".."))


# Valid values by destination or type, drawn half the time, so that examples get past
# parsing into the commands' own checks (the other half is anything).
HINTS = {
    "path": ["model"],
    "src": ["model"],
    "orig": ["model"],
    "quant": ["model"],
    "file": ["rec.jsonl"],
    "folders": ["lib"],
    "runs": ["run.json"],
    "a": ["run.json"],
    "b": ["run.json"],
    "profile": ["profile.yaml"],
    "arm": ["eager=--enforce-eager", "b=model --max-num-seqs 4"],
    "url": ["http://127.0.0.1:9"],
    "name": ["saved-profile"],
    "device": ["cpu"],
}
TYPED = {int: ["1", "4", "64"], float: ["0.5", "1", "100"]}


def _values(action: argparse.Action) -> st.SearchStrategy[str]:
    anything = st.sampled_from(VALUES) | TEXT
    if action.choices:
        return st.sampled_from([str(c) for c in action.choices]) | anything
    valid = HINTS.get(action.dest) or TYPED.get(action.type)  # type: ignore[call-overload]
    return st.sampled_from(valid) | anything if valid else anything


def _count(nargs: object, draw: st.DrawFn) -> int:
    if nargs is None:
        return 1
    if isinstance(nargs, int):
        return nargs
    lo, hi = {"?": (0, 1), "*": (0, 2), "+": (1, 2)}.get(str(nargs), (1, 1))
    return draw(st.integers(lo, hi))


@st.composite
def argvs(draw: st.DrawFn, words: tuple[str, ...]) -> list[str]:
    """The command's words, its positionals, its required options and a few others."""
    parser = COMMANDS[words]
    argv = list(words)
    optionals = [
        a for a in parser._actions if a.option_strings and not isinstance(a, argparse._HelpAction)
    ]
    for a in parser._actions:
        if not a.option_strings and not isinstance(a, argparse._SubParsersAction):
            argv += [draw(_values(a)) for _ in range(_count(a.nargs, draw))]
    chosen = [a for a in optionals if a.required]
    if optionals:
        chosen += draw(st.lists(st.sampled_from(optionals), max_size=3, unique_by=id))
    for a in chosen:
        argv.append(draw(st.sampled_from(a.option_strings)))
        argv += [draw(_values(a)) for _ in range(_count(a.nargs, draw))]
    return argv


@pytest.mark.parametrize("words", sorted(COMMANDS), ids=" ".join)
@fuzz_settings(20)
@given(data=st.data())
def test_fuzz_subcommand_options(
    words: tuple[str, ...],
    data: st.DataObject,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    if not (tmp_path / "model").exists():
        make_sandbox(tmp_path, monkeypatch)
    run_cli(data.draw(argvs(words), label="argv"), capsys)


def test_every_command_is_fuzzed() -> None:
    """The enumeration reaches nested actions and the commands that take no options."""
    assert {("plan",), ("profile", "save"), ("replay",), ("gui",), ("runs",)} <= set(COMMANDS)
    assert {("engines",), ("engines", "add"), ("engines", "remove")} <= set(COMMANDS)
