"""The Benchmark tab's load form is walked from the load's declaration: one widget per field of
LoadSpec and of the SLO limits, the advanced ones behind "More load options", and a load set
in the form is the load it runs (and back)."""

from __future__ import annotations

import math
import random

import pytest
from PySide6.QtCore import QPoint, Qt

from quantdeck.core.bench import LoadSpec, SloLimits, load_fields
from quantdeck.core.launch import LaunchConfig
from quantdeck.gui.bench import PANEL_LOAD, BenchTab


@pytest.fixture
def tab(qtbot) -> BenchTab:
    t = BenchTab(lambda: (None, None, None), LaunchConfig, lambda: False)
    qtbot.addWidget(t)
    t.show()
    qtbot.waitExposed(t)
    return t


def test_the_form_has_one_widget_per_field(tab: BenchTab) -> None:
    for rows, cls in ((tab.load_rows, LoadSpec), (tab.slo_rows, SloLimits)):
        assert list(rows.editors) == [f.name for f in load_fields(cls)]
        for f in load_fields(cls):
            w = rows.editors[f.name].widget
            assert tab.isAncestorOf(w), f.name
            assert f.doc in w.toolTip() and f.flag in w.toolTip()
    widgets = [ed.widget for r in (tab.load_rows, tab.slo_rows) for ed in r.editors.values()]
    assert len(set(map(id, widgets))) == len(widgets)
    # the widgets the tab names are the form's
    assert tab.concurrency is tab.load_rows.editors["concurrency"].widget
    assert tab.slo_ttft is tab.slo_rows.editors["ttft"].widget


def test_advanced_fields_wait_for_more_load_options(qtbot, tab: BenchTab) -> None:
    def hidden() -> set[str]:
        rows = (*tab.load_rows.editors.items(), *tab.slo_rows.editors.items())
        return {name for name, ed in rows if not ed.widget.isVisible()}

    advanced = {f.name for f in (*load_fields(), *load_fields(SloLimits)) if f.advanced}
    assert advanced and hidden() == advanced
    box = QPoint(8, tab.more_load.height() // 2)  # on its box (the row is wider than its text)
    qtbot.mouseClick(tab.more_load, Qt.LeftButton, pos=box)
    assert hidden() == set()
    qtbot.mouseClick(tab.more_load, Qt.LeftButton, pos=box)
    assert hidden() == advanced


def test_the_panels_first_load(tab: BenchTab) -> None:
    """As before the walk: eight in flight, 32 prompts of 128 tokens, 64 out, no SLO."""
    assert tab.load_spec() == PANEL_LOAD
    assert (tab.concurrency.value(), tab.num_prompts.value(), tab.output_len.value()) == (8, 32, 64)
    assert tab.rate.specialValueText() == "all at once" and tab.rate.value() == tab.rate.minimum()
    assert tab.dataset.currentData() == "corpus" and tab.dataset.currentText() == "English text"
    assert tab.slo() == {}
    tab.concurrency.setValue(tab.concurrency.minimum())
    tab.rate.setValue(2.5)
    tab.slo_ttft.setValue(1500)
    spec = tab.load_spec()
    assert spec.concurrency is None and spec.request_rate == 2.5
    assert tab.slo() == {"ttft": 1500.0}


@pytest.mark.parametrize("seed", range(8))
def test_a_load_set_in_the_form_is_the_load_it_runs(tab: BenchTab, seed: int) -> None:
    rng = random.Random(seed)
    values = {}
    for f in load_fields():
        if rng.random() < 0.5:
            continue
        if f.choices is not None:
            values[f.name] = rng.choice(f.choices)
        elif f.base is bool:
            values[f.name] = rng.choice([True, False])
        elif f.base is int:
            values[f.name] = rng.randint(int(f.ge if f.ge is not None else 1), 5000)
        elif f.base is float:
            values[f.name] = rng.choice([round(rng.uniform(0.01, 50.0), 2), math.inf][: 1 + f.inf])
        else:
            values[f.name] = rng.choice(["/data/p.jsonl", "a b", "ünï"])
    spec = LoadSpec(**values)
    tab.load_rows.set_values(spec)
    assert tab.load_spec() == spec
