"""``quantdeck tune --space``: the flag may be repeated, each one adding its knobs (before,
a second flag replaced the first: exit 0, the knob dropped); a knob named twice, in one flag or
across two, is refused in one line (exit 2), offline and live alike. No server starts."""

from __future__ import annotations

from pathlib import Path

import pytest

from quantdeck.cli.main import build_parser, main
from quantdeck.core.bench import parse_space
from quantdeck.core.bench.tune import Tuner
from quantdeck.core.errors import ConfigError
from quantdeck.core.launch import cpu_device


def test_two_space_flags_keep_both_knobs() -> None:
    ns = build_parser().parse_args(
        [
            "tune",
            "/models/demo",
            "--space",
            "max_num_seqs=4,8",
            "vllm:max-logprobs=5,10",
            "--space",
            "enforce_eager=true,false",
        ]
    )
    assert ns.space == ["max_num_seqs=4,8", "vllm:max-logprobs=5,10", "enforce_eager=true,false"]
    assert list(parse_space(ns.space, cpu_device(), 4)) == [
        "max_num_seqs",
        "vllm:max-logprobs",
        "enforce_eager",
    ]
    live = build_parser().parse_args(
        ["tune", "--live", "f.yaml", "a", "--space", "max_num_seqs=1,8", "--space", "dtype=auto"]
    )
    assert live.space == ["max_num_seqs=1,8", "dtype=auto"]


def test_the_tuner_gets_every_flags_knobs(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def run(self: Tuner) -> None:  # the space the command built, said instead of a run
        raise ConfigError("space: " + " ".join(f"{k}={v}" for k, v in self.space.items()))

    monkeypatch.setattr(Tuner, "run", run)
    argv = ["tune", "/models/demo", "--ttft-ms", "100", "--tpot-ms", "10"]
    argv += ["--space", "max_num_seqs=4,8", "--space", "enforce_eager=true,false"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "space: max_num_seqs=[4, 8] enforce_eager=[True, False]" in err


@pytest.mark.parametrize(
    "spaces",
    [
        ["--space", "max_num_seqs=4,8", "--space", "max-num-seqs=16"],
        ["--space", "max_num_seqs=4,8", "max_num_seqs=16"],
    ],
)
def test_a_knob_given_twice_is_refused_in_one_line(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    spaces: list[str],
) -> None:
    monkeypatch.setenv("QUANTDECK_CACHE_DIR", str(tmp_path / "cache"))  # no fleet runs here
    offline = ["tune", "/models/demo", "--ttft-ms", "100", "--tpot-ms", "10"]
    for argv in (offline, ["tune", "--live", "fleet.yaml", "a"]):
        assert main([*argv, *spaces]) == 2
        out, err = capsys.readouterr()
        assert out == "" and err.count("\n") == 1, err
        assert "max_num_seqs is given twice" in err, err
