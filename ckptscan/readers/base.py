"""What every reader returns, a `TensorSource` inside a `Checkpoint`, and
what every format declares, a `Format`: how it is recognised and opened."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Protocol

import torch

if TYPE_CHECKING:  # a URL's path; importing the stores at run time is not needed here
    from ckptscan.storage.remote_path import RemotePath

# safetensors dtype -> torch attribute. Types this torch lacks (the unsigned
# ones before 2.3) are left out, so reading them is a clear "unknown dtype"
# error instead of an import failure.
_TORCH_ATTRIBUTES = {
    "BOOL": "bool",
    "U8": "uint8",
    "I8": "int8",
    "I16": "int16",
    "I32": "int32",
    "I64": "int64",
    "F16": "float16",
    "BF16": "bfloat16",
    "F32": "float32",
    "F64": "float64",
    "F8_E4M3": "float8_e4m3fn",
    "F8_E5M2": "float8_e5m2",
    "U16": "uint16",
    "U32": "uint32",
    "U64": "uint64",
}
DTYPES: dict[str, torch.dtype] = {
    name: getattr(torch, attr) for name, attr in _TORCH_ATTRIBUTES.items() if hasattr(torch, attr)
}

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

    path: Path | RemotePath
    format: str
    step: int | None
    tensors: TensorSource
    config: dict[str, Any] | None = None
    files: list[Path | RemotePath] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    # Its identity in the pair cache (`cache.checkpoint_identity`), where it is
    # already known: a checkpoint unchanged since it was recorded (`ckptscan.pipeline.opened`).
    identity: dict[str, Any] | None = None


@dataclass(frozen=True)
class Format:
    """A checkpoint format as the registry (`readers.formats.FORMATS`) knows it.

    `in_file` is asked about a file the user named, `in_folder` about a
    folder; either answers with the path `open` takes (the path itself, the
    index or item inside a folder, a rank file's iteration folder), or None
    when the path is not in this format. A format found only as a file or
    only as a folder leaves the other None. A recogniser only looks (names,
    markers, listings); `open` reads. `nests`: also found one level down, in
    a folder that wraps it (OLMo-core `stepN/model_and_optim/`, HF FSDP
    `pytorch_model_fsdp_0/`, DeepSpeed `checkpoint-N/global_stepN/`); its
    `in_folder` must then be a cheap marker check that never raises.
    """

    name: str
    open: Callable[[Path | RemotePath], Checkpoint]
    in_file: Callable[[Path | RemotePath], Path | RemotePath | None] | None = None
    in_folder: Callable[[Path | RemotePath], Path | RemotePath | None] | None = None
    nests: bool = False
