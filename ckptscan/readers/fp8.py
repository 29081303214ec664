"""FP8 weights with block scales (DeepSeek-V3 releases), dequantised on read.

An FP8 weight `W` [out, in] is stored with an F32 tensor `W_scale_inv`
(for a module `m`: `m.weight` and `m.weight_scale_inv`) holding one scale
per block of `weight_block_size` = [128, 128] elements; the last block of a
row or column may be smaller. The real value is `W[i, j] * scale[i // 128,
j // 128]` (DeepSeek-V3 `inference/kernel.py` `weight_dequant`: y = x * s).
Reading the raw FP8 codes without their scales would be silently wrong, so
an FP8 tensor with no scale is refused.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Callable

import torch

from ckptscan.errors import CkptScanError
from ckptscan.readers.base import TensorSource
from ckptscan.storage import RemotePath

FP8_DTYPES = ("F8_E4M3", "F8_E5M2")
SCALE_SUFFIX = "_scale_inv"
DEFAULT_BLOCK = (128, 128)


def has_block_scaled_fp8(source: TensorSource) -> bool:
    keys = set(source.keys())
    # Names first: asking a dtype may load a shard.
    return any(k + SCALE_SUFFIX in keys and source.dtype(k) in FP8_DTYPES for k in keys)


def block_size(config: dict[str, Any] | None, path: Path | RemotePath) -> tuple[int, int]:
    """`quantization_config.weight_block_size` from the config.json of the
    checkpoint at `path`, else 128x128."""
    block = ((config or {}).get("quantization_config") or {}).get("weight_block_size")
    if block is None:
        return DEFAULT_BLOCK
    if not (isinstance(block, list) and len(block) == 2 and all(isinstance(b, int) and b > 0 for b in block)):
        raise CkptScanError(f"config.json 'quantization_config.weight_block_size' must be two positive integers, "
                            f"got {block!r}", path=path)
    return block[0], block[1]


def dequantize_blocks(q: torch.Tensor, scale: torch.Tensor, block: tuple[int, int], first_row: int = 0) -> torch.Tensor:
    """float32 values of FP8 codes `q` (rows first_row.. of the full weight)
    given the scale rows covering them (scale row 0 = block first_row // br)."""
    br, bc = block
    row_block = torch.arange(first_row, first_row + q.shape[0]) // br - first_row // br
    col_block = torch.arange(q.shape[1]) // bc
    return q.to(torch.float32) * scale.to(torch.float32)[row_block][:, col_block]


class BlockFp8Source:
    """Wraps a source; FP8 tensors that have `<name>_scale_inv` come back as
    dequantised float32. Every other tensor (the scales too) passes through."""

    def __init__(self, source: TensorSource, block: tuple[int, int], path: Path | RemotePath):
        self.source = source
        self.block = block
        self.path = path
        self._keys = set(source.keys())

    def keys(self) -> list[str]:
        return self.source.keys()

    def shape(self, name: str) -> tuple[int, ...]:
        return self.source.shape(name)

    def dtype(self, name: str) -> str:
        return self.source.dtype(name)

    def get(self, name: str, rows: tuple[int, int] | None = None) -> torch.Tensor:
        if self.source.dtype(name) not in FP8_DTYPES:
            return self.source.get(name, rows)
        scale_name = name + SCALE_SUFFIX
        if scale_name not in self._keys:
            raise CkptScanError(f"FP8 tensor without a '{scale_name}' block-scale tensor: its values cannot be "
                                "dequantised", path=self.path, tensor=name)
        shape, scale_shape = self.source.shape(name), self.source.shape(scale_name)
        br, bc = self.block
        if len(shape) != 2 or scale_shape != (math.ceil(shape[0] / br), math.ceil(shape[1] / bc)):
            raise CkptScanError(f"FP8 weight of shape {list(shape)} needs block scales of shape "
                                f"[{math.ceil(shape[0] / br) if shape else '?'}, "
                                f"{math.ceil(shape[1] / bc) if len(shape) > 1 else '?'}] for {br}x{bc} blocks, "
                                f"but '{scale_name}' is {list(scale_shape)}", path=self.path, tensor=name)
        lo, hi = rows if rows is not None else (0, shape[0])
        q = self.source.get(name, rows)
        if hi <= lo:
            return q.to(torch.float32)
        scale = self.source.get(scale_name, self._scale_rows(shape, rows))
        return dequantize_blocks(q, scale, self.block, first_row=lo)

    def _scale_rows(self, shape: tuple[int, ...], rows: tuple[int, int] | None) -> tuple[int, int]:
        """The rows of the scale tensor that cover `rows` of the weight."""
        lo, hi = rows if rows is not None else (0, shape[0])
        return lo // self.block[0], math.ceil(hi / self.block[0])

    def prefetch(self, wanted: list[tuple[str, tuple[int, int] | None]]) -> Callable[[], None] | None:
        """The wrapped source's prefetch (object storage) of these reads and
        of the scale rows each FP8 weight's read will need, in the same
        batch; None when the source reads only when asked (local files)."""
        prefetch = getattr(self.source, "prefetch", None)
        if prefetch is None:
            return None
        scales = [(name + SCALE_SUFFIX, self._scale_rows(self.source.shape(name), rows)) for name, rows in wanted
                  if name + SCALE_SUFFIX in self._keys and self.source.dtype(name) in FP8_DTYPES
                  and len(self.source.shape(name)) == 2 and (rows is None or rows[1] > rows[0])]
        return prefetch([*wanted, *scales])
