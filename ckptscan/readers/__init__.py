"""Readers: bytes on disk -> named tensors, read lazily one tensor at a time.

Every format is exposed through the same tiny surface (`TensorSource`):
`keys()`, `shape(name)`, `dtype(name)`, `get(name, rows=None)`. A
`Checkpoint` bundles that with the checkpoint's path, step, config and the
training framework's metadata. `open_checkpoint` recognises safetensors
(single, sharded), torch pickles (HF `.bin` and its index, nanoGPT,
DeepSpeed, plain `.pt`/`.pth`), Megatron (legacy shards and `torch_dist`),
torch.distributed.checkpoint directories and Orbax, each a `Format` in the
registry (`readers.formats.FORMATS`). Readers never write, and never execute
code from a checkpoint.
"""

from ckptscan.readers.base import Checkpoint, Format, TensorSource
from ckptscan.readers.formats import EXPECTED, FORMATS
from ckptscan.readers.opening import (ACCELERATE_CUSTOM, CUSTOM_STEP_KEYS, META_STEPS, OLMO_CORE_DONE,
                                      OLMO_CORE_MODEL_DIR, OPEN_CONCURRENCY, open_checkpoint, open_checkpoints,
                                      open_each)
from ckptscan.readers.safetensors import SHARD_NAME, SafetensorsSource
from ckptscan.readers.steps import STEP_PATTERNS, step_from_name
from ckptscan.readers.torch_pickle import DEEPSPEED_MODEL_FILE, LITGPT_CONFIG, TORCH_MODEL_FILES

__all__ = ["FORMATS", "Checkpoint", "Format", "SafetensorsSource", "TensorSource", "open_checkpoint",
           "open_checkpoints", "open_each", "step_from_name"]
