"""Errors a user can cause, each carrying one line that says what and where.

The CLI prints ``str(error)`` and exits with code 2; the GUI shows the same line. Anything that
is not a :class:`QuantdeckError` is a bug and keeps its traceback.
"""

from __future__ import annotations


class QuantdeckError(Exception):
    """Base of every user-facing error: ``str(e)`` is the one-line message."""

    exit_code = 2

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))


class ConfigError(QuantdeckError):
    """A knob is out of range, contradicts another, or a profile file is unreadable."""


class ModelError(QuantdeckError):
    """A model folder is missing, incomplete, corrupt or of an unknown architecture."""


class PlanError(QuantdeckError):
    """The memory planner cannot produce a plan from what it was given."""


class ServerError(QuantdeckError):
    """The vLLM server could not be started, reached or stopped."""
