"""Hypothesis strategies of structured garbage for the readers' property tests: a valid
document with some fields replaced by values of the wrong type, range or size, removed, or
the whole text swapped for hostile JSON (100 000 levels deep, NaN, 5000-digit numbers)."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from quantdeck.core.errors import QuantdeckError


def fuzz_settings(max_examples: int) -> settings:
    """Each fuzz test stays within a few seconds; no example database left in the tree."""
    return settings(
        max_examples=max_examples,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, -1, -5, 1, 2, 4, 8, 128, 2**31, 2**63, 10**30]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["4", "x", "", "F16", "BF16", "gptq", "fp8", "../x.safetensors", "a" * 300]),
)
JSON_VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
HOSTILE_TEXT = st.sampled_from(
    [
        "[" * 100_000 + "]" * 100_000,
        '{"a":' * 50_000 + "1" + "}" * 50_000,
        "[" * 3000,
        "NaN",
        "[Infinity, -Infinity]",
        "1e999",
        "9" * 5000,
        '{"version": "1"}',
        "\ufeff{}",
        "",
        "{",
        "null",
        '"x"',
    ]
)


def mutated(base: dict[str, Any], keys: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    """``base`` with some of ``keys`` set to garbage and some of its own keys removed."""

    def apply(changes: dict[str, Any], removed: set[str]) -> dict[str, Any]:
        out = {k: v for k, v in base.items() if k not in removed}
        out.update(changes)
        return out

    return st.builds(
        apply,
        st.dictionaries(st.sampled_from(keys), JSON_VALUES, max_size=4),
        st.sets(st.sampled_from(sorted(base)), max_size=2),
    )


def as_text(doc: st.SearchStrategy[Any]) -> st.SearchStrategy[str]:
    """Documents as JSON text (NaN and Infinity written as Python writes them), or hostile
    text instead."""
    return st.one_of(doc.map(lambda d: json.dumps(d, allow_nan=True)), HOSTILE_TEXT)


def one_line_error(e: QuantdeckError) -> None:
    """A user error is one non-empty line."""
    text = str(e)
    assert text and "\n" not in text, repr(text)
