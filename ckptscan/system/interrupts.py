"""SIGTERM ends a command the way Ctrl-C does.

Schedulers and containers stop a job with SIGTERM (`docker stop`, Kubernetes,
Slurm before its SIGKILL, `timeout`). Python's default is to die on the spot,
and as a container's PID 1 not to die at all; either way no one is told what
happened. Raising `Terminated` (a KeyboardInterrupt) instead takes the one
path Ctrl-C takes: workers are told to stop, an atomic write in progress
removes its temp file, the report and cache stay as they were or whole, and
the command exits 130 with one line.

A signal the parent asked to be ignored stays ignored: a shell starts the
background jobs of a script with SIGINT ignored, so that Ctrl-C at the
terminal stops the script and not its jobs (Python keeps that too), and
`nohup`-style launchers may do the same with SIGTERM.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from types import FrameType
from typing import Iterator


class Terminated(KeyboardInterrupt):
    """SIGTERM arrived: handled exactly as Ctrl-C."""


def _raise_terminated(signum: int, frame: FrameType | None) -> None:
    raise Terminated()


@contextlib.contextmanager
def terminate_like_ctrl_c() -> Iterator[None]:
    """Within the block, SIGTERM raises `Terminated` in the main thread; the
    previous handler is restored after (the CLI also runs inside test
    processes and notebooks)."""
    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set handlers; signals land there anyway
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous == signal.SIG_IGN:
        yield
        return
    signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
