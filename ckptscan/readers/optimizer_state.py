"""Adam's second moments of named tensors, where a checkpoint keeps them
under the parameter's name: a torch DCP save of
`get_optimizer_state_dict(model, optimizer,
options=StateDictOptions(flatten_optimizer_state_dict=True))` beside the
model (torchtitan's `optimizer` entry, OLMo-core's `optim`), whose keys are

    <prefix>.state.<fqn>.exp_avg_sq          the tensor (same shape as the weight)
    <prefix>.param_groups.<fqn>.eps          its group's ε (a pickled float)

with <fqn> the parameter's module path: the model's stored key without the
wrapper prefix the reader removed (`key_prefix`). Only those two entries of
the asked tensors are read, never the rest of the optimizer state.

Not read: an HF Trainer / DeepSpeed `optimizer.pt`, whose `state` is keyed by
the parameter's position in the optimizer's groups — mapping a position back
to a name would be a guess about the order the parameters were given in."""

from __future__ import annotations

import io
import math

import torch

from ckptscan.errors import CkptScanError
from ckptscan.readers.base import DCP_METADATA_FILE, Checkpoint
from ckptscan.readers.torch_pickle import load_pickle

OPTIMIZER_PREFIXES = ("optimizer.", "optim.")
MOMENT = "exp_avg_sq"
POSITIONAL = "optimizer.pt"
NOT_BY_NAME = f"not read: {POSITIONAL} indexes parameters by position"
NONE_SAVED = "not read: the checkpoints hold no optimizer state by parameter name"


def moment_keys(checkpoint: Checkpoint, name: str) -> tuple[str, str] | None:
    """The stored keys of tensor `name`'s second moment and its group's ε,
    or None where the checkpoint keeps no such pair."""
    if checkpoint.format != "dcp":  # before importing torch.distributed.checkpoint (~1 s), as formats.py does
        return None
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, TensorStorageMetadata

    from ckptscan.readers.dcp import DcpSource

    source = checkpoint.tensors
    if not isinstance(source, DcpSource) or name not in source.names:
        return None
    fqn = source.names[name][len(checkpoint.meta.get("key_prefix", "")):]
    entries = source.metadata.state_dict_metadata
    for prefix in OPTIMIZER_PREFIXES:
        moment, eps = f"{prefix}state.{fqn}.{MOMENT}", f"{prefix}param_groups.{fqn}.eps"
        if isinstance(entries.get(moment), TensorStorageMetadata) and isinstance(entries.get(eps),
                                                                                 BytesStorageMetadata):
            return moment, eps
    return None


def second_moment(checkpoint: Checkpoint, name: str) -> tuple[torch.Tensor, float] | None:
    """(v, ε) of tensor `name`: its saved exp_avg_sq and its group's eps; None
    where the checkpoint does not keep them by name. A moment of another
    shape than the weight, a negative or non-finite v, or an ε that is no
    positive number is an error naming the tensor."""
    keys = moment_keys(checkpoint, name)
    if keys is None:
        return None
    from ckptscan.readers.dcp import DcpSource

    moment_key, eps_key = keys
    source = checkpoint.tensors
    assert isinstance(source, DcpSource)  # moment_keys found them in one
    where = source.directory / DCP_METADATA_FILE
    eps = load_pickle(io.BytesIO(source.read_bytes(eps_key)), where=where)
    if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) or eps <= 0:
        raise CkptScanError(f"the optimizer's eps is {eps!r}, expected a positive number", path=source.directory,
                            tensor=eps_key)
    v = DcpSource(source.directory, source.metadata, {moment_key: moment_key}).get(moment_key)
    if tuple(v.shape) != source.shape(name):
        raise CkptScanError(f"the second moment's shape {list(v.shape)} is not its weight's "
                            f"{list(source.shape(name))}", path=source.directory, tensor=moment_key)
    if not bool(torch.isfinite(v).all()) or bool((v < 0).any()):
        raise CkptScanError("the second moment has negative or non-finite values (a corrupt optimizer state)",
                            path=source.directory, tensor=moment_key)
    return v, float(eps)


def unread_reason(checkpoint: Checkpoint) -> str:
    """Why a checkpoint's optimizer state gave no moments, in one line."""
    folder = checkpoint.path if checkpoint.path.is_dir() else checkpoint.path.parent
    return NOT_BY_NAME if (folder / POSITIONAL).is_file() else NONE_SAVED
