"""The crafted inputs the round-4 audit found unhandled (issue 43), each through the real CLI in
a subprocess under the audit's ``ulimit -v 3000000``: one ``quantdeck: error:`` line naming
what is wrong, exit code 2, no traceback, refused before any server starts.

- 5,000-deep JSON in ``--speculative-config``, ``--vllm-arg`` and a profile's ``vllm-args``
  (a RecursionError), and NaN / Infinity handed to vLLM inside them: every JSON text an option
  carries is read by the schema's bounded loader (quantdeck.core.schema.load_json);
- a recording's ``t`` of 1e300 or of 4,000 digits (an OverflowError in ``timeline``, ``replay
  --png``, ``fleet replay``), a trial's or a marker's change that is no pair (a ValueError):
  every event read is held to its class's declared types (check_event);
- a key given twice in a profile, an ``api-key:`` written in a fleet file's inline profile:
  refused as a fleet file's own are;
- ``--vllm-arg root-path=/v1``: the server was never seen ready (30 minutes);
- a 0.29 profile with a flag the engine lacks, printed by ``command`` as if it would serve.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from bounded_cli import ULIMIT_V, run_bounded
from ckpt import TINY_LLAMA, write_checkpoint
from engines import FIXTURE

from quantdeck.core.runtime.engine import Capabilities, EngineEnv
from quantdeck.core.schema import MAX_DEPTH, MAX_TIME

DEEP = 5000
DEEP_OBJECT = '{"method": ' + "[" * DEEP + "]" * DEEP + "}"  # the audit's 5,000 levels
DEEP_TEXT = '{"a": ' * DEEP + "1" + "}" * DEEP
TOO_DEEP = f"corrupt JSON (nested too deeply: over {MAX_DEPTH} levels)"
SPECULATIVE = "--speculative-config"
ROUTES = "--root-path is refused: it moves the routes Quantdeck's readiness probe"
KEY_IN_FILE = "'api-key': a key written in the file is refused"
T0 = 1_800_000_000.0


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The test's folder as the CLI's working folder, home and cache (the config and data
    folders are the test's own already: conftest), with a tiny model in ``model``."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("QUANTDECK_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("QUANTDECK_PROBE_DIR", raising=False)
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    write_checkpoint(tmp_path / "model", TINY_LLAMA)
    return tmp_path


def refused(home: Path, argv: list[str], words: str) -> None:
    """``quantdeck ARGV`` under ``ulimit -v 3000000``: one error line holding ``words``, exit
    2, no traceback, within 60 s (a hang fails), in bounded memory."""
    r = run_bounded(argv, home, timeout=60.0, as_limit=ULIMIT_V)
    lines = [line for line in r.err.splitlines() if line.strip()]
    assert r.code == 2 and "Traceback" not in r.err, (r.code, r.err[-2000:])
    # "quantdeck: error: ...", or argparse's "quantdeck COMMAND: error: argument ...: ..."
    assert len(lines) == 1 and lines[0].startswith("quantdeck"), r.err
    assert ": error: " in lines[0] and words in lines[0], lines[0]
    assert r.peak_mib < 1000, r.peak_mib


def write(home: Path, name: str, text: str) -> str:
    (home / name).write_text(text)
    return name


# -- JSON options: nesting and NaN ------------------------------------------------------------


def _profile(home: Path, **vllm_args: Any) -> str:
    lines = [f"model: {home / 'model'}", "vllm-args:"]
    lines += [f"  {k}: {v}" for k, v in vllm_args.items()]
    return write(home, "p.yaml", "\n".join(lines) + "\n")


JSON_OPTIONS: dict[str, tuple[Any, str]] = {
    # 1: a RecursionError before
    "speculative 5000-deep (command)": (
        lambda h: ["command", "model", SPECULATIVE, DEEP_OBJECT],
        f"performance.speculative: {TOO_DEEP}",
    ),
    "speculative 5000-deep (serve)": (
        lambda h: ["serve", "model", SPECULATIVE, DEEP_OBJECT],
        f"performance.speculative: {TOO_DEEP}",
    ),
    "--vllm-arg 5000-deep": (
        lambda h: ["command", "model", "--vllm-arg", f"kv-transfer-config={DEEP_TEXT}"],
        f"--vllm-arg kv-transfer-config: {TOO_DEEP}",
    ),
    "profile vllm-args 5000-deep (command)": (
        lambda h: ["command", "--profile", _profile(h, **{"kv-transfer-config": f"'{DEEP_TEXT}'"})],
        f"vllm-args.kv-transfer-config: {TOO_DEEP}",
    ),
    "profile vllm-args 5000-deep compilation-config (serve)": (
        lambda h: ["serve", "--profile", _profile(h, **{"compilation-config": f"'{DEEP_TEXT}'"})],
        f"vllm-args.compilation-config: {TOO_DEEP}",
    ),
    "profile vllm-args 100-deep YAML mapping": (
        lambda h: [
            "command",
            "--profile",
            _profile(h, **{"kv-transfer-config": "{a: " * 100 + "1" + "}" * 100}),
        ],
        f"vllm-args.kv-transfer-config: nested more than {MAX_DEPTH} levels deep",
    ),
    # 2: handed to vLLM before
    "speculative NaN": (
        lambda h: [
            "command",
            "model",
            SPECULATIVE,
            '{"method": "ngram", "prompt_lookup_max": NaN}',
        ],
        "performance.speculative: NaN is not a finite number",
    ),
    "speculative Infinity (serve)": (
        lambda h: ["serve", "model", SPECULATIVE, '{"method": "ngram", "x": Infinity}'],
        "performance.speculative: Infinity is not a finite number",
    ),
    "speculative -Infinity": (
        lambda h: ["command", "model", SPECULATIVE, '{"model": "d", "x": [-Infinity]}'],
        "performance.speculative: -Infinity is not a finite number",
    ),
    "speculative 1e999": (
        lambda h: ["command", "model", SPECULATIVE, '{"method": "ngram", "x": 1e999}'],
        "performance.speculative: 1e999 is not a finite number",
    ),
    "--vllm-arg NaN": (
        lambda h: ["command", "model", "--vllm-arg", 'kv-transfer-config={"a": NaN}'],
        "--vllm-arg kv-transfer-config: NaN is not a finite number",
    ),
    "profile vllm-args JSON text with Infinity": (
        lambda h: ["command", "--profile", _profile(h, **{"kv-transfer-config": "'[Infinity]'"})],
        "vllm-args.kv-transfer-config: Infinity is not a finite number",
    ),
    "profile vllm-args YAML .nan": (
        lambda h: ["command", "--profile", _profile(h, **{"kv-transfer-config": "{a: .nan}"})],
        "vllm-args.kv-transfer-config: nan is not a finite number",
    ),
    "profile speculative-config YAML .inf": (
        lambda h: [
            "command",
            "--profile",
            write(
                h, "s.yaml", f"model: {h / 'model'}\nspeculative-config: {{method: x, y: .inf}}\n"
            ),
        ],
        "performance.speculative: Infinity is not a finite number",
    ),
}


@pytest.mark.parametrize("case", sorted(JSON_OPTIONS))
def test_json_options_are_bounded_and_finite(home: Path, case: str) -> None:
    """Before: the 5,000-deep ones ended in a RecursionError traceback; NaN and Infinity
    reached vLLM's command line."""
    argv, words = JSON_OPTIONS[case]
    refused(home, argv(home), words)


# -- recordings: times and changes ------------------------------------------------------------

HEADER = {"event": "recording", "version": 1, "t": T0, "source": "serve"}
FLEET_HEADER = {**HEADER, "source": "fleet"}
ROWS = [
    {"name": n, "role": r, "url": u, "local": True, "model": "m", "format": "BF16"}
    for n, r, u in (
        ("router", "router", "http://127.0.0.1:18080"),
        ("a", "primary", "http://127.0.0.1:18001"),
    )
]
FLEET_FACT = {"event": "fact", "name": "fleet", "value": ROWS, "t": T0, "instance": "router"}


def _metrics(t: Any, **more: Any) -> dict[str, Any]:
    return {"event": "metrics", "t": t, "kv_usage_pct": 5.0, "running": 1, "gpus": [], **more}


def _recording(home: Path, name: str, *lines: dict[str, Any] | str) -> str:
    """A serve recording (a fleet's when its first line is the fleet fact): header, lines."""
    fleet = bool(lines) and lines[0] == FLEET_FACT
    head = json.dumps(FLEET_HEADER if fleet else HEADER)
    body = [line if isinstance(line, str) else json.dumps(line) for line in lines]
    return write(home, name, "\n".join([head, *body]) + "\n")


def _samples(instance: str | None = None) -> list[dict[str, Any]]:
    where = {"instance": instance} if instance else {}
    return [_metrics(T0 + i, **where) for i in range(1, 5)]


HUGE = "9" * 4000  # under Python's 4,300-digit limit: it parses, then overflowed a float
# a time no clock shows; a number no float holds
BAD_TIMES = {
    "1e300": ("1e300", f"line 4: 't' must be a time in seconds since 1970 (0 to {MAX_TIME})"),
    "4000 digits": (HUGE, "line 4: 't' must be a finite number, got 99999"),
}


def _timed(t: str, instance: str | None = None) -> str:
    line = _metrics(12345, **({"instance": instance} if instance else {}))
    return json.dumps(line).replace("12345", t)


def _trial(knobs: dict[str, list[Any]]) -> dict[str, Any]:
    return {
        "event": "trial",
        "phase": "admitted",
        "candidate": "http://127.0.0.1:18009",
        "knobs": knobs,
        "goal": "ttft_p99_ms",
        "reason": "r",
        "t": T0 + 6,
        "instance": "a",
    }


def _marker(diff: dict[str, list[Any]]) -> dict[str, Any]:
    return {"event": "marker", "what": "knobs", "label": "knobs", "diff": diff, "t": T0 + 2.5}


RECORDINGS: dict[str, tuple[Any, list[str], str]] = {}
for _label, (_t, _words) in BAD_TIMES.items():
    for _cmd in (["timeline"], ["replay", "--png", "out.png"]):
        RECORDINGS[f"t {_label}: {_cmd[0]}"] = (
            lambda h, t=_t: _recording(h, "r.jsonl", *_samples()[:2], _timed(t)),
            _cmd,
            _words,
        )
    for _cmd in (["fleet", "replay"], ["timeline"]):
        RECORDINGS[f"t {_label}: fleet recording, {' '.join(_cmd)}"] = (
            lambda h, t=_t: _recording(
                h, "f.jsonl", FLEET_FACT, *_samples("a")[:1], _timed(t, "a")
            ),
            _cmd,
            _words,
        )
for _items in ([1], [1, 2, 3]):
    for _cmd in (["fleet", "replay"], ["timeline"]):
        RECORDINGS[f"trial knob of {len(_items)}: {' '.join(_cmd)}"] = (
            lambda h, i=_items: _recording(
                h, "f.jsonl", FLEET_FACT, *_samples("a")[:2], _trial({"max-num-seqs": i})
            ),
            _cmd,
            f"line 5: 'knobs.max-num-seqs' must be a pair [before, after], got {_items}",
        )
    for _cmd in (["timeline"], ["replay", "--png", "out.png"]):
        RECORDINGS[f"marker change of {len(_items)}: {_cmd[0]}"] = (
            lambda h, i=_items: _recording(
                h, "r.jsonl", *_samples()[:2], _marker({"max-num-seqs": i}), *_samples()[2:]
            ),
            _cmd,
            f"line 4: 'diff.max-num-seqs' must be a pair [before, after], got {_items}",
        )
RECORDINGS["a count of 4000 digits"] = (
    lambda h: _recording(
        h, "r.jsonl", *_samples()[:2], _timed("5").replace('"running": 1', f'"running": {HUGE}')
    ),
    ["timeline"],
    "line 4: 'running' must be an integer or null, got 99999",
)


@pytest.mark.parametrize("case", sorted(RECORDINGS))
def test_crafted_recordings_are_one_line_naming_the_file_and_line(home: Path, case: str) -> None:
    """Before: an OverflowError (``t`` of 1e300 or 4,000 digits) or a ValueError (a change
    of 1 or 3 items) traceback in ``timeline``, ``replay --png`` and ``fleet replay``."""
    make, argv, words = RECORDINGS[case]
    name = make(home)
    refused(home, [*argv, name] if argv[0] != "replay" else ["replay", name, *argv[1:]], words)
    assert f"{name}: {words}" in (home / "stderr.txt").read_text()
    assert not (home / "out.png").exists()


# -- profiles and fleet files: duplicate keys, a key written in the file ------------------------

FLEET = (
    "router: {{port: 18080}}\ninstances:\n  - name: a\n    port: 18001\n    profile: {profile}\n"
)


def _fleet(home: Path, profile: str) -> str:
    return write(home, "fleet.yaml", FLEET.format(profile=profile))


FILES: dict[str, tuple[Any, str]] = {
    # 5: YAML kept the last of two keys silently
    "profile key twice (command)": (
        lambda h: ["command", "--profile", write(h, "p.yaml", "model: model\nmodel: /x\n")],
        "p.yaml: line 2: key 'model' given twice",
    ),
    "profile key twice (serve)": (
        lambda h: [
            "serve",
            "--profile",
            write(h, "p.yaml", "model: model\nvllm-args:\n  max-logprobs: 3\n  max-logprobs: 4\n"),
        ],
        "p.yaml: line 4: key 'max-logprobs' given twice",
    ),
    "JSON profile key twice": (
        lambda h: [
            "command",
            "--profile",
            write(h, "p.json", '{"model": "model", "max-num-seqs": 2, "max-num-seqs": 4}'),
        ],
        "p.json: line 1: key 'max-num-seqs' given twice",
    ),
    "profile file of a fleet, key twice": (
        lambda h: [
            "fleet",
            "check",
            (
                write(h, "p.yaml", "model: model\nmax-num-seqs: 2\nmax-num-seqs: 4\n"),
                _fleet(h, "p.yaml"),
            )[1],
        ],
        "p.yaml: line 3: key 'max-num-seqs' given twice",
    ),
    "profile alias bomb": (
        lambda h: ["command", "--profile", write(h, "p.yaml", _alias_bomb())],
        "its YAML aliases expand to over 100,000 values (not a profile)",
    ),
    # 6: a key written in a fleet file's inline profile passed
    "api-key in an inline profile (fleet check)": (
        lambda h: [
            "fleet",
            "check",
            _fleet(h, "{model: model, api-key: sk-written-in-the-file-1}"),
        ],
        f"fleet.yaml: instance 'a': 'profile': {KEY_IN_FILE}",
    ),
    "api_key in an inline profile (fleet up)": (
        lambda h: ["fleet", "up", _fleet(h, "{model: model, api_key: sk-written-in-the-file-1}")],
        "fleet.yaml: instance 'a': 'profile': 'api_key': a key written in the file is refused",
    ),
    "api-key in a profile file (serve)": (
        lambda h: [
            "serve",
            "--profile",
            write(h, "p.yaml", "model: model\napi-key: sk-in-file-1\n"),
        ],
        f"p.yaml: {KEY_IN_FILE}",
    ),
    "hf-token in a profile's vllm-args": (
        lambda h: [
            "command",
            "--profile",
            write(h, "p.yaml", "model: model\nvllm-args: {hf-token: hf_abcdefghijklmnopqrstuv}\n"),
        ],
        "p.yaml: vllm-args.hf-token: a secret written in the file is refused",
    ),
    # 7: the server was never seen ready (30 minutes)
    "--vllm-arg root-path (command)": (
        lambda h: ["command", "model", "--vllm-arg", "root-path=/v1"],
        f"vllm-args.root-path: {ROUTES}",
    ),
    "--vllm-arg root_path (serve)": (
        lambda h: ["serve", "model", "--vllm-arg", "root_path=/v1"],
        f"vllm-args.root-path: {ROUTES}",
    ),
    "root-path in a fleet's inline profile": (
        lambda h: ["fleet", "up", _fleet(h, "{model: model, vllm-args: {root-path: /v1}}")],
        f"fleet.yaml: instance 'a': 'profile': vllm-args.root-path: {ROUTES}",
    ),
}


def _alias_bomb(levels: int = 9, width: int = 9) -> str:
    lists = [f"&l0 [{', '.join(['x'] * width)}]"]
    lists += [f"&l{n} [{', '.join([f'*l{n - 1}'] * width)}]" for n in range(1, levels)]
    return f"model: model\nlora-modules: [{', '.join(lists)}]\n"


@pytest.mark.parametrize("case", sorted(FILES))
def test_profiles_and_fleet_files_are_refused_as_a_fleet_files_are(home: Path, case: str) -> None:
    """Before: a key given twice in a profile kept the last one; an ``api-key:`` in a fleet
    file's inline profile (and in a profile file) was taken; ``root-path`` was passed on and
    the server never became ready."""
    argv, words = FILES[case]
    refused(home, argv(home), words)


# -- 8: `command` checks against the engine it prints for, as `serve` does --------------------

RECORDED: dict[str, Any] = json.loads(FIXTURE.read_text())


def _seed_default_engine(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """This venv's engine (the default one) as its probe records it, vLLM 0.32's options
    (tests/fixtures/engine-options-diff.json), cached where the CLI looks: no vLLM import."""
    probes = home / "probes"
    monkeypatch.setenv("QUANTDECK_PROBE_DIR", str(probes))
    env = EngineEnv(sys.executable)
    dist, version = env.version()
    caps = Capabilities(
        vllm_version=version,
        torch_version="2.13.0",
        platform="cpu",
        launcher="cli",
        options=RECORDED["options"]["0.32.0"],
        distribution=dist,
        python=sys.executable,
    )
    path = env.probe_file(dist, version)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(caps.to_json()))


def test_command_refuses_a_029_profiles_flag_the_engine_lacks(
    home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before: ``command --profile`` printed ``--calculate-kv-scales`` for an engine that has
    none (vLLM 0.32 removed it), exit 0, where ``serve`` refused it."""
    _seed_default_engine(home, monkeypatch)
    text = f"# saved with vLLM 0.29.0\nmodel: {home / 'model'}\ncalculate-kv-scales: true\n"
    p = write(home, "p029.yaml", text)
    refused(home, ["command", "--profile", p], "cache.calculate_kv_scales: engine ")
    line = (home / "stderr.txt").read_text()
    assert "has no --calculate-kv-scales" in line and "saved with vLLM 0.29.0" in line
    assert f"{EngineEnv(sys.executable).version()[0]} " in line  # the engine and its version


def test_command_prints_what_serve_would_run(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 0.29 profile is migrated as ``serve`` migrates it (a setting the engine dropped is
    left out, with a note), so ``command`` never prints a flag the engine lacks."""
    _seed_default_engine(home, monkeypatch)
    text = f"# saved with vLLM 0.29.0\nmodel: {home / 'model'}\nmax-num-partial-prefills: 2\n"
    p = write(home, "p029.yaml", text)
    r = run_bounded(["command", "--profile", p], home, timeout=60.0, as_limit=ULIMIT_V)
    assert r.code == 0 and "Traceback" not in r.err, r.err
    assert r.out.startswith("vllm serve ") and "partial-prefills" not in r.out, r.out
    notes = r.err.strip().splitlines()
    assert notes and all(n.startswith("quantdeck: note: ") for n in notes), r.err
    assert any("max_num_partial_prefills: left out" in n for n in notes), r.err
