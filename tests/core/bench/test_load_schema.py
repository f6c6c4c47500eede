"""The load declared once: every field of LoadSpec (and of the SLO limits) has a default, a bound
where numeric and a help text, and the options walked from them round-trip, CLI args -> LoadSpec
-> args, through every command that sends a load (bench, ab, tune)."""

from __future__ import annotations

import argparse
import dataclasses
import math
import random

import pytest

from quantdeck.cli.main import build_parser
from quantdeck.core.bench import LoadSpec, SloLimits, load_args, load_fields
from quantdeck.core.bench.load import (
    add_load_options,
    field_problem,
    load_from_options,
    slo_from_options,
)

# argv of each command that sends a load, before its load options; whether it takes the knobs
COMMANDS = {
    "bench": (["bench", "http://127.0.0.1:9"], False),
    "ab": (["ab", "/m", "--arm", "a=--enforce-eager"], True),
    "tune": (["tune", "/m", "--ttft-ms", "100", "--tpot-ms", "10"], True),
}


@pytest.mark.parametrize("cls", [LoadSpec, SloLimits])
def test_every_load_field_is_declared_fully(cls: type) -> None:
    fields = load_fields(cls)
    assert [f.name for f in fields] == [f.name for f in dataclasses.fields(cls)]
    for f in fields:
        assert f.doc and f.doc.endswith((".", ")")), f.name
        assert f.flag.startswith("--") and f.title, f.name
        if f.numeric:
            assert f.ge is not None or f.gt is not None, f"{f.name} has no lower bound"
        assert field_problem(f, f.default) is None, f.name  # the default itself is valid
    LoadSpec().check()


def test_help_says_each_fields_doc_and_default() -> None:
    p = argparse.ArgumentParser()
    add_load_options(p)
    text = " ".join(p.format_help().split())
    for f in (*load_fields(), *load_fields(SloLimits)):
        assert f"{f.flag}" in text and " ".join(f.doc.split()) in text, f.name
    assert "--request-rate R Poisson arrivals per second. [default: all at once]" in text


def _random_load(rng: random.Random) -> LoadSpec:
    """A load with roughly half its fields off their defaults, as the CLI can ask for it."""
    values = {}
    for f in load_fields():
        if rng.random() < 0.5:
            continue
        if f.choices is not None:
            v = rng.choice(f.choices)
        elif f.base is bool:
            v = rng.choice([True, False])
        elif f.base is int:
            v = rng.randint(int(f.ge if f.ge is not None else (f.gt or 0) + 1), 5000)
        elif f.base is float:
            v = round(rng.uniform(0.01, 50.0), 2)
        else:
            v = rng.choice(["/data/p.jsonl", "a b", "--x", "ünï"])
        values[f.name] = v
    if "concurrency" in values and "request_rate" in values:  # the CLI takes one of them
        del values[rng.choice(["concurrency", "request_rate"])]
    return LoadSpec(**values)


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("command", COMMANDS)
def test_args_to_load_to_args_round_trips(command: str, seed: int) -> None:
    prefix, with_knobs = COMMANDS[command]
    spec = _random_load(random.Random(seed))
    args = load_args(spec, with_knobs=with_knobs)
    ns = build_parser().parse_args([*prefix, *args])
    back = load_from_options(ns)
    assert back == spec
    assert load_args(back, with_knobs=with_knobs) == args
    assert "knob:seed" not in vars(ns)  # the load's seed never sets the engine's (ab, tune)


@pytest.mark.parametrize("command", COMMANDS)
def test_no_load_options_is_the_default_load(command: str) -> None:
    prefix, _ = COMMANDS[command]
    ns = build_parser().parse_args(prefix)
    assert load_from_options(ns) == LoadSpec()
    assert load_args(LoadSpec()) == []


@pytest.mark.parametrize("command", ["ab", "tune"])
def test_seed_beside_the_knobs_is_load_seed(command: str) -> None:
    prefix, _ = COMMANDS[command]
    ns = build_parser().parse_args([*prefix, "--load-seed", "5", "--seed", "7"])
    assert load_from_options(ns).seed == 5 and vars(ns)["knob:seed"] == 7


def test_concurrency_and_request_rate_exclude_each_other(capsys) -> None:
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["bench", "u", "--concurrency", "2", "--request-rate", "3"])
    assert e.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


@pytest.mark.parametrize("seed", range(10))
def test_slo_options_round_trip(seed: int) -> None:
    rng = random.Random(seed)
    limits = SloLimits(
        **{
            f.name: round(rng.uniform(1, 5000), 1)
            for f in load_fields(SloLimits)
            if rng.random() < 0.6
        }
    )
    ns = build_parser().parse_args([*COMMANDS["bench"][0], *load_args(limits)])
    assert slo_from_options(ns) == {k: v for k, v in dataclasses.asdict(limits).items() if v}


def test_infinite_rate_is_all_at_once_and_other_infinities_are_refused() -> None:
    ns = build_parser().parse_args(["bench", "u", "--request-rate", "inf"])
    assert load_from_options(ns).request_rate == math.inf
    LoadSpec(request_rate=math.inf).check()
    for name in ("burstiness", "request_timeout_s"):
        (f,) = [f for f in load_fields() if f.name == name]
        assert field_problem(f, math.inf) is not None
