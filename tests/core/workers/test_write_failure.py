"""The conversion worker's one line for a failed write (a full disk), whatever raised it."""

from __future__ import annotations

from quantdeck.core.workers.quantize.common import write_failure


def test_write_failure_lines() -> None:
    e = OSError(28, "No space left on device", "/o/model.safetensors")
    assert write_failure(e) == "/o/model.safetensors: No space left on device"
    rust = Exception(
        'Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space '
        'left on device" })'
    )
    assert write_failure(rust) == "no space left on device"
    assert write_failure(RuntimeError("File too large")) == "file too large"
    assert write_failure(ValueError("a bug")) is None
