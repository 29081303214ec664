"""A stored 2-D tensor read a chunk of rows at a time, never whole.

The LM head (V × d: 131 MB in bfloat16 at a 1B shape, 2 GiB at 128k × 8k)
is read by the output family's one pass in row order (`monitors.output`).
Holding both checkpoints' heads whole was the largest part of a 1B diff's
memory; read in chunks of CHUNK_BYTES it is a chunk of each. Reads are
sequential and each chunk is one ranged read (object storage: one request),
however small the blocks the pass takes from it. A head that several pairs
read (a trend's checkpoints between the first and the last) is kept as it
is read (`keep`), so that it is read once, as every other tensor is.

The tensor is not checked here: the pass that reads it proves it finite
(its sums are finite exactly when every value is, `FamilySpec.
proves_head_finite`), and only where it does not are its non-finite values
counted (`count_nonfinite`, one more streamed read).
"""

from __future__ import annotations

import threading

import torch

from ckptscan.readers.base import DTYPES, TensorSource

CHUNK_BYTES = 16 << 20


class StoredRows:
    """Rows `rows[lo:hi]` of the stored tensor `name` of `source`, on `device`."""

    def __init__(self, source: TensorSource, name: str, device: str = "cpu", keep: bool = False) -> None:
        self.source, self.name, self.device, self.keep = source, name, device, keep
        self.shape = torch.Size(source.shape(name))
        if len(self.shape) != 2:
            raise ValueError(f"{name}: rows of a 2-D tensor, not of shape {list(self.shape)}")
        self.ndim = 2
        self._lock = threading.Lock()  # one checkpoint's head can serve two pairs' passes
        # (first row, its rows): the last chunk read, or with `keep` every one read so far.
        self._chunks: list[tuple[int, torch.Tensor]] = []

    def __getitem__(self, rows: slice) -> torch.Tensor:
        lo, hi, step = rows.indices(self.shape[0])
        if step != 1:
            raise ValueError("rows are read a block at a time")
        with self._lock:
            held = [(first, chunk) for first, chunk in self._chunks if first <= lo and hi <= first + chunk.shape[0]]
            if held:
                first, chunk = held[0]
            else:
                first = lo
                chunk = self.source.get(self.name, rows=(lo, min(self.shape[0], max(hi, lo + self._chunk_rows()))))
                self._chunks = [*self._chunks, (first, chunk)] if self.keep else [(first, chunk)]
            block = chunk[lo - first:hi - first]
        return block if self.device == "cpu" else block.pin_memory().to(self.device, non_blocking=True)

    def release(self) -> None:
        """Let the chunks held go (a later pass reads again)."""
        with self._lock:
            self._chunks = []

    def count_nonfinite(self) -> int:
        """NaN and ±Inf values in the whole tensor, read a chunk at a time."""
        step, count = self._chunk_rows(), 0
        for lo in range(0, self.shape[0], step):
            chunk = self.source.get(self.name, rows=(lo, min(self.shape[0], lo + step)))
            count += int((~torch.isfinite(chunk)).sum()) if chunk.is_floating_point() else 0
        return count

    def _chunk_rows(self) -> int:
        itemsize = DTYPES.get(self.source.dtype(self.name), torch.float32).itemsize
        return max(1, CHUNK_BYTES // max(1, self.shape[1] * itemsize))
