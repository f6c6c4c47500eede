"""Flag smuggling: hostile values from a profile YAML, the CLI and the Launch form either are
refused with one line or reach vLLM whole, in the option they were meant for.

The fast tests check the argv we build; ``test_vllm_parser_reads_each_value_whole`` hands the
same argv lists to vLLM's own ``vllm serve`` parser (one subprocess, one vLLM import) and
compares its namespace with that of a harmless value."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from quantdeck.cli.main import main as cli_main
from quantdeck.core.errors import ConfigError
from quantdeck.core.launch import LaunchConfig, cpu_device, knobs, serve_command, validate

HOSTILE = [
    "--tool-parser-plugin=/tmp/evil.py",
    "x --middleware y",
    "--served-model-name=--x",
    "a=b --api-key k",
    "--middleware",
    "-O3",
    "--config=/tmp/evil.yaml",
    "--omni",
    "line\nbreak --middleware y",
    "cr\rreturn",
    "nul\x00byte",
    "tab\there",
    "\u2014tool-parser-plugin=/tmp/evil.py",  # em dash
    "\u2212\u2212middleware=evil",  # minus signs
    "\u2028--middleware=evil",  # line separator
    "=--middleware=evil",
    "a.b=--middleware",
    "--compilation-config.backend=evil",
    "@/tmp/args.txt",
    '{"name": "a", "path": "/tmp"}',
]

# knob -> (vLLM's dest, what that dest holds when the value lands whole)
TARGETS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "served_model_name": ("served_model_name", lambda v: [v]),
    "host": ("host", lambda v: v),
    "model": ("model_tag", lambda v: v),
    "lora_modules": ("lora_modules", lambda v: [("a", v)]),
}
SAFE = {"served_model_name": "safe", "host": "127.0.0.2", "model": "/m"}


def _base() -> LaunchConfig:
    cfg = LaunchConfig()
    cfg.model.model = "/m"
    return cfg


def _put(cfg: LaunchConfig, knob: str, value: str) -> None:
    """Set ``value`` where ``knob`` takes it (a LoRA adapter's path for lora_modules)."""
    if knob == "lora_modules":
        cfg.lora.enable_lora = True
        cfg.lora.lora_modules = [f"a={value}"]
    else:
        knobs.knob_by_name(knob).set(cfg, value)


def via_yaml(knob: str, value: str) -> list[str]:
    data: dict[str, Any] = {"model": "/m"}
    if knob == "lora_modules":
        data.update({"enable-lora": True, "lora-modules": [f"a={value}"]})
    else:
        data[knobs.knob_by_name(knob).yaml_key] = value
    return serve_command(validate(knobs.from_yaml(yaml.safe_dump(data))))


def via_cli(knob: str, value: str, capsys: Any) -> list[str]:
    args = ["command"]
    if knob == "model":
        args += ["--", value]
    elif knob == "lora_modules":
        args += ["/m", "--enable-lora", f"--lora-modules=a={value}"]
    else:
        args += ["/m", f"{knobs.knob_by_name(knob).flag}={value}"]
    code = cli_main(args)
    out, err = capsys.readouterr()
    if code == 2:
        assert err.count("\n") == 1 and err.startswith("quantdeck: error: "), err
        raise ConfigError(err)
    assert code == 0, err
    return shlex.split(out)


def via_form(knob: str, value: str, tab: Any) -> list[str]:
    tab.set_config(LaunchConfig())
    tab.set_model("/m", None)
    if knob == "model":
        tab.set_model(value, None)
    elif knob == "lora_modules":
        tab.form.editors["enable_lora"].set_value(True)
        tab.form.editors["lora_modules"].widget.setText(f"a={value}")
    else:
        tab.form.editors[knob].widget.setText(value)
    return serve_command(validate(tab.config()))


def _outcome(build: Callable[[], list[str]]) -> list[str] | None:
    """The argv, or None when refused (with one line)."""
    try:
        return build()
    except ConfigError as e:
        assert "\n" not in str(e).rstrip("\n") and str(e).strip(), repr(str(e))
        return None


def _check_shape(argv: list[str], knob: str, value: str) -> None:
    """``vllm serve MODEL`` then options, each one ``--flag[=value]`` word or a list item that
    cannot read as an option; ``value`` sits in exactly one word, in its own flag's place."""
    assert argv[:2] == ["vllm", "serve"]
    assert not argv[2].startswith("-")
    for w in argv[3:]:
        assert w.startswith("--") or not w.startswith("-"), argv
    holding = [w for w in argv if value in w]
    k = knobs.knob_by_name(knob)
    if knob == "model":
        assert argv[2] == value
    elif knob == "lora_modules":
        assert argv[argv.index("--lora-modules") + 1] == f"a={value}"
    else:
        assert f"{k.flag}={value}" in holding, argv


def _lora_folders(tmp_path: Path) -> list[str]:
    """Adapter folders that exist and whose names are hostile (no '/', NUL or ',' possible)."""
    out = []
    for i, v in enumerate(HOSTILE):
        name = v.replace("/", "_")
        if "\x00" in name or "," in name:
            continue
        d = tmp_path / f"lora{i}" / name
        d.mkdir(parents=True)
        out.append(str(d))
    return out


def _cases(tmp_path: Path) -> list[tuple[str, str]]:
    """(knob, value) pairs: the hostile library, plus hostile adapter folders that exist."""
    cases = [(k, v) for k in ("served_model_name", "host", "model") for v in HOSTILE]
    cases += [("lora_modules", v) for v in HOSTILE + _lora_folders(tmp_path)]
    return cases


@pytest.fixture
def launch_tab(qtbot: Any) -> Any:
    from quantdeck.gui.launch import LaunchTab

    tab = LaunchTab(cpu_device())
    qtbot.addWidget(tab)
    return tab


def _all_argv(tmp_path: Path, capsys: Any, tab: Any) -> list[tuple[str, str, str, list[str]]]:
    """(source, knob, value, argv) for each value a source let through; refusals are checked
    to be one line, and each argv's shape is checked here."""
    out = []
    for knob, value in _cases(tmp_path):
        for source, build in (
            ("yaml", partial(via_yaml, knob, value)),
            ("cli", partial(via_cli, knob, value, capsys)),
            ("form", partial(via_form, knob, value, tab)),
        ):
            argv = _outcome(build)
            if argv is None:
                continue
            # the CLI trims surrounding blanks as any option; the form is read back
            landed = {"yaml": value, "cli": value.strip()}.get(source) or _form_value(tab, knob)
            _check_shape(argv, knob, landed)
            out.append((source, knob, landed, argv))
    return out


def _form_value(tab: Any, knob: str) -> str:
    cfg = tab.config()
    if knob == "lora_modules":
        return cfg.lora.lora_modules[0].partition("=")[2]
    return str(knobs.knob_by_name(knob).get(cfg))


def test_hostile_values_are_refused_or_one_word(tmp_path: Path, capsys: Any, launch_tab) -> None:
    passed = _all_argv(tmp_path, capsys, launch_tab)
    # refused: anything that would read as an option, and any control character
    for _source, knob, value, _argv in passed:
        assert not any(c in value for c in "\n\r\x00\t\u2028"), (knob, value)
        if knob in ("model", "lora_modules"):
            assert not value.startswith("-")
    # and what is harmless as one word got through, from every source
    through = {(s, k, v) for s, k, v, _ in passed}
    for source in ("yaml", "cli", "form"):
        assert (source, "served_model_name", "--tool-parser-plugin=/tmp/evil.py") in through
        assert (source, "host", "x --middleware y") in through


@pytest.mark.parametrize(
    "spec, message",
    [
        ("x --middleware y", "is not NAME=PATH"),
        ("--tool-parser-plugin=/tmp/evil.py", "would read as an option"),
        ("-a=/tmp", "would read as an option"),
        ("a!=/tmp", "adapter name"),
        ("a b=/tmp", "adapter name"),
        ("a=/no/such/folder", "not an existing absolute folder"),
        ("a=relative", "not an existing absolute folder"),
        ("a=/tmp,b", "holds ','"),
        ('{"name": "a", "path": "/tmp"}', "is not NAME=PATH"),
        ('{"name": "a=1", "path": "/tmp"}', "adapter name"),
    ],
)
def test_lora_entries_are_checked(spec: str, message: str) -> None:
    cfg = _base()
    cfg.lora.enable_lora = True
    cfg.lora.lora_modules = [spec]
    with pytest.raises(ConfigError, match=message):
        validate(cfg)
    cfg.lora.lora_modules = ["good.name_1-x=/tmp"]
    assert validate(cfg).lora.lora_modules == ["good.name_1-x=/tmp"]


def test_vllm_args_refuses_what_validate_would(tmp_path: Path) -> None:
    """vllm_args checks the words itself: a config built past validate cannot smuggle."""
    cfg = _base()
    cfg.model.served_model_name = "a\nb"
    with pytest.raises(ConfigError, match="control character"):
        knobs.vllm_args(cfg)
    cfg = _base()
    cfg.model.model = "--vllm"
    with pytest.raises(ConfigError, match="would read as an option"):
        serve_command(cfg)


@settings(max_examples=80, deadline=None)
@given(st.text(max_size=40))
def test_any_text_is_one_word_or_refused(text: str) -> None:
    cfg = _base()
    cfg.model.served_model_name = text
    try:
        args = knobs.vllm_args(cfg)
    except ConfigError as e:
        assert "\n" not in str(e)
        return
    assert args == ["--host=127.0.0.1"] or args == [
        f"--served-model-name={text}",
        "--host=127.0.0.1",
    ]


# -- vLLM's own parser ----------------------------------------------------------------------

_PARSE = r"""
import dataclasses, json, sys
from vllm.utils.argparse_utils import FlexibleArgumentParser
try:
    from vllm.entrypoints.cli.serve import ServeSubcommand
    top = FlexibleArgumentParser()
    ServeSubcommand().subparser_init(top.add_subparsers(dest="subparser"))
    parse = lambda argv: top.parse_args(argv)
except ImportError:  # an older vLLM: the api_server parser (no "serve" word)
    from vllm.entrypoints.openai.cli_args import make_arg_parser
    p = make_arg_parser(FlexibleArgumentParser())
    parse = lambda argv: p.parse_args(argv[1:])

def plain(v):
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return plain(dataclasses.asdict(v))
    if isinstance(v, dict):
        return {str(k): plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [plain(x) for x in v]
    if isinstance(v, (set, frozenset)):
        return sorted(repr(x) for x in v)
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    return repr(v)

out = []
for argv in json.load(sys.stdin):
    try:
        out.append({k: plain(v) for k, v in vars(parse(argv)).items()})
    except SystemExit:
        out.append(None)
print(json.dumps(out))
"""


def _vllm_parse(argvs: list[list[str]]) -> list[dict[str, Any] | None]:
    r = subprocess.run(
        [sys.executable, "-c", _PARSE],
        input=json.dumps(argvs),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_vllm_parser_reads_each_value_whole(tmp_path: Path, capsys: Any, launch_tab) -> None:
    pytest.importorskip("vllm")
    passed = _all_argv(tmp_path, capsys, launch_tab)
    safe_lora = tmp_path / "safe-adapter"
    safe_lora.mkdir()
    baselines = {}
    for knob in TARGETS:
        cfg = _base()
        _put(cfg, knob, SAFE.get(knob, str(safe_lora)))
        baselines[knob] = serve_command(validate(cfg))
    argvs = [argv[1:] for *_, argv in passed] + [b[1:] for b in baselines.values()]
    parsed = _vllm_parse(argvs)
    base_ns = dict(zip(baselines, parsed[len(passed) :], strict=True))
    for (source, knob, value, argv), ns in zip(passed, parsed[: len(passed)], strict=True):
        where = f"{source} {knob}={value!r}: {argv}"
        assert ns is not None, f"vLLM refused {where}"
        dest, expected = TARGETS[knob]
        got = ns[dest]
        if knob == "lora_modules":  # LoRAModulePath: its name and path
            got = [(m["name"], m["path"]) for m in got]
        assert got == expected(value), where
        base = base_ns[knob]
        assert base is not None
        differ = {k for k in ns if ns[k] != base.get(k)}
        assert differ <= {dest}, f"{where} also changed {differ - {dest}}"
        for untouched in ("tool_parser_plugin", "middleware", "api_key", "config"):
            assert ns.get(untouched) == base.get(untouched), where
