"""Errors a user can cause, each carrying one line that says what and where.

The CLI prints ``str(error)`` and exits with code 2; the GUI shows the same line. Anything that
is not a :class:`QuantdeckError` is a bug and keeps its traceback.
"""

from __future__ import annotations

import re

# the user-info part of a URL (``scheme://user:password@host``): everything between ``://`` and
# the last ``@`` before the host's end, so that a password holding an ``@`` goes whole
_URL_CREDENTIALS = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^\s/?#]*@")


def mask_credentials(text: str) -> str:
    """``text`` with the credentials of every URL in it shown as ``***``
    (``http://user:pw@host:8000`` -> ``http://***@host:8000``)."""
    return _URL_CREDENTIALS.sub(r"\1***@", text)


class QuantdeckError(Exception):
    """Base of every user-facing error: ``str(e)`` is the one-line message, any URL in it
    without its credentials."""

    exit_code = 2

    def __init__(self, message: str) -> None:
        super().__init__(mask_credentials(" ".join(message.split())))


class ConfigError(QuantdeckError):
    """A knob is out of range, contradicts another, or a profile file is unreadable."""


class ModelError(QuantdeckError):
    """A model folder is missing, incomplete, corrupt or of an unknown architecture."""


class PlanError(QuantdeckError):
    """The memory planner cannot produce a plan from what it was given."""


class ServerError(QuantdeckError):
    """The vLLM server could not be started, reached or stopped."""
