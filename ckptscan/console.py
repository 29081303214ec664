"""The `ckptscan` console script, kept free of heavy imports.

Importing the CLI pulls in torch, which takes seconds; a Ctrl-C in that
window must still be one line and exit code 130, like a Ctrl-C mid-scan.
"""

from __future__ import annotations

import sys


def main() -> None:
    try:
        from ckptscan.cli import main as cli_main
    except KeyboardInterrupt:
        sys.stderr.write("interrupted during start-up\n")
        raise SystemExit(130) from None
    cli_main()
