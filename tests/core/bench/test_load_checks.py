"""A load that cannot be sent as asked is refused up front with one line, never half-run."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from quantdeck.core.bench import LoadSpec
from quantdeck.core.errors import ConfigError


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("warmups", -1, "--warmups must be 0 or more"),  # was: one measured request fewer
        ("seed", -1, "--seed / --load-seed must be 0 or more"),  # was: numpy's ValueError
        ("temperature", math.nan, "--temperature must be a number >= 0"),
        ("temperature", -0.5, "--temperature must be a number >= 0"),
        ("burstiness", math.inf, "--burstiness must be a number > 0"),
        ("burstiness", math.nan, "--burstiness must be a number > 0"),
        ("request_rate", math.nan, "--request-rate must be > 0"),
        ("request_timeout_s", 0.0, "request timeout must be a number of seconds > 0"),
    ],
)
def test_bad_load_is_one_config_error(field: str, value: float, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        LoadSpec(**{field: value}).check()


_number = st.floats(allow_nan=True, allow_infinity=True) | st.integers(-(2**40), 2**40)


@settings(max_examples=150, deadline=None)
@given(
    num_prompts=st.integers(-5, 10**6),
    concurrency=st.none() | st.integers(-5, 10**4),
    request_rate=_number,
    burstiness=_number,
    warmups=st.integers(-5, 100),
    temperature=st.none() | _number,
    seed=st.integers(-5, 2**40),
)
def test_any_load_is_checked_or_sane(**kw) -> None:
    """Whatever the numbers: ConfigError, or a load whose counts and times can be used."""
    spec = LoadSpec(**kw)
    try:
        spec.check()
    except ConfigError as e:
        assert "\n" not in str(e)
        return
    assert spec.num_prompts >= 1 and spec.warmups >= 0 and spec.seed >= 0
    assert spec.request_rate > 0 and 0 < spec.burstiness < math.inf
    assert spec.temperature is None or 0 <= spec.temperature < math.inf


def test_a_long_text_is_tokenized_in_pieces_of_whole_lines_under_the_open_gates_floor() -> None:
    """The corpus (388 KB) in one keyless /tokenize through a router without the workers' key
    was refused 413 by a keyed worker's open gate (64 KiB for the demo's context): the bench
    never started."""
    from quantdeck.core.bench.datasets import ENCODE_PIECE_BYTES, _corpus_text, _pieces

    text = _corpus_text()
    pieces = _pieces(text, ENCODE_PIECE_BYTES)
    assert "".join(pieces) == text and len(pieces) > 1
    assert all(len(p.encode()) <= ENCODE_PIECE_BYTES for p in pieces)
    assert all(p.endswith("\n") for p in pieces[:-1])  # whole lines
    assert _pieces("short", ENCODE_PIECE_BYTES) == ["short"] and _pieces("", 10) == [""]
    long_line = "x" * 100 + "\n"
    assert _pieces("a\n" + long_line + "b\n", 50) == ["a\n", long_line, "b\n"]
