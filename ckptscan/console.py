"""The `ckptscan` console script, kept free of heavy imports.

Importing the CLI pulls in torch, which takes seconds; a Ctrl-C (or SIGTERM,
see `ckptscan.interrupts`) in that window must still be one line and exit
code 130, like a Ctrl-C mid-scan.
"""

from __future__ import annotations

import sys

from ckptscan.interrupts import terminate_like_ctrl_c


def main() -> None:
    with terminate_like_ctrl_c():
        try:
            from ckptscan.cli import main as cli_main
        except KeyboardInterrupt:
            sys.stderr.write("interrupted during start-up\n")
            raise SystemExit(130) from None
        cli_main()
