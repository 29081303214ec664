"""What every reader returns: a `TensorSource` inside a `Checkpoint`."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from ckptscan.readers.safetensors import DTYPES

# The file that marks a torch.distributed.checkpoint directory.
DCP_METADATA_FILE = ".metadata"

# torch dtype -> the safetensors dtype string every source reports.
DTYPE_NAMES: dict[torch.dtype, str] = {dtype: name for name, dtype in DTYPES.items()}


def dtype_name(dtype: torch.dtype) -> str:
    return DTYPE_NAMES.get(dtype, str(dtype).removeprefix("torch."))


class TensorSource(Protocol):
    """Named tensors, read one at a time.

    `dtype` is the dtype stored on disk; `get` returns that dtype, except for
    FP8 weights with block scales, which come back dequantised as float32.
    `rows=(lo, hi)` reads only rows lo:hi of the first dimension.
    """

    def keys(self) -> list[str]: ...

    def shape(self, name: str) -> tuple[int, ...]: ...

    def dtype(self, name: str) -> str: ...

    def get(self, name: str, rows: tuple[int, int] | None = None) -> torch.Tensor: ...


@dataclass
class Checkpoint:
    """A checkpoint on disk: where it is, which step, its config, its tensors.

    `config` is a Hugging Face `config.json` when there is one. `meta` holds
    what training frameworks store next to the weights, under the names they
    use: `args` (Megatron's argparse namespace, as a dict), `model_args`
    (nanoGPT), `iteration` / `iter_num` / `global_steps`,
    `checkpoint_version` (Megatron), `tensor_parallel`,
    `pipeline_parallel`, `expert_parallel` (Megatron shards merged),
    `sharded_backend` and `stacked_layers`
    (Megatron torch_dist), `key_prefix` (a wrapper prefix removed from the
    keys), `omitted` (tensors present on disk but not exposed, and why).
    """

    path: Path
    format: str
    step: int | None
    tensors: TensorSource
    config: dict[str, Any] | None = None
    files: list[Path] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
