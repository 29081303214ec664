"""torch.distributed.checkpoint (DCP) directories: `.metadata` + `*.distcp`.

Written by torchtitan (`step-N/`), OLMo-core (`stepN/model_and_optim/`),
Megatron `torch_dist` and HF/Accelerate FSDP. We read them in one process
with no process group, through DCP's own storage reader: keys, shapes and
dtypes come from `.metadata`; a tensor (or a block of its rows) is read by
asking `FileSystemReader.read_data` for exactly the saved chunks that
overlap it (`create_read_items_for_chunk_list`, DCP's resharding planner).

`.metadata` is a pickle, and torch 2.13's `FileSystemReader.read_metadata`
reads it with plain `pickle.load`, which would run any code the file names.
We unpickle it ourselves with an allow-list of DCP's metadata dataclasses
(and the planner's, which Megatron-Core's saves keep in it), torch
dtypes/sizes instead. The chunk data itself is read by DCP with
`torch.load(weights_only=True)`. Byte entries (pickled objects) are never
loaded by DCP's planner; the one we need (Megatron's common state) goes
through our safe torch unpickler.
"""

from __future__ import annotations

import io
import math
import pathlib
import pickle
import threading
from pathlib import Path
from typing import Any, Callable

import torch
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import LoadItemType, LoadPlan, ReadItem, SavePlan
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

from ckptscan.errors import CkptScanError
from ckptscan.readers.base import DCP_METADATA_FILE, dtype_name
from ckptscan.readers.bounded import MAX_DCP_METADATA_BYTES, check_depth, open_limited
from ckptscan.readers.torch_pickle import clean_key, load_pickle
from ckptscan.storage import RemotePath
from ckptscan.storage.ranged import abandoner


# Top-level namespaces of training state that are not model weights
# (torchtitan, OLMo-core, Megatron torch_dist, HF FSDP).
NOT_MODEL = {"optimizer", "optim", "lr_scheduler", "dataloader", "train_state", "rng_state", "rng_states",
             "rerun_state_machine_state", "common_state", "scheduler"}

# Everything a DCP `.metadata` pickle may construct (torch 2.0-2.14 names).
# Megatron-Core's default save (`state_dict_saver.save_state_dict_async_plan`,
# cached for reuse by the next save) also stores every rank's SavePlan in
# `metadata.all_local_plans`: the planner's dataclasses and its WriteItemType
# enum. Unpickling these only fills fields (NEWOBJ + BUILD; an Enum by value),
# no method of theirs runs.
_METADATA_CLASSES = {
    ("torch.distributed.checkpoint.metadata", name)
    for name in ("Metadata", "TensorStorageMetadata", "BytesStorageMetadata", "ChunkStorageMetadata",
                 "TensorProperties", "_MEM_FORMAT_ENCODING", "MetadataIndex", "StorageMeta")
} | {
    ("torch.distributed.checkpoint.planner", name)
    for name in ("SavePlan", "WriteItem", "WriteItemType", "TensorWriteData", "BytesIOWriteData")
} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
    ("torch.distributed.checkpoint.filesystem", "_StoragePrefix"),  # a SavePlan's storage_data
    ("torch.distributed._shard.sharded_tensor.metadata", "TensorProperties"),
    ("torch.distributed._shard.sharded_tensor.metadata", "MEM_FORMAT_ENCODING"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("collections", "OrderedDict"),
    ("builtins", "set"),
    ("builtins", "frozenset"),
    ("pathlib", "PosixPath"),
    ("pathlib", "PurePosixPath"),
}
# The same class under another module name (Python 3.13 moved pathlib's classes);
# and megatron-core's subclasses of Metadata and SavePlan (before 0.16,
# `dist_checkpointing/strategies/torch.py`), which add one field of plain
# dicts (`mcore_data`): read as the DCP classes they extend, megatron never imported.
_MCORE = "megatron.core.dist_checkpointing.strategies.torch"
_METADATA_ALIASES = {("pathlib._local", "PosixPath"): pathlib.PosixPath,
                     ("pathlib._local", "PurePosixPath"): pathlib.PurePosixPath,
                     (_MCORE, "MCoreMetadata"): Metadata,
                     (_MCORE, "MCoreSavePlan"): SavePlan}


class _MetadataUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in _METADATA_ALIASES:
            return _METADATA_ALIASES[(module, name)]
        if (module, name) in _METADATA_CLASSES:
            return super().find_class(module, name)
        if module == "torch" and isinstance(getattr(torch, name, None), (torch.dtype, torch.layout,
                                                                         torch.memory_format)):
            return getattr(torch, name)
        raise pickle.UnpicklingError(f"'{module}.{name}' is not a DCP metadata type")


def read_metadata(directory: Path | RemotePath) -> Metadata:
    path = directory / DCP_METADATA_FILE
    stream = open_limited(path, MAX_DCP_METADATA_BYTES, "DCP metadata")
    try:
        metadata = _MetadataUnpickler(stream).load()
    except pickle.UnpicklingError as e:
        raise CkptScanError(f"refusing to unpickle DCP metadata: {e}", path=path) from None
    except Exception as e:  # truncated or corrupt pickle
        raise CkptScanError(f"corrupt DCP metadata ({type(e).__name__}: {e})", path=path) from None
    if not isinstance(metadata, Metadata) or not isinstance(metadata.state_dict_metadata, dict):
        raise CkptScanError("not DCP metadata", path=path)
    check_depth(metadata, path, "DCP metadata")
    return metadata


class _KnownMetadataReader(FileSystemReader):
    """DCP's file reader, given metadata we already unpickled safely."""

    def __init__(self, directory: Path, metadata: Metadata):
        super().__init__(directory)
        self._metadata = metadata
        self.set_up_storage_reader(metadata, True)

    def read_metadata(self, *args: Any, **kwargs: Any) -> Metadata:
        return self._metadata


class _RemoteReader:
    """`FileSystemReader.read_data` for a DCP directory in object storage: the
    saved chunks a plan needs are fetched by byte range, concurrently, then
    decoded exactly as DCP does (`torch.load(weights_only=True)` of each
    chunk, narrowed to the overlap)."""

    def __init__(self, directory: RemotePath, metadata: Metadata):
        self.directory = directory
        self.storage_data = metadata.storage_data
        # Saved chunks `prefetch` started, (file, start, end) -> (fetch, position), taken by the read that needs them.
        self._prefetched: dict[tuple[str, int, int], tuple[Any, int]] = {}
        self._lock = threading.Lock()

    def _spans(self, items: list[ReadItem], name: str) -> dict[str, list[tuple[int, int]]]:
        """The byte ranges of the saved chunks `items` read, by file."""
        infos = [self.storage_data[item.storage_index] for item in items]
        if any(getattr(info, "transform_descriptors", None) for info in infos):
            raise CkptScanError("chunks saved with DCP storage transforms (compression) cannot be read from "
                                "object storage; download the checkpoint", path=self.directory, tensor=name)
        spans: dict[str, list[tuple[int, int]]] = {}
        for info in infos:
            spans.setdefault(info.relative_path, []).append((info.offset, info.offset + info.length))
        return spans

    def prefetch(self, reads: list[tuple[list[ReadItem], str]]) -> Callable[[], None]:
        """Start fetching the saved chunks of these reads (items, tensor), one
        concurrent batch per file, for the `read` calls that follow (which
        wait for them). Does not wait; a chunk already started and not yet
        taken is not fetched again. Returns a function that abandons what no
        read has taken (cancelling the requests not yet sent)."""
        by_file: dict[str, dict[tuple[int, int], str]] = {}
        with self._lock:
            for items, name in reads:
                for relative, ranges in self._spans(items, name).items():
                    for span in ranges:
                        if (relative, *span) not in self._prefetched:
                            by_file.setdefault(relative, {}).setdefault(span, name)
            started = []
            for relative, spans in by_file.items():
                fetch = (self.directory / relative).fetch_ranges(list(spans), list(spans.values()))
                keys = [(relative, *span) for span in spans]
                started.append((fetch, keys))
                self._prefetched.update((key, (fetch, k)) for k, key in enumerate(keys))

        return abandoner(self._lock, self._prefetched, started)

    def read(self, items: list[ReadItem], target: _IntoTensor, name: str) -> None:
        infos = [self.storage_data[item.storage_index] for item in items]
        chunks = {}
        for relative, ranges in self._spans(items, name).items():
            with self._lock:
                taken = {span: self._prefetched.pop((relative, *span), None) for span in ranges}
            missing = [span for span, pending in taken.items() if pending is None]
            fetched = (self.directory / relative).read_ranges(missing, name) if missing else []
            # The keys are built before indexing: mypy reads `chunks[(a, *b)]` as 3.11's `chunks[a, *b]`.
            for span, data in zip(missing, fetched):
                key = (relative, *span)
                chunks[key] = data
            for span, pending in taken.items():
                if pending is not None:  # waits for a prefetch still in flight; its error is raised here
                    key = (relative, *span)
                    chunks[key] = pending[0].result()[pending[1]]
        for item, info in zip(items, infos):
            raw = io.BytesIO(chunks[(info.relative_path, info.offset, info.offset + info.length)])
            if item.type == LoadItemType.BYTE_IO:
                target.load_bytes(item, raw)
                continue
            tensor = torch.load(raw, map_location="cpu", weights_only=True)
            for dim, (offset, length) in enumerate(zip(item.storage_offsets, item.lengths)):
                tensor = tensor.narrow(dim, offset, length)  # the overlap within this saved chunk
            view = target.resolve_tensor(item)
            if view.size() != tensor.size():
                raise CkptScanError(f"a saved chunk is {list(tensor.size())}, not the {list(view.size())} its "
                                    "metadata says (corrupt checkpoint?)", path=self.directory, tensor=name)
            view.copy_(tensor)
            target.commit_tensor(item, view)


class _IntoTensor:
    """The two planner callbacks `read_data` makes for tensor items: where each
    overlap lands in `out`; byte items are kept as raw bytes, never unpickled
    (a read of bytes only is given an empty `out`, which no tensor item reaches)."""

    def __init__(self, out: torch.Tensor):
        self.out = out
        self.filled = 0
        self.raw = b""

    def resolve_tensor(self, item: ReadItem) -> torch.Tensor:
        view = self.out
        for dim, (offset, length) in enumerate(zip(item.dest_offsets, item.lengths)):
            view = view.narrow(dim, offset, length)
        return view

    def commit_tensor(self, item: ReadItem, tensor: torch.Tensor) -> None:
        self.filled += math.prod(item.lengths)

    def load_bytes(self, item: ReadItem, value: io.BytesIO) -> None:
        self.raw = value.getvalue()


class DcpSource:
    """Tensors of a DCP checkpoint. `names` maps the names we expose to the
    stored keys (wrapper prefixes removed)."""

    def __init__(self, directory: Path | RemotePath, metadata: Metadata, names: dict[str, str]):
        self.directory = directory
        self.metadata = metadata
        self.names = names
        self._remote = _RemoteReader(directory, metadata) if isinstance(directory, RemotePath) else None
        self._reader = _KnownMetadataReader(directory, metadata) if not isinstance(directory, RemotePath) else None

    def keys(self) -> list[str]:
        return list(self.names)

    def _entry(self, name: str) -> tuple[str, TensorStorageMetadata]:
        key = self.names.get(name)
        if key is None:
            raise CkptScanError("no such tensor in this checkpoint", path=self.directory, tensor=name)
        return key, self.metadata.state_dict_metadata[key]

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._entry(name)[1].size)

    def dtype(self, name: str) -> str:
        return dtype_name(self._entry(name)[1].properties.dtype)

    def get(self, name: str, rows: tuple[int, int] | None = None) -> torch.Tensor:
        return self.read_box(name, *self._box(name, rows))

    def _box(self, name: str, rows: tuple[int, int] | None) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(offsets, sizes) of the block `get(name, rows)` reads."""
        shape = self.shape(name)
        if rows is None:
            return (0,) * len(shape), shape
        lo, hi = rows
        if not shape or not 0 <= lo <= hi <= shape[0]:
            raise CkptScanError(f"rows {lo}:{hi} out of range for shape {list(shape)}", path=self.directory,
                                tensor=name)
        return (lo,) + (0,) * (len(shape) - 1), (hi - lo, *shape[1:])

    def _items(self, name: str, offsets: tuple[int, ...], sizes: tuple[int, ...]) -> list[ReadItem]:
        key, entry = self._entry(name)
        wanted = ChunkStorageMetadata(offsets=torch.Size(offsets), sizes=torch.Size(sizes))
        return create_read_items_for_chunk_list(key, entry, [wanted])

    def prefetch(self, wanted: list[tuple[str, tuple[int, int] | None]]) -> Callable[[], None] | None:
        """In object storage: start fetching the saved chunks of these (tensor,
        rows) reads, which `get` then takes (see `_RemoteReader.prefetch`).
        None for a local directory, read by DCP's own reader when asked."""
        if self._remote is None:
            return None
        reads = []
        for name, rows in dict.fromkeys(wanted):
            offsets, sizes = self._box(name, rows)
            if math.prod(sizes):
                reads.append((self._items(name, offsets, sizes), name))
        return self._remote.prefetch(reads)

    def read_box(self, name: str, offsets: tuple[int, ...], sizes: tuple[int, ...]) -> torch.Tensor:
        """The block `[offsets, offsets + sizes)` of a tensor, reading only the
        saved chunks that overlap it."""
        key, entry = self._entry(name)
        out = torch.empty(sizes, dtype=entry.properties.dtype)
        if out.numel() == 0:
            return out
        items = self._items(name, offsets, sizes)
        target = _IntoTensor(out)
        self._read(items, target, name)
        if target.filled != out.numel():
            raise CkptScanError(f"the saved chunks cover only {target.filled} of the {out.numel()} values read "
                                "(incomplete checkpoint?)", path=self.directory, tensor=name)
        return out

    def read_bytes(self, key: str) -> bytes:
        """The raw bytes of a byte entry (a pickled object: unpickle it safely)."""
        item = ReadItem(type=LoadItemType.BYTE_IO, dest_index=MetadataIndex(key), dest_offsets=torch.Size((0,)),
                        storage_index=MetadataIndex(key), storage_offsets=torch.Size((0,)),
                        lengths=torch.Size((0,)))
        target = _IntoTensor(torch.empty(0))
        self._read([item], target, key)
        return target.raw

    def _read(self, items: list[ReadItem], target: _IntoTensor, name: str) -> None:
        try:
            if self._remote is not None:
                self._remote.read(items, target, name)
            elif self._reader is not None:  # one of the two is set, by where the directory is
                self._reader.read_data(LoadPlan(items), target).wait()
        except CkptScanError:
            raise
        except Exception as e:  # missing/truncated .distcp file, corrupt chunk
            raise CkptScanError(f"cannot read from the DCP files ({type(e).__name__}: {e})", path=self.directory,
                                tensor=name) from None


def model_names(metadata: Metadata, directory: Path | RemotePath) -> tuple[dict[str, str], str]:
    """Model tensor names -> stored keys, and the wrapper prefix removed.

    Training state (optimizer, dataloader, ...) is left out. OLMo-core and HF
    FSDP store the model under `model.`: that prefix is removed when every model
    key has it and either other top-level state sits beside it (OLMo-core's
    `optim.`) or keys inside start with `model.` again (HF FSDP's
    `model.model.layers...` beside `model.lm_head.weight`). A lone `model.` that may be the model's own
    name (an HF `model.layers...` saved directly) is kept.
    """
    tensors = [k for k, md in metadata.state_dict_metadata.items() if isinstance(md, TensorStorageMetadata)]
    model = [k for k in tensors if k.split(".", 1)[0] not in NOT_MODEL]
    if not model:
        raise CkptScanError("no model tensors in this DCP checkpoint (only optimizer or training state)",
                            path=directory)
    prefix = ""
    if all(k.startswith("model.") for k in model):
        has_other_state = len(model) < len(metadata.state_dict_metadata)
        if has_other_state or any(k.startswith("model.model.") for k in model):
            prefix = "model."
    names: dict[str, str] = {}
    for key in model:
        name = clean_key(key[len(prefix):])
        if name in names:
            raise CkptScanError("two tensors have this name once wrapper prefixes are removed", path=directory,
                                tensor=name)
        names[name] = key
    return names, prefix


def check_files(metadata: Metadata, directory: Path | RemotePath) -> list[Path | RemotePath]:
    """Every `.distcp` file the metadata points at exists and is long enough."""
    ends: dict[str, int] = {}
    for info in (metadata.storage_data or {}).values():
        if not all(isinstance(getattr(info, a, None), t) for a, t in (("relative_path", str), ("offset", int),
                                                                     ("length", int))):
            raise CkptScanError("DCP metadata without file locations (not written by FileSystemWriter?)",
                                path=directory / DCP_METADATA_FILE)
        if Path(info.relative_path).is_absolute() or ".." in Path(info.relative_path).parts:
            raise CkptScanError(f"DCP metadata points outside the checkpoint ('{info.relative_path}')",
                                path=directory / DCP_METADATA_FILE)
        ends[info.relative_path] = max(ends.get(info.relative_path, 0), info.offset + info.length)
    files = []
    for relative, end in sorted(ends.items()):
        file = directory / relative
        if not file.is_file():
            raise CkptScanError(f"the DCP metadata names '{relative}', which does not exist (incomplete "
                                "checkpoint?)", path=directory)
        if file.stat().st_size < end:
            raise CkptScanError(f"'{relative}' is {file.stat().st_size} bytes but the metadata needs {end} "
                                "(truncated?)", path=directory)
        files.append(file)
    return files


def open_dcp(directory: Path | RemotePath) -> tuple[DcpSource, dict[str, Any], list[Path | RemotePath]]:
    metadata = read_metadata(directory)
    files = check_files(metadata, directory)
    names, prefix = model_names(metadata, directory)
    meta: dict[str, Any] = {"key_prefix": prefix} if prefix else {}
    source = DcpSource(directory, metadata, names)
    step = _train_state_step(source, metadata, directory)
    if step is not None:
        meta[TRAIN_STATE_STEP] = step
    return source, meta, [directory / DCP_METADATA_FILE, *files]


# torchtitan's TrainState (the Trainer in 0.3) saves {"step": int, ...} as
# `train_state`; DCP stores the int as a pickled byte entry (a tensor in
# versions that kept it as one).
TRAIN_STATE_STEP = "train_state.step"


def _train_state_step(source: DcpSource, metadata: Metadata, directory: Path | RemotePath) -> int | None:
    entry = metadata.state_dict_metadata.get(TRAIN_STATE_STEP)
    if isinstance(entry, BytesStorageMetadata):
        value = load_pickle(io.BytesIO(source.read_bytes(TRAIN_STATE_STEP)), where=directory / DCP_METADATA_FILE)
    elif isinstance(entry, TensorStorageMetadata) and entry.size.numel() == 1:
        value = DcpSource(directory, metadata, {TRAIN_STATE_STEP: TRAIN_STATE_STEP}).get(TRAIN_STATE_STEP)
    else:
        return None
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_floating_point():
        value = int(value.item())
    return value if isinstance(value, int) and not isinstance(value, bool) else None
