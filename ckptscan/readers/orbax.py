"""Orbax checkpoints (JAX: MaxText and others), read through tensorstore.

`CheckpointManager` writes `DIR/<step>/` with `_CHECKPOINT_METADATA` and one
folder per item (`default`, MaxText's `items`), each holding `_METADATA` (the
pytree: every array's key path and shape) and the arrays in an OCDBT
key-value store (`manifest.ocdbt`, `d/`, `ocdbt.process_N/`), one zarr array
per leaf named by its key path joined with dots. We read `_METADATA` as JSON
and each array, or a slice of it, through tensorstore (the `orbax` extra):
nothing is unpickled and nothing is executed.

Layers scanned with `jax.lax.scan` are stored stacked: MaxText's
`decoder.layers.<param>` arrays carry the layer on axis 1 (`param_scan_axis`,
default 1; from MaxText's source). They are exposed per layer as
`decoder.layers.<i>.<param>` with that axis removed, read one layer's slice
at a time.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path
from typing import Any

import numpy
import torch

from ckptscan.errors import CkptScanError
from ckptscan.readers.base import Checkpoint, Format, dtype_name
from ckptscan.readers.sidecars import read_config
from ckptscan.storage import RemotePath

CHECKPOINT_METADATA = "_CHECKPOINT_METADATA"
ITEM_METADATA = "_METADATA"
OCDBT_MANIFEST = "manifest.ocdbt"
# Where MaxText (and jax.lax.scan in general) stacks scanned layers.
SCAN_AXIS = 1
_SCANNED = re.compile(r"^(?P<prefix>(?:.*\.)?layers)\.(?P<rest>[^\d].*)$")


def is_item_dir(path: Path | RemotePath) -> bool:
    return (path / ITEM_METADATA).is_file() and (path / OCDBT_MANIFEST).is_file()


def item_dir(step_dir: Path | RemotePath) -> Path | RemotePath | None:
    """The one item folder of an Orbax step folder (`default`, `items`, `state`)."""
    children: list[Path | RemotePath] = sorted(step_dir.iterdir())
    items = [d for d in children if d.is_dir() and is_item_dir(d)]
    if len(items) > 1:
        raise CkptScanError(f"several Orbax items ({', '.join(d.name for d in items)}); open one of them",
                            path=step_dir)
    return items[0] if items else None


def _tensorstore() -> Any:
    try:
        import tensorstore
    except ImportError:
        raise CkptScanError("reading Orbax checkpoints needs tensorstore: pip install 'ckptscan[orbax]'") from None
    return tensorstore


class OrbaxSource:
    """The arrays of one Orbax item, scanned layers exposed per layer."""

    def __init__(self, directory: Path):
        self.directory = directory
        self._spec_base = {"driver": "zarr" if not _uses_zarr3(directory) else "zarr3",
                           "kvstore": {"driver": "ocdbt", "base": directory.resolve().as_uri() + "/"}}
        stored = _stored_shapes(directory)
        # exposed name -> (stored key, layer index on SCAN_AXIS or None)
        self._names: dict[str, tuple[str, int | None]] = {}
        self._shapes: dict[str, tuple[int, ...]] = {}
        self._arrays: dict[str, Any] = {}
        matches = {k: m for k in stored if (m := _SCANNED.match(k))}
        scanned = {k: s for k, s in stored.items() if k in matches and len(s) > SCAN_AXIS + 1}
        layers = {s[SCAN_AXIS] for s in scanned.values()}
        for key, shape in stored.items():
            if key in scanned and len(layers) == 1:
                match = matches[key]
                for i in range(shape[SCAN_AXIS]):
                    name = f"{match.group('prefix')}.{i}.{match.group('rest')}"
                    self._names[name] = (key, i)
                    self._shapes[name] = shape[:SCAN_AXIS] + shape[SCAN_AXIS + 1:]
            else:
                self._names[key] = (key, None)
                self._shapes[key] = shape

    def keys(self) -> list[str]:
        return list(self._names)

    def _entry(self, name: str) -> tuple[str, int | None]:
        entry = self._names.get(name)
        if entry is None:
            raise CkptScanError("no such tensor in this checkpoint", path=self.directory, tensor=name)
        return entry

    def _array(self, key: str) -> Any:
        if key not in self._arrays:
            ts = _tensorstore()
            try:
                self._arrays[key] = ts.open({**self._spec_base, "path": key}, open=True, read=True).result()
            except Exception as e:  # tensorstore raises ValueError/RuntimeError subclasses on bad stores
                raise CkptScanError(f"cannot open the array ({type(e).__name__}: {e})", path=self.directory,
                                    tensor=key) from None
        return self._arrays[key]

    def shape(self, name: str) -> tuple[int, ...]:
        self._entry(name)
        return self._shapes[name]

    def dtype(self, name: str) -> str:
        key, _ = self._entry(name)
        return dtype_name(_torch_dtype(self._array(key).dtype.numpy_dtype))

    def get(self, name: str, rows: tuple[int, int] | None = None) -> torch.Tensor:
        key, layer = self._entry(name)
        view = self._array(key)
        if layer is not None:
            view = view[(slice(None),) * SCAN_AXIS + (layer,)]
        if rows is not None:
            lo, hi = rows
            shape = self._shapes[name]
            if not shape or not 0 <= lo <= hi <= shape[0]:
                raise CkptScanError(f"rows {lo}:{hi} out of range for shape {list(shape)}", path=self.directory,
                                    tensor=name)
            view = view[lo:hi]
        try:
            values = view.read().result()
        except Exception as e:
            raise CkptScanError(f"cannot read the array ({type(e).__name__}: {e})", path=self.directory,
                                tensor=name) from None
        return _to_torch(numpy.ascontiguousarray(values))


def _uses_zarr3(directory: Path | RemotePath) -> bool:
    return bool(_metadata(directory).get("use_zarr3"))


def _metadata(directory: Path | RemotePath) -> dict[str, Any]:
    path = directory / ITEM_METADATA
    try:
        metadata = json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise CkptScanError(f"cannot read: {e.strerror or e}", path=path) from None
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise CkptScanError(f"invalid JSON ({type(e).__name__})", path=path) from None
    if not isinstance(metadata, dict) or not isinstance(metadata.get("tree_metadata"), dict):
        raise CkptScanError("Orbax _METADATA without a 'tree_metadata' object", path=path)
    return metadata


def _stored_shapes(directory: Path | RemotePath) -> dict[str, tuple[int, ...]]:
    """Array key (key path joined with dots, as Orbax names the zarr arrays) -> shape."""
    shapes = {}
    for tree_key, entry in _metadata(directory)["tree_metadata"].items():
        value = entry.get("value_metadata", {}) if isinstance(entry, dict) else {}
        if value.get("skip_deserialize") or "write_shape" not in value:
            continue
        parts = [str(k.get("key")) for k in entry.get("key_metadata", []) if isinstance(k, dict)]
        if not parts:  # older metadata: only the tuple's repr
            try:
                parts = [str(p) for p in ast.literal_eval(tree_key)]
            except (ValueError, SyntaxError):
                raise CkptScanError(f"unreadable Orbax key {tree_key!r}", path=directory / ITEM_METADATA) from None
        shape = value["write_shape"]
        if not isinstance(shape, list) or not all(isinstance(n, int) and n >= 0 for n in shape):
            raise CkptScanError(f"invalid shape {shape!r}", path=directory / ITEM_METADATA, tensor=".".join(parts))
        shapes[".".join(parts)] = tuple(shape)
    if not shapes:
        raise CkptScanError("no arrays in this Orbax checkpoint", path=directory / ITEM_METADATA)
    return shapes


def _torch_dtype(dtype: numpy.dtype) -> torch.dtype:
    if dtype.name == "bfloat16":  # ml_dtypes' bfloat16, as JAX stores it
        return torch.bfloat16
    try:
        return torch.from_numpy(numpy.zeros(0, dtype=dtype)).dtype
    except TypeError:
        raise CkptScanError(f"unsupported Orbax array dtype {dtype}") from None


def _to_torch(values: numpy.ndarray) -> torch.Tensor:
    if values.dtype.name == "bfloat16":
        return torch.from_numpy(values.view(numpy.int16)).view(torch.bfloat16)
    return torch.from_numpy(values)


def _item_in(folder: Path | RemotePath) -> Path | RemotePath | None:
    """An item folder itself, or the one item of a step folder."""
    if is_item_dir(folder):
        return folder
    if (folder / CHECKPOINT_METADATA).is_file():
        return item_dir(folder)
    return None


def _open_item(item: Path | RemotePath) -> Checkpoint:
    """An Orbax item folder; its step folder (`<step>/`) is the checkpoint."""
    if isinstance(item, RemotePath):  # tensorstore is given a file:// URI, and the files are listed by rglob
        raise CkptScanError("Orbax checkpoints are read from local disk only; copy this one locally", path=item)
    source = OrbaxSource(item)
    step_dir = item.parent if (item.parent / CHECKPOINT_METADATA).is_file() else item
    step = int(step_dir.name) if step_dir.name.isdigit() else None
    meta: dict[str, Any] = {}
    if "step" in source.keys() and source.shape("step") == ():  # MaxText's train state records it
        value = source.get("step")
        if not value.is_floating_point():
            meta["step"] = int(value.item())
    return Checkpoint(step_dir, "orbax", step, source, read_config(step_dir / "config.json"),
                      sorted(f for f in item.rglob("*") if f.is_file()), meta)


ORBAX = Format("orbax", _open_item, in_folder=_item_in)
