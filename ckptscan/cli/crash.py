"""An unexpected exception: one line on stderr and exit code 2.

A bug in ckptscan, or in a library it calls (torch's CUDA backend loading
itself from two threads at once, say), is not the gate's verdict: exit code
1 would tell a CI job the run alerted. It is not the user's business either:
a traceback of forty frames hides the one line that says what failed. So a
command that meets one prints

    error: internal error in ckptscan diff: RuntimeError: ... (at ckptscan/monitors/attention.py:252; \
run with --debug for the traceback)

and exits 2, like any other error it cannot go past. `ckptscan --debug
COMMAND` (or CKPTSCAN_DEBUG=1) prints the traceback before that line, for a
bug report. No report file is written by then: every write is atomic and
comes after the scan.

No heavy imports: the console script reports a crash of its own start-up
with it too.
"""

from __future__ import annotations

import os
import sys
import traceback
from pathlib import Path

EXIT_INTERNAL = 2  # the exit code of usage and input errors: anything that is not a verdict
DEBUG_ENV = "CKPTSCAN_DEBUG"
_MAX_MESSAGE = 400  # characters of the exception's message on the one line

# Set by `ckptscan --debug` for the command it runs.
debug = False


def debugging() -> bool:
    """Whether the traceback is wanted: --debug, or CKPTSCAN_DEBUG set to anything but 0 or empty."""
    return debug or os.environ.get(DEBUG_ENV, "") not in ("", "0")


def one_line(error: BaseException, what: str) -> str:
    """`error` as the line the user sees: where, the exception, and the way to its traceback."""
    message = " ".join(str(error).split())  # a multi-line message (torch's are) on one line
    if len(message) > _MAX_MESSAGE:
        message = message[:_MAX_MESSAGE] + "…"
    kind = type(error).__name__
    where = _raised_at(error)
    hint = "see the traceback above" if debugging() else "run with --debug for the traceback"
    return (f"error: internal error in {what}: {kind}{': ' + message if message else ''} "
            f"({'at ' + where + '; ' if where else ''}{hint})")


def report(error: BaseException, what: str) -> int:
    """Print `error` (its traceback first when debugging) on stderr; the exit code to end with."""
    try:
        if debugging():
            traceback.print_exception(type(error), error, error.__traceback__, file=sys.stderr)
        print(one_line(error, what), file=sys.stderr, flush=True)
    except (OSError, ValueError):  # stderr itself is gone: the exit code still says it
        pass
    return EXIT_INTERNAL


def _raised_at(error: BaseException) -> str:
    """The innermost frame of ckptscan's own code the exception passed through,
    as path:line relative to the package's parent ("" if none did)."""
    package = Path(__file__).resolve().parents[1]
    found = ""
    for frame in traceback.extract_tb(error.__traceback__):
        path = Path(frame.filename).resolve()
        if path.is_relative_to(package):
            found = f"{path.relative_to(package.parent)}:{frame.lineno}"
    return found
