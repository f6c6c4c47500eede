"""Moved to :mod:`quantdeck.gui.launch` (issue 44): kept until gui/main_window.py imports it."""

from quantdeck.gui.launch import ROUTER_INSTANCE, LaunchTab

__all__ = ["ROUTER_INSTANCE", "LaunchTab"]
