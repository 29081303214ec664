"""The cyclic garbage collector around a burst of long-lived objects.

A cached re-run of a long trend rebuilds ~5·10⁵ result objects from the
caches' packs (`ckptscan.caches`), and they live until the command ends. The
collector would walk them in each of its next passes, young and old (at
2,000 pairs × 16 layers: 0.34 s of collections, bench/long_run.py), and
none of them can be freed by it: rebuilt results hold no reference cycles.
So it is paused while they are made; and in the command's own process
(`ckptscan.cli.process.claim_process`), where nothing outlives the command,
what exists then is frozen (`gc.freeze`: the collector no longer walks it;
reference counts still free it, and only a cycle of garbage present at that
moment stays until the command ends). Not in `ckptscan watch`, which
outlives each look, nor elsewhere (a notebook, a test, live mode in a
training process): there the collector is left as it was.
"""

from __future__ import annotations

import contextlib
import gc
from typing import Iterator

# Set by the console script for the command's own process only.
freeze_rebuilt = False


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """The collector off while many cache entries are rebuilt, then as it
    was (and what was rebuilt frozen, in the command's own process)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if freeze_rebuilt:
            gc.freeze()
        if enabled:
            gc.enable()
