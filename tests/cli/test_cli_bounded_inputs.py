"""Inputs that used to eat the machine or end in a traceback (issue 31): a YAML alias bomb or
duplicate keys in a fleet file, CPUs the machine lacks, a gzip bomb or crafted lines in a
recording, a crafted ``tokenizer.json``. Each is one ``quantdeck: error:`` line and exit 2.
The bombs run the real CLI in a subprocess under a 1.5 GiB address-space limit, timed and
measured (its CPU time from ``wait4``, its peak RSS from its own ``VmHWM``), by
tests/bounded_cli.py."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml
from bombs import LONG_LINE, alias_bomb, gzip_bomb
from bounded_cli import one_line_exit_2, run_bounded
from cli_sandbox import make_sandbox, run_cli
from conftest import ROOT

from quantdeck.core.bench.datasets import MAX_TOKENIZER_BYTES
from quantdeck.core.fleet.spec import MAX_VALUES, machine_cpus
from quantdeck.core.monitor.recording import MAX_BYTES


@pytest.fixture
def sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return make_sandbox(tmp_path, monkeypatch)


# -- fleet files --------------------------------------------------------------------------------


@pytest.mark.parametrize("action", ["check", "up"])
def test_an_alias_bomb_fleet_file_is_refused_in_under_a_second(tmp_path: Path, action: str) -> None:
    """Before: 638 bytes under ``cpus:`` ate memory at about 70 MB/s, without end."""
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(alias_bomb())
    assert bomb.stat().st_size < 700
    r = run_bounded(["fleet", action, str(bomb)], tmp_path)
    one_line_exit_2(r, f"aliases expand to over {MAX_VALUES:,} values")
    assert r.cpu_s < 1.0 and r.peak_mib < 300, (r.cpu_s, r.peak_mib)


def test_aliases_within_the_bound_still_read(sandbox: Path, capsys: pytest.CaptureFixture) -> None:
    """A fleet file that shares one profile by an alias (as yaml.safe_dump writes a shared
    dict) is still a fleet file."""
    profile = {"model": str(sandbox / "model"), "max-num-seqs": 2}
    doc = {
        "instances": [
            {"name": "a", "port": 18001, "profile": profile},
            {"name": "b", "port": 18002, "profile": profile},
        ]
    }
    text = yaml.safe_dump(doc)
    assert "&id001" in text and "*id001" in text
    (sandbox / "fleet.yaml").write_text(text)
    code, out, _ = run_cli(["fleet", "check", "fleet.yaml"], capsys)
    assert code == 0 and "2 instances" in out


FLEET_HEAD = "router: {port: 18080}\ninstances:\n  - name: a\n    profile: {model: model}\n"


@pytest.mark.parametrize(
    "text, words",
    [
        (
            "router: {port: 18080}\nrouter: {port: 18081}\ninstances: []\n",
            "line 2: key 'router' given twice",
        ),
        (FLEET_HEAD + "    port: 18001\n    port: 18002\n", "line 6: key 'port' given twice"),
        ("instances:\n  - {name: a, name: b, url: 'http://x'}\n", "line 2: key 'name' given twice"),
        ("a: &a [*a]\n", "line 1: a YAML anchor holds an alias to itself"),
    ],
    ids=["top", "instance", "flow", "self-alias"],
)
def test_duplicate_keys_are_refused_naming_the_key_and_line(
    sandbox: Path, capsys: pytest.CaptureFixture, text: str, words: str
) -> None:
    """Before: YAML kept the last of two keys silently."""
    (sandbox / "fleet.yaml").write_text(text)
    code, _, err = run_cli(["fleet", "check", "fleet.yaml"], capsys)
    assert code == 2 and words in err and err.count("\n") == 1, err


def _cpus_cases() -> list[tuple[str, str]]:
    lacking = max(machine_cpus()) + 1
    return [
        ('"3-1"', "'cpus' range 3-1 runs backwards (write 1-3)"),
        (f'"0,{lacking}"', f"names CPU {lacking}, which this machine lacks"),
        (f"[0, {lacking}]", f"names CPU {lacking}, which this machine lacks"),
        ('"0-999999"', "'cpus' must be CPU numbers"),
        ('"0-5000"', "CPU numbers go from 0 to 4095"),
        ('"0,0-1"', "'cpus' names CPU 0 twice"),
        ("[[0, 1]]", "'cpus' must be CPU numbers"),
        ("true", "'cpus' must be CPU numbers"),
    ]


@pytest.mark.parametrize("case", range(len(_cpus_cases())))
def test_cpus_reversed_or_not_on_this_machine_are_refused(
    sandbox: Path, capsys: pytest.CaptureFixture, case: int
) -> None:
    """Before: reversed ranges and CPUs the machine lacks passed, and vLLM ignored them."""
    cpus, words = _cpus_cases()[case]
    (sandbox / "fleet.yaml").write_text(FLEET_HEAD + f"    cpus: {cpus}\n")
    code, _, err = run_cli(["fleet", "check", "fleet.yaml"], capsys)
    assert code == 2 and words in err and err.count("\n") == 1, err


def test_cpus_this_machine_has_are_taken(sandbox: Path, capsys: pytest.CaptureFixture) -> None:
    first = min(machine_cpus())
    (sandbox / "fleet.yaml").write_text(FLEET_HEAD + f"    cpus: [{first}]\n")
    code, _, err = run_cli(["fleet", "check", "fleet.yaml"], capsys)
    assert code == 0, err


# -- recordings ---------------------------------------------------------------------------------

HEADER = {"event": "recording", "version": 1, "t": 1.0, "source": "fleet"}
FLEET_FACT = {
    "event": "fact",
    "name": "fleet",
    "value": [
        {"name": "router", "role": "router", "url": "http://127.0.0.1:18080", "local": True},
        {"name": "a", "role": "primary", "url": "http://127.0.0.1:18001", "local": True},
    ],
    "t": 2.0,
    "instance": "router",
}
for _row in FLEET_FACT["value"]:
    _row.update(model="m", format="BF16", placement="all")


@pytest.mark.parametrize("argv", [["timeline"], ["fleet", "replay"]], ids=["timeline", "fleet"])
def test_a_gzip_bomb_recording_is_refused_in_bounded_memory(
    tmp_path: Path, argv: list[str]
) -> None:
    """Before: a 7.8 MB .gz (1.46 GB inside) drove `timeline` to 5.8 GB and a MemoryError.
    Here 1 MB packs 200 MB of one ~1 KB metrics line; `replay` (the GUI's window) reads with
    the same reader, tested in core/monitor/test_recording_bounds.py."""
    bomb = gzip_bomb(tmp_path / "bomb.jsonl.gz", LONG_LINE, 200 * 10**6)
    r = run_bounded([*argv, str(bomb)], tmp_path)
    one_line_exit_2(r, f"over {MAX_BYTES // 2**20} MiB unpacked (the cap of a recording)")
    assert r.cpu_s < 5 and r.peak_mib < 300, (r.cpu_s, r.peak_mib)


def _fleet_recording(path: Path, *lines: Any) -> Path:
    events = [HEADER, FLEET_FACT, *lines]
    path.write_text("".join(json.dumps(e, allow_nan=True) + "\n" for e in events))
    return path


def _in(name: str, **event: Any) -> dict[str, Any]:
    return {**event, "t": event.get("t", 3.0), "instance": name}


# lines that crashed `fleet replay` (and the Fleet tab) or passed unchecked; the words of the
# one error line each now gives
CRAFTED_FLEET: dict[str, tuple[list[dict[str, Any]], str]] = {
    "restart delay as text": (
        [_in("a", event="restart", attempt=1, delay_s="soon")],
        "'delay_s' must be a finite number, got 'soon'",
    ),
    "restart delay NaN": (
        [_in("a", event="restart", attempt=1, delay_s=float("nan"))],
        "'delay_s' must be a finite number, got None",
    ),
    "route to a number": (
        [_in("router", event="route", action="add", worker=5, reason="fallback")],
        "'worker' must be a string, got 5",
    ),
    "route ok as text": (
        [_in("router", event="route", action="add", worker="w", reason="r", ok="yes")],
        "'ok' must be true or false, got 'yes'",
    ),
    "fallback value as text": (
        [
            _in(
                "router",
                event="fallback",
                active=True,
                metric="m",
                value_ms="x",
                above_ms=1,
                held_s=1,
            )
        ],
        "'value_ms' must be a finite number or null, got 'x'",
    ),
    "fallback backups as text": (
        [
            _in(
                "router",
                event="fallback",
                active=True,
                metric="m",
                value_ms=1.0,
                above_ms=1,
                held_s=1,
                backups="b",
            )
        ],
        "'backups' must be a list, got 'b'",
    ),
    "state as a list": ([_in("a", event="state", state=[1])], "'state' must be a string, got [1]"),
    "metrics as text": ([_in("a", event="metrics", running="many")], "'running' must be"),
    "unknown kind": ([_in("a", event="teleport")], "unknown event 'teleport'"),
    "a nested event missing": (
        [_in("a", event="arm_server", index=0)],
        "('arm_server' event: no 'server')",
    ),
    "fleet rows unreadable": ([], ""),  # the fact replaced below
}


@pytest.mark.parametrize("case", sorted(CRAFTED_FLEET))
def test_crafted_fleet_recordings_are_one_line(
    sandbox: Path, capsys: pytest.CaptureFixture, case: str
) -> None:
    """Before: 6 of 10 crafted fleet recordings ended `fleet replay` in a traceback."""
    lines, words = CRAFTED_FLEET[case]
    rec = _fleet_recording(sandbox / "f.jsonl", *lines)
    if case == "fleet rows unreadable":
        bad = {**FLEET_FACT, "value": [{"name": 5}]}
        rec.write_text(json.dumps(HEADER) + "\n" + json.dumps(bad) + "\n")
        words = "the recording's fleet is unreadable"
    for argv in (["fleet", "replay", "f.jsonl"], ["fleet", "replay", "f.jsonl", "--json"]):
        code, _, err = run_cli(argv, capsys)
        assert code == 2 and words in err and err.count("\n") == 1, (case, err)


def test_router_facts_without_a_time_replay(sandbox: Path, capsys: pytest.CaptureFixture) -> None:
    """Before: two router facts without ``t`` (an event may carry none) ended `fleet replay`
    in a TypeError; the rate wants two times, the counts need none."""
    facts = [
        {"event": "fact", "name": "router", "value": {"requests": n}, "instance": "router"}
        for n in (1, 2)
    ]
    _fleet_recording(sandbox / "f.jsonl", *facts)
    code, out, _ = run_cli(["fleet", "replay", "f.jsonl", "--json"], capsys)
    assert code == 0 and json.loads(out)["rows"][0]["router"] == "2 requests"


def test_the_recordings_in_the_repository_still_replay(
    sandbox: Path, capsys: pytest.CaptureFixture
) -> None:
    """The H200's recordings pass every check (they read back byte for byte:
    core/test_events.py)."""
    gpu = ROOT / "docs" / "gpu-validation"
    assert run_cli(["fleet", "replay", str(gpu / "fleet-1b-eager.jsonl.gz")], capsys)[0] == 0
    recs = [str(p) for p in sorted(gpu.glob("record-*.jsonl.gz"))]
    assert len(recs) == 3 and run_cli(["timeline", *recs, "--json"], capsys)[0] == 0


# -- bench --tokenizer DIR ----------------------------------------------------------------------


def _tokenizer(folder: Path, body: Any) -> None:
    folder.mkdir(exist_ok=True)
    (folder / "tokenizer.json").write_text(body if isinstance(body, str) else json.dumps(body))


def _fifo(folder: Path) -> None:
    folder.mkdir()
    os.mkfifo(folder / "tokenizer.json")


def _huge(folder: Path) -> None:
    _tokenizer(folder, {"model": {"vocab": {"a": 0}}})
    os.truncate(folder / "tokenizer.json", 8 * 2**30)  # sparse: 8 GB that take no disk


def _folder(folder: Path) -> None:
    (folder / "tokenizer.json").mkdir(parents=True)


TOKENIZERS: dict[str, tuple[Any, str]] = {
    "a FIFO": (_fifo, "tokenizer.json: not a regular file"),
    "8 GB": (_huge, f"over {MAX_TOKENIZER_BYTES // 2**20} MiB (not a tokenizer.json file)"),
    "a folder": (_folder, "tokenizer.json: not a regular file"),
    "not JSON": (lambda d: _tokenizer(d, "{'model': "), "corrupt JSON"),
    "not UTF-8": (
        lambda d: (d.mkdir(), (d / "tokenizer.json").write_bytes(b'{"model": "\xff"}')),
        "not UTF-8 text",
    ),
    "nested too deep": (lambda d: _tokenizer(d, "[" * 100_000 + "]" * 100_000), "nested too"),
    "no model": (lambda d: _tokenizer(d, {"version": "1.0"}), "'model' missing"),
    "a list": (lambda d: _tokenizer(d, [1, 2]), "expected a JSON object, got list"),
    "vocab as text": (
        lambda d: _tokenizer(d, {"model": {"vocab": "abc"}}),
        "'vocab' must be a non-empty object or list",
    ),
    "added token id as text": (
        lambda d: _tokenizer(
            d, {"model": {"vocab": {"a": 0}}, "added_tokens": [{"id": "x", "special": True}]}
        ),
        "'added_tokens' 1: 'id' must be an integer >= 0, got 'x'",
    ),
    "added tokens as an object": (
        lambda d: _tokenizer(d, {"model": {"vocab": {"a": 0}}, "added_tokens": {"id": 0}}),
        "'added_tokens' must be a list",
    ),
    "only special tokens": (
        lambda d: _tokenizer(
            d, {"model": {"vocab": {"a": 0}}, "added_tokens": [{"id": 0, "special": True}]}
        ),
        "no ordinary tokens",
    ),
}


@pytest.mark.parametrize("case", sorted(TOKENIZERS))
def test_a_crafted_tokenizer_json_is_one_line(
    tmp_path: Path, recorded_server: str, case: str
) -> None:
    """Before: 5 tracebacks, a FIFO that hung `bench` forever, an 8 GB file read whole. The
    server is a local replay of a real vLLM's /v1/models: bench reads the tokenizer once it
    has found the model served."""
    make, words = TOKENIZERS[case]
    make(tmp_path / "tok")
    argv = ["bench", recorded_server, "--model", "demo", "--dataset-name", "random"]
    r = run_bounded([*argv, "--tokenizer", str(tmp_path / "tok"), "--no-save"], tmp_path)
    one_line_exit_2(r, words)
    assert r.peak_mib < 300, r.peak_mib
