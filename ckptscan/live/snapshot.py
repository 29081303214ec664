"""A live model seen as a checkpoint: the same names, the same layout resolvers.

A model's `state_dict` names are the names a checkpoint of it is saved
under, so `resolve_layout` places a live model with the resolvers that place
its checkpoints. `ModelView` exposes every name with its shape and dtype (the
resolvers read names, shapes and the config, never data) and resolves the
layout once; `snapshot` copies only the monitored tensors (q/k rows, routers)
into host memory, as a `Checkpoint` whose source holds just those. The scan
core (`scan_layers`) then reads a snapshot exactly as it reads a checkpoint
from disk.

Live mode scans in a background thread while training goes on, so a
snapshot is the only work on the training step's path. `HostBuffers` holds
two sets of host buffers, filled in turn: the scan reads the previous
snapshot and the newest, and the next snapshot overwrites the older only
once that scan is done (the monitor waits for it), so memory stays at two
copies of the monitored tensors and nothing is allocated after the first
two snapshots. From a CUDA model the buffers are pinned and the copies
asynchronous (`non_blocking`) on the training's own stream, which orders
them before the next optimizer step; `Snapshot.wait` (on the scan's thread)
waits for their CUDA event. No GPU memory is added, and the GPU is not
asked for any work beyond the device-to-host copies.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import torch

from ckptscan.errors import CkptScanError
from ckptscan.layouts import HeadOverrides, ModelLayout, TensorMap, resolve_layout
from ckptscan.readers import Checkpoint
from ckptscan.readers.base import dtype_name

# The Checkpoint.format of a snapshot (reports show it where a file format would be).
LIVE_FORMAT = "live"


class SnapshotSource:
    """Every name of the model (shape, dtype), data only for the snapshot's tensors."""

    def __init__(self, shapes: Mapping[str, tuple[int, ...]], dtypes: Mapping[str, str],
                 tensors: Mapping[str, torch.Tensor]):
        self._shapes, self._dtypes, self._tensors = shapes, dtypes, tensors

    def keys(self) -> list[str]:
        return list(self._shapes)

    def shape(self, name: str) -> tuple[int, ...]:
        return self._shapes[name]

    def dtype(self, name: str) -> str:
        return self._dtypes[name]

    def get(self, name: str, rows: tuple[int, int] | None = None) -> torch.Tensor:
        try:
            tensor = self._tensors[name]
        except KeyError:
            raise CkptScanError("not a monitored tensor: the live snapshot holds only the monitored ones",
                                tensor=name) from None
        return tensor if rows is None else tensor[rows[0]:rows[1]]


class ModelView:
    """A live model's names, shapes, dtypes and config, and its resolved layout."""

    def __init__(self, model: torch.nn.Module, config: Mapping[str, Any] | None,
                 overrides: HeadOverrides = HeadOverrides(), tensor_map: TensorMap | None = None,
                 layers: Sequence[int] | None = None):
        # Parameters and persistent buffers under their state_dict names (tied
        # weights under each of their names, as a state_dict has them), kept
        # by reference: nothing is copied until a snapshot.
        state_names = set(model.state_dict().keys())
        self.tensors: dict[str, torch.Tensor] = {
            name: tensor
            for name, tensor in [*model.named_parameters(remove_duplicate=False),
                                 *model.named_buffers(remove_duplicate=False)]
            if name in state_names
        }
        self.shapes = {name: tuple(t.shape) for name, t in self.tensors.items()}
        self.dtypes = {name: dtype_name(t.dtype) for name, t in self.tensors.items()}
        self.config = dict(config) if config is not None else None
        self.layout: ModelLayout = resolve_layout(self._checkpoint({}, None), overrides, tensor_map)
        plans = [p for p in self.layout.layers if layers is None or p.layer in layers]
        # Sorted: every rank gathers the sharded ones in the same order.
        self.monitored: list[str] = sorted({name for plan in plans for name in plan.tensors})
        self.sharded = any(_is_dtensor(self.tensors[name]) for name in self.monitored)

    def snapshot(self, step: int, keep: bool = True,
                 into: Mapping[str, torch.Tensor] | None = None) -> Checkpoint | None:
        """The monitored tensors now, as a checkpoint of `step`: copied on
        their device, or with `into` (name -> a tensor of its shape and
        dtype) into those tensors, asynchronously from a CUDA device into
        pinned ones (see `HostBuffers`). Sharded (DTensor) tensors are
        gathered whole: every rank must call this (the gather is a
        collective); ranks other than 0 get None with `keep` False, i.e. they
        only take part in the collective."""
        copies: dict[str, torch.Tensor] = {}
        with torch.no_grad():
            for name in self.monitored:
                tensor = self.tensors[name].detach()
                fresh = _is_dtensor(tensor)
                if fresh:
                    tensor = tensor.full_tensor()  # the collective: only this tensor, not the model
                if not keep:
                    continue
                if into is not None:
                    copies[name] = into[name].copy_(tensor, non_blocking=tensor.is_cuda)
                else:
                    copies[name] = tensor if fresh else tensor.clone()
        return self._checkpoint(copies, step) if keep else None

    def _checkpoint(self, tensors: dict[str, torch.Tensor], step: int | None) -> Checkpoint:
        return Checkpoint(path=Path(f"live:step-{step}"), format=LIVE_FORMAT, step=step,
                          tensors=SnapshotSource(self.shapes, self.dtypes, tensors), config=self.config)


@dataclass
class Snapshot:
    """A snapshot, and the CUDA events that mark the end of its copies."""

    checkpoint: Checkpoint
    copied: list[Any] = field(default_factory=list)  # torch.cuda.Event, one per CUDA device copied from

    def wait(self) -> None:
        """Until the copies are done (at once on the CPU)."""
        for event in self.copied:
            event.synchronize()


class HostBuffers:
    """Two sets of host buffers for a view's monitored tensors, filled in turn
    (module docstring). Each is allocated at its first use."""

    def __init__(self, view: ModelView):
        self.view = view
        self.sets: list[dict[str, torch.Tensor]] = []
        self.taken = 0  # snapshots taken: the next fills set taken % 2

    def take(self, step: int, keep: bool = True) -> Snapshot | None:
        """`view.snapshot(step, keep)` into the next buffer set. The caller
        guarantees that no scan still reads it (the snapshot before last)."""
        into = None
        if keep:
            if len(self.sets) <= self.taken % 2:
                self.sets.append({name: self._buffer(name) for name in self.view.monitored})
            into = self.sets[self.taken % 2]
        checkpoint = self.view.snapshot(step, keep, into)
        self.taken += 1
        if checkpoint is None:
            return None
        devices = sorted({t.device.index or 0 for name in self.view.monitored
                          if (t := self.view.tensors[name]).device.type == "cuda"})
        copied = []
        for index in devices:  # after the copies on each device's current stream
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(index))
            copied.append(event)
        return Snapshot(checkpoint, copied)

    def _buffer(self, name: str) -> torch.Tensor:
        tensor = self.view.tensors[name]
        return torch.empty(self.view.shapes[name], dtype=tensor.dtype, pin_memory=tensor.device.type == "cuda")


def model_config(model: torch.nn.Module) -> dict[str, Any] | None:
    """The model's config as config.json would hold it: the `config` of the
    model or, for a wrapper (a LightningModule holding a Hugging Face model),
    of its first submodule that has one; a `PretrainedConfig` (`to_dict()`)
    or a plain mapping."""
    for module in model.modules():
        config = getattr(module, "config", None)
        if config is not None and hasattr(config, "to_dict"):
            return config.to_dict()
        if isinstance(config, Mapping):
            return dict(config)
    return None


def _is_dtensor(tensor: torch.Tensor) -> bool:
    return hasattr(tensor, "full_tensor") and hasattr(tensor, "device_mesh")
