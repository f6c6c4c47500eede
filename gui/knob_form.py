"""The launch form, generated from the knob schema (no hand-written field list).

bool -> checkbox (optional bool -> auto/on/off), Literal -> combo, bounded number -> spin box
(optional -> "auto" at the bottom of the range), byte sizes and lists -> text with parsing. The form
reads and writes a :class:`quantdeck.core.launch.config.LaunchConfig`; edits emit ``changed``."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QSignalBlocker, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QGroupBox,
    QLabel,
    QLineEdit,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from quantdeck.core.launch import GROUPS, Knob, LaunchConfig, check_value, iter_knobs, parse_text

_INT_MAX = 2**31 - 1
_AUTO = "auto"

# The widget a knob is edited with, by its type (see KnobField.__init__).
KnobWidget = QCheckBox | QComboBox | QSpinBox | QDoubleSpinBox | QLineEdit


class KnobEditor:
    """One widget bound to one knob: ``value()`` / ``set_value()`` and a change callback."""

    def __init__(self, knob: Knob, on_change: Any) -> None:
        self.knob = knob
        self.error: str | None = None
        k = knob
        w: KnobWidget
        if k.base is bool and not k.optional:
            w = QCheckBox()
            w.toggled.connect(on_change)
        elif k.base is bool or k.choices is not None:
            w = QComboBox()
            items = [True, False] if k.base is bool else list(k.choices or ())
            self._items = ([None] if k.optional else []) + items
            for it in self._items:
                w.addItem(
                    _AUTO
                    if it is None
                    else ("on" if it is True else "off" if it is False else str(it))
                )
            w.currentIndexChanged.connect(on_change)
        elif k.base is int and k.unit != "bytes" and (k.le or 0) <= _INT_MAX:
            w = QSpinBox()
            lo = int(k.ge if k.ge is not None else (k.gt or 0) + 1)
            w.setRange(lo - 1 if k.optional else lo, int(k.le) if k.le else _INT_MAX)
            if k.optional:
                w.setSpecialValueText(_AUTO)
            if k.unit:
                w.setSuffix(f" {k.unit}")
            w.valueChanged.connect(on_change)
        elif k.base is float:
            w = QDoubleSpinBox()
            w.setDecimals(3 if (k.le or 10) <= 1 else 2)
            w.setSingleStep(0.01 if (k.le or 10) <= 1 else 1.0)
            low = k.ge if k.ge is not None else (k.gt or 0) + 0.001
            w.setRange(low, k.le if k.le is not None else 1e6)
            if k.unit:
                w.setSuffix(f" {k.unit}")
            w.valueChanged.connect(on_change)
        else:  # str, lists, byte sizes: text
            w = QLineEdit()
            if k.optional or k.base is list:
                w.setPlaceholderText(_AUTO if k.base is not list else "none")
            if k.unit == "bytes":
                w.setPlaceholderText("auto (e.g. 128M, 4GiB)")
            if k.secret_env:
                w.setEchoMode(QLineEdit.EchoMode.Password)
                w.setPlaceholderText("none")
            w.textChanged.connect(on_change)
        w.setToolTip(f"{k.flag}\n{k.doc}\nvLLM default: {k.vllm_default}")
        w.setObjectName(f"knob_{k.name}")
        self.widget = w

    def value(self) -> Any:
        k, w = self.knob, self.widget
        self.error = None
        if isinstance(w, QCheckBox):
            return w.isChecked()
        if isinstance(w, QComboBox):
            return self._items[w.currentIndex()]
        if isinstance(w, QSpinBox):
            return None if k.optional and w.value() == w.minimum() else w.value()
        if isinstance(w, QDoubleSpinBox):
            return float(w.value())
        text = w.text()
        if k.base is list:
            if not text.strip():  # "auto" (None) where the knob has it: [] is a value to vLLM
                return None if k.optional else []
            if k.item is str:
                return [p.strip() for p in text.split(",") if p.strip()]
            return parse_text(k, text)
        if not text.strip():
            return None if k.optional else ""
        v = parse_text(k, text)
        check_value(k, v)
        return v

    def set_value(self, v: Any) -> None:
        k, w = self.knob, self.widget
        with QSignalBlocker(w):
            if isinstance(w, QCheckBox):
                w.setChecked(bool(v))
            elif isinstance(w, QComboBox):
                w.setCurrentIndex(self._items.index(v) if v in self._items else 0)
            elif isinstance(w, QSpinBox):
                w.setValue(w.minimum() if v is None else int(v))
            elif isinstance(w, QDoubleSpinBox):
                w.setValue(float(v))
            elif k.base is list:
                w.setText(", ".join(str(x) for x in (v or [])))
            else:
                w.setText("" if v is None else str(v))


class KnobForm(QWidget):
    """Every launch setting, grouped like vLLM's; advanced knobs can be hidden."""

    changed = Signal()

    def __init__(
        self, parent: QWidget | None = None, *, skip: tuple[str, ...] = ("model",)
    ) -> None:
        super().__init__(parent)
        self.editors: dict[str, KnobEditor] = {}
        self._config = LaunchConfig()
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        self._rows: dict[str, tuple[QLabel, QWidget]] = {}
        for group in GROUPS:
            box = QGroupBox({"lora": "LoRA"}.get(group, group.capitalize()))
            box.setObjectName(f"group_{group}")
            form = QFormLayout(box)
            for k in iter_knobs():
                if k.group != group or k.name in skip:
                    continue
                ed = KnobEditor(k, self._on_widget_changed)
                self.editors[k.name] = ed
                label = QLabel(k.title)
                label.setToolTip(k.doc)
                form.addRow(label, ed.widget)
                self._rows[k.name] = (label, ed.widget)
            if form.rowCount():
                lay.addWidget(box)
        lay.addStretch(1)
        self.set_config(self._config)

    def set_config(self, cfg: LaunchConfig) -> None:
        self._config = cfg.copy()
        for ed in self.editors.values():
            ed.set_value(ed.knob.get(self._config))

    def config(self) -> LaunchConfig:
        """The form's values over the last set config; ConfigError names a bad field."""
        cfg = self._config.copy()
        for ed in self.editors.values():
            ed.knob.set(cfg, ed.value())
        return cfg

    def set_advanced_visible(self, visible: bool) -> None:
        for name, (label, w) in self._rows.items():
            if self.editors[name].knob.advanced:
                label.setVisible(visible)
                w.setVisible(visible)

    def set_supported(self, flags: set[str] | None) -> None:
        """Grey out the knobs the chosen engine does not have."""
        for ed in self.editors.values():
            flag = (
                ed.knob.flag.split(".")[0]
                if ed.knob.flag.startswith("--compilation-config.")
                else ed.knob.flag
            )
            ok = flags is None or flag in flags or ed.knob.quantdeck_only
            ed.widget.setEnabled(ok)
            if not ok:
                ed.widget.setToolTip(f"{ed.knob.flag}: this vLLM has no such option")

    def _on_widget_changed(self, *_: Any) -> None:
        self.changed.emit()
