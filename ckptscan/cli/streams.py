"""The consoles the commands print through, for readers that may go away.

`ckptscan trend RUN | head -1` closes stdout after one line. rich's own
console answers that with `SystemExit(1)`, the gate's code, and no reason:
under `set -o pipefail` a CI job then failed a healthy run. Here, as for
every file written to stdout (`ckptscan.system.output`), a reader that went
away has what it wanted: the rest of what this console prints is discarded,
the command goes on to its verdict, and exits with its own code (0 healthy,
1 with the gate's reason on stderr).

Imported by `ckptscan.cli.app` only when a console is made: rich is not
needed for `--help`.
"""

from __future__ import annotations

from rich.console import Console as RichConsole

from ckptscan.system.output import reader_gone


class Console(RichConsole):
    """A rich console that goes quiet when the reader of its stream leaves."""

    def on_broken_pipe(self) -> None:
        self.quiet = True  # nothing more is rendered through this console
        try:
            fd = self.file.fileno()
        except (AttributeError, OSError, ValueError):  # a StringIO or a closed stream: nothing to redirect
            return
        reader_gone(fd)
