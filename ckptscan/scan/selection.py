"""What a scan reads: the layers and query heads selected, checked against
the model, and the checkpoints checked to be of one model."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import torch

from ckptscan.errors import CkptScanError
from ckptscan.layouts import LayerPlan, ModelInfo, ModelLayout
from ckptscan.monitors.attention import kv_head_index, kv_heads
from ckptscan.readers import Checkpoint
from ckptscan.storage import RemotePath


@dataclass(frozen=True)
class HeadSelection:
    """Which query heads are scanned (model numbering, ascending), their KV
    heads (distinct, ascending), and for each selected query head the
    position of its KV head among `kv_heads`."""

    heads: torch.Tensor  # [H']
    kv_heads: torch.Tensor  # [G']
    kv_index: torch.Tensor  # [H'] into kv_heads
    head_dim: int = 0
    num_heads: int = 0
    num_kv_heads: int = 0

    @staticmethod
    def every(num_heads: int, num_kv_heads: int) -> HeadSelection:
        # From Python lists: made for every layer of every pair, without an op dispatched.
        return HeadSelection(torch.tensor(list(range(num_heads))), torch.tensor(list(range(num_kv_heads))),
                             torch.tensor(kv_heads(num_heads, num_kv_heads)))

    def row_runs(self, role: str | None, shape: tuple[int, ...]) -> list[tuple[int, int]] | None:
        """Row ranges [lo, hi) of W_q or W_k holding the selected heads, or
        None (read the whole tensor) for other roles or any tensor that is not
        the plain [n·r, d] head-block layout `head_blocks` splits."""
        blocks, count = {"W_q": (self.heads, self.num_heads), "W_k": (self.kv_heads, self.num_kv_heads)}.get(
            role or "", (None, 0))
        if blocks is None or len(shape) != 2 or shape[0] != count * self.head_dim:
            return None
        runs: list[tuple[int, int]] = []
        for block in blocks.tolist():
            lo, hi = block * self.head_dim, (block + 1) * self.head_dim
            if runs and runs[-1][1] == lo:
                runs[-1] = (runs[-1][0], hi)
            else:
                runs.append((lo, hi))
        return runs


def select_heads(info: ModelInfo, heads: Sequence[int] | None, path: Path | RemotePath) -> HeadSelection | None:
    if heads is None:
        return None
    wanted = sorted(set(heads))
    if not wanted:
        raise CkptScanError("--heads selects no head", path=path)
    missing = [h for h in wanted if not 0 <= h < info.num_heads]
    if missing:
        raise CkptScanError(f"no head(s) {missing}; the model has query heads 0..{info.num_heads - 1}", path=path)
    kv_of_head = kv_head_index(info.num_heads, info.num_kv_heads)[wanted]
    kv_rows, kv_index = torch.unique(kv_of_head, sorted=True, return_inverse=True)
    return HeadSelection(torch.tensor(wanted), kv_rows, kv_index, info.head_dim, info.num_heads, info.num_kv_heads)


def select_layers(layout: ModelLayout, layers: Sequence[int] | None, path: Path | RemotePath) -> list[LayerPlan]:
    if layers is None:
        return layout.layers
    available = {p.layer for p in layout.layers}
    missing = sorted(set(layers) - available)
    if missing:
        raise CkptScanError(f"no layer(s) {missing}; the model has layers {min(available)}..{max(available)}",
                            path=path)
    return [p for p in layout.layers if p.layer in set(layers)]


def layer_plan(layout: ModelLayout, layer: int) -> LayerPlan:
    """The plan of model layer `layer` (layers are numbered by the model, not by position)."""
    for plan in layout.layers:
        if plan.layer == layer:
            return plan
    raise AssertionError(f"layer {layer} vanished after the compatibility check")


def router_name(plan: LayerPlan) -> str | None:
    return next((name for name, role in plan.roles.items() if role == "router"), None)


def check_compatible(ckpt_a: Checkpoint, layout_a: ModelLayout, ckpt_b: Checkpoint, layout_b: ModelLayout) -> None:
    diffs = "; ".join(
        f"{f}: {getattr(layout_a.info, f)} vs {getattr(layout_b.info, f)}"
        for f in layout_a.info.__dataclass_fields__
        if getattr(layout_a.info, f) != getattr(layout_b.info, f)
    )
    # A differing tensor is named with both shapes, and the model settings
    # that differ with it.
    for plan_a, plan_b in zip(layout_a.layers, layout_b.layers):
        for name_a, name_b in zip(plan_a.tensors, plan_b.tensors):
            shape_a, shape_b = ckpt_a.tensors.shape(name_a), ckpt_b.tensors.shape(name_b)
            if shape_a != shape_b or name_a != name_b:
                raise CkptScanError(
                    f"shape {list(shape_a)} in {ckpt_a.path} but {list(shape_b)} in {ckpt_b.path}"
                    + (f" (different models: {diffs})" if diffs else ""),
                    tensor=name_a,
                )
    if diffs:
        raise CkptScanError(f"checkpoints are of different models ({diffs}): {ckpt_a.path} vs {ckpt_b.path}")
