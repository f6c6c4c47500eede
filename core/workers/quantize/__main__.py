"""The conversion worker's command line, ``python -m quantdeck.core.workers.quantize``: the
checks before any heavy import, then the backend of the method. The package's docstring
describes the formats, the JSON lines on stdout and the one-line errors."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, NoReturn

from quantdeck.core.errors import QuantdeckError
from quantdeck.core.models import CONVERSION_METHODS
from quantdeck.core.workers import protocol
from quantdeck.core.workers.protocol import emit
from quantdeck.core.workers.quantize import bnb, compressed, gptqmodel
from quantdeck.core.workers.quantize.common import (
    DEFAULT_CALIB,
    DEFAULT_SAMPLES,
    DEFAULT_SEQ_LEN,
    Progress,
    check_out,
    check_source,
    copy_side_files,
    peak_rss_bytes,
    quiet_libraries,
    read_calibration,
    weight_bytes,
    write_failure,
)

PROG = "quantize"  # the name on its one-line errors
CALIBRATED = ", ".join(m.name for m in CONVERSION_METHODS.values() if m.calibrated)


def convert(
    src: Path, out: Path, method: str, calib_path: Path | None, samples: int, seq_len: int
) -> dict[str, Any]:
    """Convert SRC into OUT; return the done event's fields."""
    t0 = time.monotonic()
    target = CONVERSION_METHODS[method]
    info = check_source(src)
    check_out(out, src)
    calib = read_calibration(calib_path or DEFAULT_CALIB) if target.calibrated else []
    progress = Progress(info.num_layers)
    progress("load", 0.0)
    quiet_libraries()
    import torch

    torch.manual_seed(0)
    if target.quant_method == "compressed-tensors":
        compressed.convert(src, out, method, info, calib, samples, seq_len, progress)
    elif target.quant_method == "bitsandbytes":
        bnb.convert(src, out, method, info, progress)
    else:  # gptq, awq
        gptqmodel.convert(src, out, method, info, calib, samples, seq_len, progress)
    copy_side_files(src, out)
    progress("save", 1.0)
    return {
        "out": str(out),
        "quant_method": target.quant_method,
        "method": method,
        "scheme": target.scheme,
        "bytes": weight_bytes(out),
        "src_bytes": weight_bytes(src),
        "seconds": round(time.monotonic() - t0, 2),
        "peak_rss_bytes": peak_rss_bytes(),
    }


def fail(message: object) -> NoReturn:
    """One error line on stderr, exit code 2."""
    protocol.fail(PROG, message)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = protocol.OneLineParser(
        prog=PROG, description="Convert an unquantized model into a format vLLM serves."
    )
    parser.add_argument("--src", type=Path, required=True, help="unquantized model folder")
    parser.add_argument("--out", type=Path, required=True, help="existing empty output folder")
    parser.add_argument(
        "--method", required=True, choices=tuple(CONVERSION_METHODS), help="target format"
    )
    parser.add_argument(
        "--calib",
        type=Path,
        default=None,
        help=f"calibration text (.txt or .jsonl; {CALIBRATED}; default: the shipped training text)",
    )
    parser.add_argument("--samples", type=int, default=DEFAULT_SAMPLES, help="calibration samples")
    parser.add_argument(
        "--seq-len", type=int, default=DEFAULT_SEQ_LEN, help="calibration sequence length (tokens)"
    )
    args = parser.parse_args(argv)
    if args.samples < 1:
        fail(f"--samples must be at least 1, got {args.samples}")
    if args.seq_len < 2:
        fail(f"--seq-len must be at least 2, got {args.seq_len}")
    if args.calib is not None and not args.calib.is_file():
        fail(f"{args.calib}: calibration file not found")
    protocol.events_to_own_stdout()
    try:
        done = convert(
            args.src.expanduser(),
            args.out.expanduser(),
            args.method,
            args.calib,
            args.samples,
            args.seq_len,
        )
    except QuantdeckError as e:
        fail(str(e))
    except MemoryError:
        fail("out of memory while converting")
    except Exception as e:  # e.g. the disk filled up while saving: one line, no traceback
        if (why := write_failure(e)) is None:
            raise
        fail(f"cannot write the converted model ({why})")
    emit("done", **done)
    return 0


if __name__ == "__main__":
    sys.exit(main())
