"""Megatron-LM checkpoints: legacy `torch` format and `torch_dist`.

Legacy (`--ckpt-format torch`): `iter_NNNNNNN/mp_rank_{tp:02d}[_{pp:03d}][_{ep:03d}]/
model_optim_rng.pt` (`megatron/training/checkpointing.py` `get_checkpoint_name`;
the pp suffix exists only when pipeline parallel size > 1, the ep suffix only
when expert parallel size > 1). Each file holds `args`, `checkpoint_version`,
`iteration` and `model` (or `model0`, `model1`, ... for virtual pipeline
chunks), with layers numbered locally inside each chunk
(`transformer_block.py`: `layers.{global - offset}`).

We merge the shards into one view of the global model:
- pipeline: chunks are ordered (virtual stage, pipeline rank), as Megatron's
  `get_transformer_layer_offset` assigns layers; each chunk's local layer
  numbers are shifted by the layers of the chunks before it (counted from
  the files, so uneven first/last stages work too). A name held by two
  stages (tied embeddings on first and last) is taken from the first.
- tensor parallel: `linear_qkv` / `query_key_value` (and MLA `linear_q_proj`,
  `linear_q_up_proj`, `linear_kv_up_proj`) are column-parallel, so the global
  weight is the rank shards concatenated along dim 0 in rank order; each
  shard holds whole query groups, so this is exact. Norms and the MoE router
  are replicated and taken from rank 0. Any other tensor is TP-sharded in a
  way we do not merge, so with TP > 1 it is omitted (listed in meta).
- expert parallel: attention and router are replicated across expert ranks;
  with EP > 1 expert weights are omitted and rank 0 is read.

`torch_dist`: a DCP directory with `metadata.json` {"sharded_backend":
"torch_dist"}. TP/PP are already merged; homogeneous layers are stacked as
`decoder.layers.<name>` [L, ...] (`transformer_block.py` sharded_state_dict).
We expose each layer as `decoder.layers.{i}.<name>`, the same names as the
legacy format, reading only that layer's chunks. Common state (`args`,
`iteration`, `opt_param_scheduler`) is `common.pt` or the `common_state` byte
entry; the learning rate is computed from it (`megatron_schedule`).
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ckptscan.errors import CkptScanError
from ckptscan.readers.base import Checkpoint, Format, dtype_name
from ckptscan.readers.bounded import MAX_CONFIG_BYTES, load_json
from ckptscan.readers.megatron_schedule import learning_rate
from ckptscan.readers.sidecars import check_counts
from ckptscan.readers.steps import step_from_name
from ckptscan.readers.torch_pickle import flat_tensors, load_pickle, plain
from ckptscan.storage import RemotePath

if TYPE_CHECKING:  # torch.distributed.checkpoint costs ~1 s to import: only when a DCP is opened
    from ckptscan.readers.dcp import DcpSource

RANK_DIR = re.compile(r"^mp_rank_(\d{2})(?:_(\d{3}))?(?:_(\d{3}))?$")
RANK_FILE = "model_optim_rng.pt"
MODEL_KEY = re.compile(r"^model(\d*)$")
# Local layer index of the transformer stack (Megatron-Core and legacy model).
LAYER = re.compile(r"^(decoder\.layers\.|language_model\.encoder\.layers\.)(\d+)\.")
COLUMN_PARALLEL = re.compile(r"(linear_qkv|query_key_value|linear_q_proj|linear_q_up_proj|linear_kv_up_proj)"
                             r"\.(weight|bias)$")
REPLICATED = re.compile(r"(layernorm\.(weight|bias)|layer_norm_(weight|bias)|norm\.(weight|bias)"
                        r"|router\.(weight|bias|expert_bias))$")
EXPERTS = re.compile(r"\.experts\.")
COMMON_STATE_KEY = "common_state/shard_0_1"  # ShardedObject("common_state", ..., (1,), (0,)).unique_key
COMMON_FILE = "common.pt"  # torch_dist's state that is not sharded (args, iteration, scheduler)


def is_legacy_dir(directory: Path | RemotePath) -> bool:
    return any(RANK_DIR.match(d.name) and (d / RANK_FILE).is_file() for d in directory.iterdir() if d.is_dir())


def is_torch_dist(directory: Path | RemotePath) -> bool:
    config = directory / "metadata.json"
    if not config.is_file():
        return False
    try:
        return load_json(config, MAX_CONFIG_BYTES, "metadata.json").get("sharded_backend") == "torch_dist"
    except (CkptScanError, AttributeError):
        return False


def meta_from(common: dict[str, Any], where: str | Path | RemotePath, held_in: str) -> dict[str, Any]:
    """`args`, `iteration`, `checkpoint_version` and the learning rate
    (`lr`, `lr_source`) of Megatron's common state, read from `where`."""
    meta: dict[str, Any] = {k: plain(common[k]) for k in ("args", "iteration", "checkpoint_version") if k in common}
    if meta.get("args") is not None and not isinstance(meta["args"], dict):
        meta.pop("args")
    if "args" in meta:
        check_counts(meta["args"], where, "args.")
    lr = learning_rate(common, meta.get("args") or {}, where, held_in)
    if lr is not None:
        meta["lr"], meta["lr_source"] = lr
    return meta


@dataclass
class _Merged:
    """One global tensor: shards to concatenate along dim 0 (one when replicated)."""

    shards: list[torch.Tensor]
    file: Path | RemotePath


class MegatronLegacySource:
    def __init__(self, tensors: dict[str, _Merged], where: Path | RemotePath):
        self.tensors = tensors
        self.where = where

    def keys(self) -> list[str]:
        return list(self.tensors)

    def _merged(self, name: str) -> _Merged:
        if name not in self.tensors:
            raise CkptScanError("no such tensor in this checkpoint", path=self.where, tensor=name)
        return self.tensors[name]

    def shape(self, name: str) -> tuple[int, ...]:
        shards = self._merged(name).shards
        return (sum(s.shape[0] for s in shards), *shards[0].shape[1:]) if len(shards) > 1 else tuple(shards[0].shape)

    def dtype(self, name: str) -> str:
        return dtype_name(self._merged(name).shards[0].dtype)

    def get(self, name: str, rows: tuple[int, int] | None = None) -> torch.Tensor:
        merged = self._merged(name)
        shape = self.shape(name)
        lo, hi = rows if rows is not None else (0, shape[0] if shape else 0)
        if rows is not None and (not shape or not 0 <= lo <= hi <= shape[0]):
            raise CkptScanError(f"rows {lo}:{hi} out of range for shape {list(shape)}", path=merged.file,
                                tensor=name)
        if not shape:
            return merged.shards[0].clone()
        parts, start = [], 0
        for shard in merged.shards:
            stop = start + shard.shape[0]
            if start < hi and lo < stop:
                parts.append(shard[max(lo, start) - start:min(hi, stop) - start])
            start = stop
        return torch.cat(parts) if parts else merged.shards[0][:0].clone()


def _parallel_sizes(args: dict[str, Any], where: Path | RemotePath) -> tuple[int, int, int]:
    def size(key: str) -> int:
        value = args.get(key) or 1
        if not isinstance(value, int) or value < 1:
            raise CkptScanError(f"args.{key} is {value!r}, expected a positive integer", path=where)
        return value

    return (size("tensor_model_parallel_size"), size("pipeline_model_parallel_size"),
            size("expert_model_parallel_size"))


def open_legacy(directory: Path | RemotePath) -> tuple[MegatronLegacySource, dict[str, Any], list[Path | RemotePath]]:
    """An `iter_NNNNNNN/` (or `release/`) directory of `mp_rank_*` shards."""
    rank_dirs = {d.name: d for d in directory.iterdir() if d.is_dir() and RANK_DIR.match(d.name)}
    first = sorted(rank_dirs)[0]
    first_file = rank_dirs[first] / RANK_FILE
    first_state = load_pickle(first_file)
    if not isinstance(first_state, dict):
        raise CkptScanError("not a Megatron checkpoint (expected a dict with 'args' and 'model')", path=first_file)
    meta = meta_from(first_state, first_file, RANK_FILE)
    args = meta.get("args")
    if not isinstance(args, dict):
        raise CkptScanError("Megatron checkpoint without 'args': cannot tell how it is sharded", path=first_file)
    tp, pp, ep = _parallel_sizes(args, first_file)

    def dir_name(t: int, p: int, e: int) -> str:
        return f"mp_rank_{t:02d}" + (f"_{p:03d}" if pp > 1 else "") + (f"_{e:03d}" if ep > 1 else "")

    # Only expert rank 0 is read: attention and router are replicated across expert ranks.
    files: dict[tuple[int, int], Path | RemotePath] = {}
    for p in range(pp):
        for t in range(tp):
            name = dir_name(t, p, 0)
            file = directory / name / RANK_FILE
            if not file.is_file():
                raise CkptScanError(f"missing shard {name}/{RANK_FILE} (args say tensor parallel {tp}, pipeline "
                                    f"parallel {pp}; incomplete checkpoint?)", path=directory)
            files[(t, p)] = file
    states = {key: (first_state if file == first_file else load_pickle(file)) for key, file in files.items()}
    for key, state in states.items():
        if not isinstance(state, dict):
            raise CkptScanError("not a Megatron checkpoint (expected a dict with 'args' and 'model')",
                                path=files[key])

    # Chunks in global layer order: (virtual stage, pipeline rank).
    chunks = {k: m for s in states.values() for k in s if (m := MODEL_KEY.match(k))}
    chunk_keys = sorted(chunks, key=lambda k: int(chunks[k].group(1) or 0))
    if not chunk_keys:
        raise CkptScanError("Megatron checkpoint without a 'model' entry", path=first_file)
    tensors: dict[str, _Merged] = {}
    omitted: dict[str, str] = {}
    offset = 0
    for chunk in chunk_keys:
        for p in range(pp):
            per_rank = [flat_tensors(states[(t, p)].get(chunk), files[(t, p)]) for t in range(tp)]
            local_layers = {int(m.group(2)) for name in per_rank[0] if (m := LAYER.match(name))}
            for name in per_rank[0]:
                # re.sub calls the lambda at once, in this iteration: the loop variable is the one meant.
                global_name = LAYER.sub(lambda m: f"{m.group(1)}{int(m.group(2)) + offset}.", name)  # noqa: B023
                if global_name in tensors or global_name in omitted:
                    continue
                why = _omit_reason(name, tp, ep)
                if why:
                    omitted[global_name] = why
                    continue
                shards = [r[name] for r in per_rank if name in r]
                if len(shards) < len(per_rank):
                    raise CkptScanError("tensor missing from some tensor-parallel shards", path=files[(0, p)],
                                        tensor=name)
                if tp > 1 and not COLUMN_PARALLEL.search(name):
                    shards = shards[:1]
                if len({s.shape[1:] for s in shards}) > 1 or any(s.dim() == 0 for s in shards[1:]):
                    raise CkptScanError("tensor-parallel shards disagree in shape: "
                                        f"{[list(s.shape) for s in shards]}", path=files[(0, p)], tensor=name)
                tensors[global_name] = _Merged(shards, files[(0, p)])
            offset += max(local_layers) + 1 if local_layers else 0
    meta.update(tensor_parallel=tp, pipeline_parallel=pp, expert_parallel=ep)
    if omitted:
        meta["omitted"] = omitted
    return MegatronLegacySource(tensors, directory), meta, list(files.values())


def _omit_reason(name: str, tp: int, ep: int) -> str | None:
    if ep > 1 and EXPERTS.search(name):
        return f"expert weights are split over {ep} expert-parallel ranks"
    if tp > 1 and not (COLUMN_PARALLEL.search(name) or REPLICATED.search(name)):
        return f"split over {tp} tensor-parallel ranks in a way ckptscan does not merge"
    return None


class StackedLayers:
    """Megatron torch_dist's stacked `decoder.layers.<name>` [L, ...] shown as
    per-layer `decoder.layers.{i}.<name>`; each read touches one layer's chunks."""

    PREFIX = "decoder.layers."

    def __init__(self, source: DcpSource):
        self.source = source
        self._views: dict[str, tuple[str, int]] = {}
        self._names: list[str] = []
        self.num_layers = 0
        for name in source.keys():
            rest = name[len(self.PREFIX):] if name.startswith(self.PREFIX) else None
            if rest is None or rest.split(".", 1)[0].isdigit():
                self._names.append(name)
                continue
            layers = source.shape(name)[0] if source.shape(name) else 0
            self.num_layers = max(self.num_layers, layers)
            for i in range(layers):
                view = f"{self.PREFIX}{i}.{rest}"
                self._views[view] = (name, i)
                self._names.append(view)

    def keys(self) -> list[str]:
        return list(self._names)

    def shape(self, name: str) -> tuple[int, ...]:
        if name in self._views:
            return self.source.shape(self._views[name][0])[1:]
        return self.source.shape(name)

    def dtype(self, name: str) -> str:
        return self.source.dtype(self._views[name][0] if name in self._views else name)

    def get(self, name: str, rows: tuple[int, int] | None = None) -> torch.Tensor:
        if name not in self._views:
            return self.source.get(name, rows)
        stacked, layer = self._views[name]
        shape = self.source.shape(stacked)[1:]
        lo, hi = rows if rows is not None else (0, shape[0] if shape else 0)
        if rows is not None and (not shape or not 0 <= lo <= hi <= shape[0]):
            raise CkptScanError(f"rows {lo}:{hi} out of range for shape {list(shape)}",
                                path=self.source.directory, tensor=name)
        if not shape:
            return self.source.read_box(stacked, (layer,), (1,))[0]
        offsets = (layer, lo) + (0,) * (len(shape) - 1)
        return self.source.read_box(stacked, offsets, (1, hi - lo, *shape[1:]))[0]


def open_torch_dist(source: DcpSource) -> tuple[StackedLayers, dict[str, Any]]:
    """Unstacked layers plus `args`/`iteration` from the common state."""
    directory = source.directory
    meta: dict[str, Any] = {"sharded_backend": "torch_dist"}
    where: str | Path | RemotePath
    where, held_in = directory / COMMON_FILE, COMMON_FILE
    if (directory / COMMON_FILE).is_file():
        common = load_pickle(directory / COMMON_FILE)
    elif COMMON_STATE_KEY in source.metadata.state_dict_metadata:
        where, held_in = f"{directory} ({COMMON_STATE_KEY})", f"the {COMMON_STATE_KEY} entry"
        loaded = load_pickle(io.BytesIO(source.read_bytes(COMMON_STATE_KEY)), where=where)
        if isinstance(loaded, io.BytesIO):  # written by a planner that pickles byte entries once more
            loaded = load_pickle(loaded, where=where)
        common = loaded[0] if isinstance(loaded, list) and loaded else loaded
    else:
        common = {}
    if isinstance(common, dict):
        meta.update(meta_from(common, where, held_in))
    stacked = StackedLayers(source)
    if stacked.num_layers:
        meta["stacked_layers"] = stacked.num_layers
    return stacked, meta


def _rank_file(path: Path | RemotePath) -> Path | RemotePath | None:
    """A legacy rank file stands for its whole iteration folder."""
    return path.parent.parent if path.name == RANK_FILE and RANK_DIR.match(path.parent.name) else None


def _legacy_in(folder: Path | RemotePath) -> Path | RemotePath | None:
    return folder if is_legacy_dir(folder) else None


def _open_legacy(directory: Path | RemotePath) -> Checkpoint:
    source, meta, files = open_legacy(directory)
    return Checkpoint(directory, "megatron", step_from_name(directory.name), source, None, files, meta)


# `torch_dist` is a DCP folder: the DCP format opens it (`readers.formats`).
LEGACY = Format("megatron-legacy", _open_legacy, in_file=_rank_file, in_folder=_legacy_in)
