"""One live pair through the scan core, on whichever thread calls it,
changing no setting of the training process.

`ckptscan trend` runs the scan's layer tasks under `LocalExecutor`, which
sets torch's thread count and the float32 matmul precision for the duration
(`system.parallel`). Both are the trainer's, and the float32 matmul
precision is process-wide (`torch.set_float32_matmul_precision` writes one
global): set from live mode's background thread it would switch TF32 off
under the training steps that run meanwhile, and restoring it could undo a
change the trainer made in between. So a live scan runs its layer tasks in
order on its own thread (`ThisThread`) and sets nothing:

* threads: torch's intra-op thread count is kept per thread (OpenMP); a
  thread that never sets it starts from the process's, the trainer's.
* precision: the scan runs on the CPU (live snapshots are host copies), so
  only the CPU's float32 matmul precision counts; a trainer's CUDA TF32
  (`torch.backends.cuda.matmul.allow_tf32`, `...fp32_precision`) does not
  touch it. Where the trainer has lowered it (the legacy
  `torch.set_float32_matmul_precision("high"/"medium")` lowers the CPU's
  too), the pair's Gram products are computed in float64 instead: exact, as
  `trend --precision float64` gives them, never at a reduced precision. A
  change of setting during the scan is checked for after it, and the pair is
  then computed again in float64.
"""

from __future__ import annotations

import threading
from dataclasses import replace
from typing import Callable, Iterator, Sequence, TypeVar

import torch

from ckptscan.inputs.probe import Probe
from ckptscan.layouts import ModelInfo
from ckptscan.readers import Checkpoint
from ckptscan.scan import ScanOptions, scan_layers
from ckptscan.schema.results import LayerResult

T = TypeVar("T")
R = TypeVar("R")


class ThisThread:
    """A scan executor that runs every layer task in order on the calling thread."""

    def group(self, layers: Sequence[int]) -> list[list[int]]:
        return [[layer] for layer in layers]

    def map(self, fn: Callable[[T, threading.Event], R], items: Sequence[T]) -> Iterator[tuple[int, R]]:
        stop = threading.Event()  # never set: the caller reads every result
        for position, item in enumerate(items):
            yield position, fn(item, stop)

    def close(self) -> None:
        """Nothing was started."""


def cpu_float32_exact() -> bool:
    """Whether float32 matmuls on the CPU run in full float32 now."""
    try:
        precision = torch.backends.mkldnn.matmul.fp32_precision  # torch ≥ 2.9: the CPU's own setting
    except AttributeError:
        return torch.get_float32_matmul_precision() == "highest"
    return precision in ("ieee", "none")


def scan_pair(older: Checkpoint, newer: Checkpoint, options: ScanOptions,
              probe: Probe | None) -> tuple[ModelInfo, list[LayerResult], bool]:
    """(model, the pair's layer results, whether its Grams were computed in
    float64 because the CPU's float32 matmul precision was lowered)."""
    widened = False
    while True:
        use = options
        if options.compute_dtype == torch.float32 and (widened or not cpu_float32_exact()):
            use, widened = replace(options, compute_dtype=torch.float64), True
        model, (layers,) = scan_layers([older, newer], [(0, 1)], use, probe, executor=ThisThread())
        if use.compute_dtype != torch.float32 or cpu_float32_exact():
            return model, layers, widened
        widened = True  # lowered while the scan ran: again, in float64
