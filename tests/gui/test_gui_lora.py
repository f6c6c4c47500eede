"""LoRA adapters in the panel: the library lists an adapter with its base model, and the
Playground sends its requests to the model or adapter picked from the server's list."""

from __future__ import annotations

from pathlib import Path

import pytest
from ckpt import TINY_LLAMA, write_checkpoint

from quantdeck.core.launch import cpu_device
from quantdeck.core.models import make_demo_adapter
from quantdeck.gui import playground
from quantdeck.gui.main_window import MainWindow
from quantdeck.gui.playground import PlaygroundPanel


def test_library_shows_an_adapter_with_its_base(qtbot, tmp_path: Path) -> None:
    base = write_checkpoint(tmp_path / "base", TINY_LLAMA)
    make_demo_adapter(tmp_path / "my-lora", base)
    win = MainWindow(device=cpu_device(), probe=False)
    qtbot.addWidget(win)
    win.add_folder(str(tmp_path))
    titles = [win.library_model.text(i, "model") for i in range(win.library_model.rowCount())]
    assert "my-lora   [LoRA-8 on base]" in titles
    win.add_model(tmp_path / "my-lora", select=True)
    assert "rank 8" in win.library_info.text() and str(base) in win.library_info.text()
    assert win.launch.model_path != str(tmp_path / "my-lora")  # an adapter is not launched alone


@pytest.mark.parametrize("server_model, sent", [("base", "demo-lora"), ("other", "other")])
def test_playground_sends_to_the_chosen_adapter(
    qtbot, monkeypatch: pytest.MonkeyPatch, server_model: str, sent: str
) -> None:
    """The choice is used while the list is this server's (it names the server's model)."""
    seen: list[str] = []

    def reply(url: str, model: str, **_):
        seen.append(model)
        yield "hi"

    monkeypatch.setattr(playground, "_reply", reply)
    pg = PlaygroundPanel(lambda: ("http://127.0.0.1:9", server_model, None))
    qtbot.addWidget(pg)
    pg.set_models(["base", "demo-lora"])
    pg.model_choice.setCurrentText("demo-lora")
    pg.set_models(["base", "demo-lora"])  # a refresh keeps the choice
    assert pg.model_choice.currentText() == "demo-lora"
    pg.input.setPlainText("hello")
    pg.send_button.click()
    qtbot.waitUntil(lambda: bool(seen) and pg.send_button.isEnabled(), timeout=5000)
    assert seen == [sent]
    pg.shutdown()
