"""What ckptscan sees in a checkpoint or a run directory, as plain data.

For a checkpoint: its format, step and files, the model family and head
geometry with where each number came from, and per layer the exact tensors a
scan reads, with their roles, shapes and stored dtypes. For a run directory:
the checkpoints in step order, what was skipped and why, and the newest
checkpoint described as above, and the run's side files named as what they
are (the probe, the loss log, a framework's pointer file), never taken for a
checkpoint. When no layout fits, the description still
holds the format and the checkpoint's tensor-name patterns (layer numbers as
N), which is what a `--tensor-map` is written from.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from pathlib import Path
from typing import Any, Sequence

from ckptscan.pipeline.discovery import POINTERS, discover_run, looks_like_run
from ckptscan.errors import CkptScanError
from ckptscan.layouts import HeadOverrides, TensorMap, resolve_layout
from ckptscan.readers import Checkpoint, open_checkpoint
from ckptscan.readers.formats import DCP, recognise
from ckptscan.readers.megatron import LEGACY
from ckptscan.storage import RemotePath, as_path

# Metadata worth showing; `args` and the like are too large to print whole.
SHOWN_META = ("key_prefix", "checkpoint_version", "tensor_parallel", "pipeline_parallel", "expert_parallel",
              "stacked_layers", "sharded_backend", "iteration", "iter_num", "lr", "lr_source")
# Files a run directory carries beside its checkpoints, and what each one is. A
# probe is a safetensors file: opened alone it would pass for a tiny checkpoint.
SIDE_FILES = {
    "probe.safetensors": "the probe: the inputs routed at every checkpoint (routing entropy, expert load), not a "
                         "checkpoint",
    "train_log.jsonl": "the loss log: the loss per step (lead time, LR warm-up), not a checkpoint",
    **{name: "a pointer: the framework's name for the newest complete checkpoint" for name in POINTERS},
}
_LAYER_NUMBER = re.compile(r"(?<=\.)\d+(?=\.)|^\d+(?=\.)")


def inspect_path(
    path: str | Path | RemotePath,
    overrides: HeadOverrides = HeadOverrides(),
    tensor_map: TensorMap | None = None,
    layers: Sequence[int] | None = None,
) -> dict[str, Any]:
    """Describe a checkpoint, or a run directory of checkpoints.

    A path that opens as a checkpoint is one; otherwise a directory with
    step-named entries is a run. A folder that can only be one checkpoint
    (`is_one_checkpoint`) is not tried as a run when it does not open: its
    own error is what the user needs, not that of a file inside it.
    `layers` limits the per-layer listing.
    """
    where = as_path(path)
    try:
        checkpoint = open_checkpoint(where)
    except CkptScanError:
        if not looks_like_run(where) or is_one_checkpoint(where):
            raise
        return describe_run(where, overrides, tensor_map, layers)
    if looks_like_run(where) and all(f.name in SIDE_FILES for f in checkpoint.files):
        # What opened is a run's side file (its probe), not a checkpoint of the run.
        return describe_run(where, overrides, tensor_map, layers)
    return {"path": str(where), "kind": "checkpoint",
            "checkpoint": describe_checkpoint(checkpoint, overrides, tensor_map, layers)}


def describe_run(
    path: Path | RemotePath,
    overrides: HeadOverrides = HeadOverrides(),
    tensor_map: TensorMap | None = None,
    layers: Sequence[int] | None = None,
) -> dict[str, Any]:
    """A run directory: its checkpoints in step order, what was skipped, its
    side files, and the newest checkpoint described."""
    run = discover_run(path)
    return {
        "path": str(path),
        "kind": "run",
        "run": {
            "checkpoints": [{"step": c.step, "path": str(c.path), "format": c.format} for c in run.checkpoints],
            "notes": run.notes,
            "skipped": run.skipped,
            "side_files": side_files(path),
        },
        "checkpoint": describe_checkpoint(run.checkpoints[-1], overrides, tensor_map, layers),
    }


def side_files(path: Path | RemotePath) -> list[dict[str, str]]:
    """The known side files directly in a run directory, each with what it is."""
    entries: list[Path | RemotePath] = sorted(path.iterdir(), key=lambda e: e.name)
    return [{"path": str(entry), "role": SIDE_FILES[entry.name]}
            for entry in entries if entry.name in SIDE_FILES and entry.is_file()]


def is_one_checkpoint(path: Path | RemotePath) -> bool:
    """A DCP folder (`.metadata`, which Megatron's torch_dist is too) or a
    Megatron iteration folder of `mp_rank_*` shards: its files (common.pt, a
    rank's model_optim_rng.pt) are parts of one checkpoint, never a run's."""
    if not path.is_dir():
        return False
    recognised = recognise(path, folder=True)
    return recognised is not None and recognised[0] in (DCP, LEGACY) and recognised[1] == path


def describe_checkpoint(
    checkpoint: Checkpoint,
    overrides: HeadOverrides = HeadOverrides(),
    tensor_map: TensorMap | None = None,
    layers: Sequence[int] | None = None,
) -> dict[str, Any]:
    tensors = checkpoint.tensors
    out: dict[str, Any] = {
        "path": str(checkpoint.path),
        "format": checkpoint.format,
        "step": checkpoint.step,
        "files": [str(f) for f in checkpoint.files],
        "num_tensors": len(tensors.keys()),
        "meta": {k: checkpoint.meta[k] for k in SHOWN_META if isinstance(checkpoint.meta.get(k), (int, float, str))},
        "config_model_type": (checkpoint.config or {}).get("model_type"),
    }
    if checkpoint.meta.get("omitted"):
        out["meta"]["omitted_tensors"] = len(checkpoint.meta["omitted"])
    try:
        layout = resolve_layout(checkpoint, overrides, tensor_map)
    except CkptScanError as e:
        out["error"] = str(e)
        out["name_patterns"] = name_patterns(tensors.keys())
        return out
    wanted = set(layers) if layers is not None else None
    out["model"] = dataclasses.asdict(layout.info)
    out["notes"] = list(layout.notes)
    out["layers"] = [
        {
            "layer": plan.layer,
            "tensors": [
                {"name": name, "role": plan.roles.get(name, ""), "shape": list(tensors.shape(name)),
                 "dtype": tensors.dtype(name)}
                for name in plan.tensors
            ],
        }
        for plan in layout.layers
        if wanted is None or plan.layer in wanted
    ]
    return out


def name_patterns(keys: Sequence[str]) -> list[dict[str, Any]]:
    """Tensor names with layer numbers replaced by N, and how many names each covers."""
    counts = Counter(_LAYER_NUMBER.sub("N", key) for key in keys)
    return [{"pattern": pattern, "count": count} for pattern, count in sorted(counts.items())]
