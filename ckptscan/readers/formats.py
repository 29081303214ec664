"""The registry of checkpoint formats: every format ckptscan can open, in the
order it is tried.

A new format is one module declaring its `Format` (how it is recognised, how
it is opened), one line in `FORMATS`, and one test; add it to `EXPECTED`
too, so that the message for an unrecognised path names it.
"""

from __future__ import annotations

from pathlib import Path

from ckptscan.readers import megatron, orbax, safetensors, torch_pickle
from ckptscan.readers.base import DCP_METADATA_FILE, Checkpoint, Format
from ckptscan.readers.sidecars import read_config
from ckptscan.readers.steps import step_from_name
from ckptscan.storage import RemotePath


def _metadata_file(path: Path | RemotePath) -> Path | RemotePath | None:
    return path.parent if path.name == DCP_METADATA_FILE else None


def _metadata_in(folder: Path | RemotePath) -> Path | RemotePath | None:
    return folder if (folder / DCP_METADATA_FILE).is_file() else None


def _open_dcp(directory: Path | RemotePath) -> Checkpoint:
    from ckptscan.readers import dcp  # imports torch.distributed.checkpoint (~1 s): only for DCP

    source, meta, files = dcp.open_dcp(directory)
    step = step_from_name(directory.name)
    if step is None:
        step = step_from_name(directory.parent.name)
    config = read_config(directory / "config.json")
    if megatron.is_torch_dist(directory):
        stacked, megatron_meta = megatron.open_torch_dist(source)
        return Checkpoint(directory, "megatron-torch_dist", step, stacked, config, files, {**meta, **megatron_meta})
    return Checkpoint(directory, "dcp", step, source, config, files, meta)


# Declared here rather than in `dcp`, which imports torch.distributed.checkpoint
# (~1 s): that import is paid only when a DCP folder is opened. Megatron's
# `torch_dist` is a DCP folder with a `metadata.json` saying so.
DCP = Format("dcp", _open_dcp, in_file=_metadata_file, in_folder=_metadata_in, nests=True)

# Recognition order: the first format that recognises a path opens it, so this
# order IS the precedence, and it is the one ckptscan has always had. In a
# folder: a safetensors index, then safetensors files, a .bin index, DCP
# `.metadata`, Megatron rank folders, DeepSpeed's rank-0 file, a torch model
# file by name, an Orbax item. (A file the user names matches at most one of
# these, except a Megatron rank file, which is also a `.pt`: Megatron first.)
FORMATS: list[Format] = [
    safetensors.INDEXED,
    safetensors.FILE,
    safetensors.SHARDS,
    torch_pickle.INDEXED,
    DCP,
    megatron.LEGACY,
    torch_pickle.DEEPSPEED,
    torch_pickle.PICKLE,
    orbax.ORBAX,
]

EXPECTED = ("*.safetensors (+ *.safetensors.index.json), pytorch_model.bin (+ index), a .pt/.pth file "
            "(nanoGPT ckpt.pt, ...), a DCP directory (.metadata + *.distcp), a Megatron iter_NNNNNNN directory "
            "(mp_rank_XX/model_optim_rng.pt), a DeepSpeed global_stepN directory (mp_rank_00_model_states.pt) or an "
            "Orbax step directory (_CHECKPOINT_METADATA + an item with _METADATA)")


def recognise(path: Path | RemotePath, folder: bool) -> tuple[Format, Path | RemotePath] | None:
    """The first format that recognises `path` (a folder, or a file), and
    the path it opens; None when none does."""
    for known in FORMATS:
        recogniser = known.in_folder if folder else known.in_file
        if recogniser is not None and (target := recogniser(path)) is not None:
            return known, target
    return None
