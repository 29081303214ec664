"""The `ckptscan` command line: a thin shell over the library API.

Each command lives in its own module and registers itself on the shared app.
"""

from __future__ import annotations

import sys

from ckptscan.cli.destinations import registry  # noqa: F401  (each destination declares its options)
from ckptscan.cli import diff  # noqa: F401  (registers the command)
from ckptscan.cli import trend  # noqa: F401  (registers the command)
from ckptscan.cli import compare  # noqa: F401  (registers the command)
from ckptscan.cli import inspect_command  # noqa: F401  (registers the command `inspect`)
from ckptscan.cli import report  # noqa: F401  (registers the command)
from ckptscan.cli import watch  # noqa: F401  (registers the command)
from ckptscan.cli.app import EXIT_INPUT, app, err
from ckptscan.errors import CkptScanError
from ckptscan.system.interrupts import terminate_like_ctrl_c


def main() -> None:
    try:
        with terminate_like_ctrl_c():  # SIGTERM: the same clean exit as Ctrl-C
            app()
    except CkptScanError as e:  # raised outside a command body (option parsing)
        err().print(f"error: {e}", highlight=False, markup=False)
        sys.exit(EXIT_INPUT)


if __name__ == "__main__":
    main()
