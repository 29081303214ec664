"""Reading a layer: its monitored tensors' bytes (with a head selection, only
those heads' rows), fetched at once from object storage, onto the device the
math runs on."""

from __future__ import annotations

from typing import Any, Callable

import torch

from ckptscan.errors import CkptScanError
from ckptscan.layouts import LayerPlan
from ckptscan.layouts.base import HEAD_ROLES
from ckptscan.readers import Checkpoint
from ckptscan.readers.rows import StoredRows
from ckptscan.scan.selection import HeadSelection
from ckptscan.system.linalg_warmup import warm_linalg


def read_layer(ckpt: Checkpoint, plan: LayerPlan, selection: HeadSelection | None,
               device: str, keep_head: bool = False) -> dict[str, Any]:
    """The layer's monitored tensors as stored, by name, on `device`; the LM
    head as `StoredRows`, read a chunk of rows at a time by the output
    family's pass (the last layer's largest tensors by far: never whole
    unless `keep_head`, for a checkpoint several pairs read)."""
    prefetch(ckpt, plan, selection)
    heads = {name: StoredRows(ckpt.tensors, name, device, keep=keep_head) for name in plan.tensors
             if plan.roles.get(name) in HEAD_ROLES}
    read = [name for name in plan.tensors if name not in heads]
    if device == "cpu":
        return {**{name: read_tensor(ckpt, plan, name, selection) for name in read}, **heads}
    # To a GPU through pinned memory, asynchronously: each tensor's copy runs
    # on the device's stream while the next one is read, and the math queued
    # after it on the same stream waits for its inputs, with no host sync.
    # torch's caching host allocator reuses a pinned block only once the
    # copy that read it has finished. (A pageable copy would block the
    # reading thread for every tensor.)
    return {**{name: read_tensor(ckpt, plan, name, selection).pin_memory().to(device, non_blocking=True)
               for name in read}, **heads}


def prefetch(ckpt: Checkpoint, plan: LayerPlan, selection: HeadSelection | None) -> Callable[[], None] | None:
    """A source in object storage gets every byte range of this layer at once
    (fetched concurrently, adjacent ranges coalesced) instead of one request
    after another; `read_tensor` then takes them, waiting for those still in
    flight. Returns the source's function abandoning them (see `ReadAhead`).
    Local sources fetch nothing here and read as before."""
    prefetch = getattr(ckpt.tensors, "prefetch", None)
    if prefetch is None:
        return None
    wanted: list[tuple[str, tuple[int, int] | None]] = []
    for name in plan.tensors:
        if plan.roles.get(name) in HEAD_ROLES:  # read by chunks as the output family's pass goes
            continue
        runs = selection.row_runs(plan.roles.get(name), ckpt.tensors.shape(name)) if selection is not None else None
        wanted.extend([(name, None)] if runs is None else [(name, run) for run in runs])
    return prefetch(wanted)


def read_tensor(ckpt: Checkpoint, plan: LayerPlan, name: str, selection: HeadSelection | None) -> torch.Tensor:
    """One monitored tensor. With a head selection only the selected heads'
    rows of W_q/W_k are read, into an otherwise zero tensor of the full shape
    so that the layout's `build` sees the shape it checks; the zero rows
    belong to heads dropped right after `build`, never seen by the math."""
    shape = ckpt.tensors.shape(name)
    runs = selection.row_runs(plan.roles.get(name), shape) if selection is not None else None
    if runs is None:
        return ckpt.tensors.get(name)
    full = None
    for lo, hi in runs:
        part = ckpt.tensors.get(name, rows=(lo, hi))
        full = part.new_zeros(shape) if full is None else full
        full[lo:hi] = part
    return full


def resolve_device(device: str) -> str:
    """The torch device the math runs on: "auto" is "cuda" when torch can use
    a CUDA device and "cpu" otherwise; an explicit "cuda[:N]" must exist. A
    CUDA device comes back with its solvers loaded by this thread
    (`warm_linalg`): the layer workers that use it next must not be the
    first to load them, two at once."""
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cpu":
        return device
    kind, colon, index = device.partition(":")
    if kind != "cuda" or (colon and not index.isdigit()):
        raise CkptScanError(f"--device must be 'cpu', 'cuda', 'cuda:N' or 'auto', not {device!r}")
    if not torch.cuda.is_available():
        raise CkptScanError(f"--device {device}: torch {torch.__version__} sees no CUDA device here; "
                            "use --device cpu (or auto, which falls back to the CPU)")
    if index and int(index) >= torch.cuda.device_count():
        raise CkptScanError(f"--device {device}: only {torch.cuda.device_count()} CUDA device(s) here")
    warm_linalg(device)
    return device
