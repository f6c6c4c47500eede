"""The Launch tab's saved profiles: the list (following the profiles folder), Save, Load,
Delete and the keyring's Remember API key."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QFileSystemWatcher, Signal
from PySide6.QtWidgets import QCheckBox, QComboBox, QHBoxLayout, QLabel, QPushButton, QWidget

from quantdeck.core.errors import QuantdeckError
from quantdeck.core.launch import LaunchConfig, profiles


class ProfilesBar(QWidget):
    """The row of saved profiles. It saves ``config()`` as made for vLLM ``made_for()`` (None:
    the vLLM installed beside Quantdeck), hands a loaded profile to its tab (``loaded``) and
    says what it did in one line (``said``)."""

    loaded = Signal(object, object, str)  # LaunchConfig, the vLLM it was saved with, its name
    said = Signal(str)  # a line for the tab's message

    def __init__(
        self,
        config: Callable[[], LaunchConfig],
        made_for: Callable[[], str | None],
        parent: QWidget | None = None,
    ) -> None:
        super().__init__(parent)
        self._config, self._made_for = config, made_for
        self.profiles = QComboBox()
        self.profiles.setEditable(True)
        self.profiles.setPlaceholderText("profile name")
        self.save_profile = QPushButton("Save")
        self.load_profile = QPushButton("Load")
        self.delete_profile = QPushButton("Delete")
        self.remember_key = QCheckBox("Remember API key")
        self.remember_key.setToolTip("Keep the key in the system keyring (never in the profile)")
        row = QHBoxLayout(self)
        row.setContentsMargins(0, 0, 0, 0)  # laid out as the tab's own row
        for w in (
            QLabel("Profile"),
            self.profiles,
            self.save_profile,
            self.load_profile,
            self.delete_profile,
            self.remember_key,
        ):
            row.addWidget(w)
        self.save_profile.clicked.connect(self._on_save_profile)
        self.load_profile.clicked.connect(self._on_load_profile)
        self.delete_profile.clicked.connect(self._on_delete_profile)
        # the list follows the profiles folder: a profile saved elsewhere (the Benchmark tab's
        # tuning, the CLI) shows up without a relay
        self._profiles_watch = QFileSystemWatcher(self)
        self._profiles_watch.directoryChanged.connect(self._on_profiles_folder_changed)
        self._on_profiles_folder_changed()

    def refresh_profiles(self) -> None:
        """Read the list of saved profiles again (the name typed or chosen stays)."""
        names = profiles.list_profiles()
        if names == [self.profiles.itemText(i) for i in range(self.profiles.count())]:
            return  # unchanged: leave what is being typed alone
        current = self.profiles.currentText()
        self.profiles.clear()
        self.profiles.addItems(names)
        self.profiles.setCurrentText(current)

    def select_profile(self, name: str) -> None:
        """Choose the saved profile ``name`` and load it into the form (as Load does)."""
        self.refresh_profiles()
        self.profiles.setCurrentText(name)
        self._on_load_profile()

    def _on_profiles_folder_changed(self, *_: str) -> None:
        # watch the profiles folder, or while it does not exist the nearest folder above it
        # that does (its creation is a change there); then read the list
        folder = profiles.profiles_dir()
        watch = next((p for p in (folder, *folder.parents) if p.is_dir()), None)
        if watch is not None and str(watch) not in self._profiles_watch.directories():
            stale = self._profiles_watch.directories()
            if stale:
                self._profiles_watch.removePaths(stale)
            self._profiles_watch.addPath(str(watch))
        self.refresh_profiles()

    def _on_save_profile(self) -> None:
        name = self.profiles.currentText().strip()
        try:
            cfg = self._config()
            # the vLLM the settings are made for: the engine they were last fit for (or the
            # loaded profile's record; None: the vLLM installed beside Quantdeck)
            path = profiles.save_profile(name, cfg, vllm_version=self._made_for())
            self.said.emit(f"saved {path} (without the API key)")
        except QuantdeckError as e:
            self.said.emit(str(e))
            return
        finally:
            self.refresh_profiles()
        if self.remember_key.isChecked() and cfg.server.api_key:
            problem = profiles.remember_key(name, cfg.server.api_key)
            if problem:  # said once: the box goes off and stays off
                self.remember_key.setChecked(False)
                self.remember_key.setEnabled(False)
                self.remember_key.setToolTip(problem)
                self.said.emit(f"saved {path}; {problem}")

    def _on_load_profile(self) -> None:
        name = self.profiles.currentText().strip()
        try:
            cfg, saved_with = profiles.read_profile(name)
        except QuantdeckError as e:
            self.said.emit(str(e))
            return
        self.loaded.emit(cfg, saved_with, name)
        self.said.emit(f"loaded profile {self.profiles.currentText()}")

    def _on_delete_profile(self) -> None:
        try:
            profiles.delete_profile(self.profiles.currentText().strip())
            self.said.emit("deleted")
        except QuantdeckError as e:
            self.said.emit(str(e))
        self.refresh_profiles()
