"""The Playground tab: chat or completion against the running server, streamed in a worker,
with sampling parameters and per-reply TTFT and tokens/s; the model or a LoRA adapter the server
serves is picked from its /v1/models."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from PySide6.QtCore import QEvent, QObject, Qt, Signal
from PySide6.QtGui import QKeyEvent, QShowEvent, QTextCursor
from PySide6.QtWidgets import (
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

if TYPE_CHECKING:
    from quantdeck.gui.workers import WorkerSet

# Lines the transcript keeps: the oldest go first (a long session must not fill memory).
MAX_TRANSCRIPT_LINES = 5000


def _reply(
    url: str, model: str, *, messages: list[dict[str, str]] | None, prompt: str | None, **kw: Any
) -> Any:
    """Stream one reply (in a worker): yields the text as it comes, returns its ReplyStats."""
    from quantdeck.core.runtime import stream

    last = None
    for delta, st in stream(url, model, messages=messages, prompt=prompt, **kw):
        last = st
        if delta:
            yield delta
    return last


def _served_models(url: str, api_key: str | None) -> list[str]:
    """The names the server answers to (in a worker): its model, then loaded adapters."""
    from quantdeck.core.runtime import AttachedServer

    return AttachedServer(url, api_key=api_key).check()


class PlaygroundPanel(QWidget):
    reply_finished = Signal(object)  # quantdeck.core.runtime.chat.ReplyStats

    def __init__(
        self,
        target: Callable[[], tuple[str | None, str | None, str | None]],
        parent: QWidget | None = None,
        *,
        waiting: Callable[[], str] = lambda: "",
    ) -> None:
        """``target()`` returns (url, model, api_key) of the current server, or Nones;
        ``waiting()``, why there is none to send to yet ("": none is coming: start one)."""
        super().__init__(parent)
        self._target, self._waiting = target, waiting
        self.history: list[dict[str, str]] = []
        self.worker: Any = None  # the reply being streamed
        self._workers: WorkerSet | None = None
        self.mode = QComboBox()
        self.mode.addItems(["chat", "completion"])
        self.model_choice = QComboBox()  # the base model or a LoRA adapter, from /v1/models
        self.model_choice.setToolTip("the model or LoRA adapter the requests name")
        self.refresh_models_button = QPushButton("Refresh models")
        self.temperature = QDoubleSpinBox()
        self.temperature.setRange(0, 2)
        self.temperature.setSingleStep(0.1)
        self.temperature.setValue(0.7)
        self.top_p = QDoubleSpinBox()
        self.top_p.setRange(0.01, 1)
        self.top_p.setSingleStep(0.05)
        self.top_p.setValue(1.0)
        self.max_tokens = QSpinBox()
        self.max_tokens.setRange(1, 32768)
        self.max_tokens.setValue(128)
        self.system = QPlainTextEdit()  # chat: sent first with every turn, editable between
        self.system.setPlaceholderText("System prompt (chat; none: the model's template alone)")
        self.system.setMaximumHeight(70)
        self.copy_button = QPushButton("Copy as curl")
        self.copy_button.setToolTip(
            "the next request (the input as it is, or the last one sent) as a curl command; "
            "a keyed server's key is read from $VLLM_API_KEY, never copied"
        )
        self.transcript = QPlainTextEdit()
        self.transcript.setReadOnly(True)
        self.transcript.setMaximumBlockCount(MAX_TRANSCRIPT_LINES)
        self.input = QPlainTextEdit()
        self.input.setPlaceholderText(
            "Write a message or a prompt… (Enter sends, Shift+Enter: a new line)"
        )
        self.input.installEventFilter(self)  # Enter (or Ctrl+Enter) sends, as in chat apps
        self.input.setMaximumHeight(90)
        self.send_button = QPushButton("Send")
        self.stop_button = QPushButton("Stop")
        self.stop_button.setEnabled(False)
        self.clear_button = QPushButton("Clear")
        self.stats = QLabel("—")
        params = QFormLayout()
        for label, w in (
            ("Model", self.model_choice),
            ("", self.refresh_models_button),
            ("Mode", self.mode),
            ("Temperature", self.temperature),
            ("Top-p", self.top_p),
            ("Max tokens", self.max_tokens),
        ):
            params.addRow(label, w)
        side = QVBoxLayout()
        side.addLayout(params)
        side.addWidget(self.system)
        side.addWidget(self.stats)
        side.addStretch(1)
        buttons = QHBoxLayout()
        for b in (self.send_button, self.stop_button, self.clear_button, self.copy_button):
            buttons.addWidget(b)
        main = QVBoxLayout()
        main.addWidget(self.transcript, 1)
        main.addWidget(self.input)
        main.addLayout(buttons)
        lay = QHBoxLayout(self)
        lay.addLayout(main, 3)
        lay.addLayout(side, 1)
        self.send_button.clicked.connect(self._on_send_clicked)
        self.stop_button.clicked.connect(self._on_stop_clicked)
        self.clear_button.clicked.connect(self._on_clear_clicked)
        self.refresh_models_button.clicked.connect(self.refresh_models)
        self.copy_button.clicked.connect(self.copy_as_curl)
        self.model_choice.currentTextChanged.connect(self.model_choice.setToolTip)  # (cut off)
        self.mode.currentTextChanged.connect(lambda m: self.system.setEnabled(m == "chat"))
        self._last: tuple[str, str, dict[str, Any], bool] | None = None  # the last sent

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        """Enter or Ctrl+Enter in the input sends (while Send may); Shift+Enter is a new line."""
        if watched is self.input and event.type() == QEvent.Type.KeyPress:
            key = cast(QKeyEvent, event)
            enter = key.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter)
            if enter and not key.modifiers() & Qt.KeyboardModifier.ShiftModifier:
                if self.send_button.isEnabled():
                    self._on_send_clicked()
                return True  # never a newline (a send under way: the text waits)
        return super().eventFilter(watched, event)

    def _write(self, text: str) -> None:
        cur = self.transcript.textCursor()
        cur.movePosition(QTextCursor.MoveOperation.End)
        cur.insertText(text)
        self.transcript.setTextCursor(cur)

    def _start(self, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if self._workers is None:  # superqt is imported on first use: after the first paint
            from quantdeck.gui.workers import WorkerSet

            self._workers = WorkerSet(self._on_error)
        return self._workers.start(func, *args, **kwargs)

    def showEvent(self, event: QShowEvent) -> None:
        super().showEvent(event)
        self.refresh_models()

    def refresh_models(self) -> None:
        """Fill the model choice from the server's /v1/models (adapters loaded since appear)."""
        url, _, key = self._target()
        if url:
            self._start(_served_models, url, key, returned=self.set_models)

    def set_models(self, names: list[str]) -> None:
        """Offer ``names``; the current choice stays when the server still serves it."""
        current = self.model_choice.currentText()
        self.model_choice.clear()
        self.model_choice.addItems(names)
        if current in names:
            self.model_choice.setCurrentText(current)

    def _on_send_clicked(self) -> None:
        url, model, key = self._target()
        text = self.input.toPlainText().strip()
        if not text:
            return
        if not url or not model:
            self.stats.setText(self._waiting() or "no server: start or attach one first")
            return
        chat = self.mode.currentText() == "chat"
        if chat:
            self.history.append({"role": "user", "content": text})
            self._write(f"\n▶ you: {text}\n◀ model: ")
        else:
            self._write(f"\n{text}")
        self.input.clear()
        model, request = self._request(model, text if not chat else None)
        self._last = (url, *request, bool(key))
        self.worker = self._start(
            _reply,
            url,
            model,
            messages=request[1].get("messages"),
            prompt=request[1].get("prompt"),
            api_key=key,
            max_tokens=self.max_tokens.value(),
            temperature=self.temperature.value(),
            top_p=self.top_p.value(),
            yielded=self._write,
            returned=lambda st: self._on_reply_done(st, chat),
            finished=self._idle,
        )
        self.send_button.setEnabled(False)
        self.stop_button.setEnabled(True)
        self.stats.setText("waiting for the first token…")

    def _request(self, model: str, prompt: str | None) -> tuple[str, tuple[str, dict[str, Any]]]:
        """The model the request names and its (path, body): chat (``prompt`` None) sends the
        system prompt, then the history."""
        from quantdeck.core.runtime import request_of

        if self.model_choice.findText(model) >= 0:  # the list is this server's: use the choice
            model = self.model_choice.currentText()
        messages = None
        if prompt is None:
            system = self.system.toPlainText().strip()
            messages = [{"role": "system", "content": system}] if system else []
            messages += self.history
        return model, request_of(
            model,
            messages=messages,
            prompt=prompt,
            max_tokens=self.max_tokens.value(),
            temperature=self.temperature.value(),
            top_p=self.top_p.value(),
        )

    def copy_as_curl(self) -> str | None:
        """The request the input would send now (else the last one sent) as a curl command,
        on the clipboard and returned; the key never in it."""
        from PySide6.QtGui import QGuiApplication

        from quantdeck.core.runtime import curl_command

        url, model, key = self._target()
        text = self.input.toPlainText().strip()
        if text and url and model:
            chat = self.mode.currentText() == "chat"
            if chat:
                self.history.append({"role": "user", "content": text})
            try:
                _, (path, body) = self._request(model, None if chat else text)
            finally:
                if chat:
                    self.history.pop()  # copied, not sent
            command = curl_command(url, path, body, keyed=bool(key))
        elif self._last is not None:
            command = curl_command(*self._last[:3], keyed=self._last[3])
        else:
            self.stats.setText("nothing to copy: write a message (or send one) first")
            return None
        QGuiApplication.clipboard().setText(command)
        self.stats.setText(
            "copied as curl" + (" (the key as $VLLM_API_KEY)" if "VLLM_API_KEY" in command else "")
        )
        return command

    def _on_reply_done(self, st: Any, chat: bool) -> None:
        if st is None:
            return
        if chat:
            self.history.append({"role": "assistant", "content": st.text})
        tps = st.tokens_per_s
        self.stats.setText(
            f"TTFT {st.ttft_ms:.0f} ms · {st.completion_tokens} tokens · "
            f"{tps:.1f} tok/s · {st.finish_reason}"
            if st.ttft_ms is not None and tps
            else f"{st.completion_tokens} tokens · {st.finish_reason}"
        )
        self._write("\n")
        self._idle()  # ready for the next message when listeners hear of this one
        self.reply_finished.emit(st)

    def _idle(self) -> None:
        self.send_button.setEnabled(True)
        self.stop_button.setEnabled(False)

    def _on_error(self, msg: str) -> None:
        self.stats.setText(msg)

    def _on_stop_clicked(self) -> None:
        if self.worker is not None:
            self.worker.quit()

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop a reply in progress and wait for its worker (the window is closing)."""
        if self._workers is not None:
            self._workers.quit()
            self._workers.wait(timeout)

    def _on_clear_clicked(self) -> None:
        self.history.clear()
        self.transcript.clear()
        self.stats.setText("—")
