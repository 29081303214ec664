"""What only the command's own process may do.

The console script (`ckptscan.cli.console`) claims the process before it runs a
command; an in-process caller (a test's CliRunner, a notebook) does not, and
keeps its garbage collector as it is.
"""

from __future__ import annotations

_own_process = False


def claim_process() -> None:
    global _own_process
    _own_process = True
    from ckptscan.system import collector  # no heavy imports

    collector.freeze_rebuilt = True  # what the caches rebuild lives as long as the command


def load_library() -> None:
    """In the command's own process: import torch and the library with the
    garbage collector paused, then freeze what was imported. Importing torch
    creates ~10⁶ objects and sets off several full collections; every later
    one, and the interpreter's teardown, would walk them again, though they
    live as long as the command (measured on a 1B-shaped diff: 0.3-0.5 s of
    3.5 s). Freezing also keeps whatever garbage exists at that moment, which
    in a command's own process is a few objects of option parsing. The
    library only pauses the collector while its caches rebuild a long run
    (`ckptscan.system.collector`), and freezes what they rebuilt only here."""
    if not _own_process:
        return
    import gc

    gc.disable()
    try:
        import ckptscan.pipeline.api  # noqa: F401  (imports torch)
    finally:
        gc.enable()
    gc.freeze()
