"""The `ckptscan` console script, kept free of heavy imports.

Importing the CLI pulls in torch, which takes seconds; a Ctrl-C (or SIGTERM,
see `ckptscan.system.interrupts`) in that window must still be one line and exit
code 130, like a Ctrl-C mid-scan.

Once interrupted, the process ends without Python's interpreter teardown:
with torch loaded that teardown took 4-7 s on a loaded 2-core machine
(measured: the "interrupted" line at +0.3 s after SIGINT, the exit at
+4.5 to +6.9 s), while the person who pressed Ctrl-C waits. Nothing is left
to finish by then: every write is atomic and already whole or removed, and
the layer threads only read.

An exception no command caught (one of start-up or option parsing; the
commands catch their own, `ckptscan.cli.app.user_errors`) is one line and
exit 2 as well (`ckptscan.cli.crash`): never a traceback with Python's exit
code 1, the gate's.

A normal exit keeps Python's teardown but first freezes the heap
(`gc.freeze`): the teardown collects the whole heap, and a long run's
report is ~5·10⁵ objects, still alive there (the exit's traceback holds the
command's frame). At 2,000 pairs × 16 layers that was 0.5-0.6 s of every
cached re-run (bench/long_run.py). Frozen objects are still freed; the
collector only stops walking them.
"""

from __future__ import annotations

import gc
import os
import sys

from ckptscan.system.interrupts import terminate_like_ctrl_c

EXIT_INTERRUPT = 130


def main() -> None:
    try:
        with terminate_like_ctrl_c():
            try:
                from ckptscan.cli import main as cli_main
                from ckptscan.cli.process import claim_process
            except KeyboardInterrupt:
                sys.stderr.write("interrupted during start-up\n")
                raise SystemExit(EXIT_INTERRUPT) from None
            claim_process()
            cli_main()
    except SystemExit as e:
        if e.code == EXIT_INTERRUPT:
            _exit_now(EXIT_INTERRUPT)
        _flush_stdout()
        gc.freeze()
        raise
    except Exception as e:  # noqa: BLE001  a crash outside any command: one line and exit 2
        from ckptscan.cli import crash

        raise SystemExit(crash.report(e, "ckptscan")) from None


def _flush_stdout() -> None:
    """What is still buffered for stdout, written now: a reader that went away
    (`| head`) then costs nothing, where Python's own last flush would print
    "Exception ignored ... BrokenPipeError" and change the exit code to 120."""
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        from ckptscan.system.output import reader_gone

        reader_gone(1)
    except (OSError, ValueError):  # a closed stream: nothing more can be said
        pass


def _exit_now(code: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed or broken stream: nothing more can be said
            pass
    os._exit(code)
