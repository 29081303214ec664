"""Legacy Megatron-LM GPT (`megatron/legacy/model`, mp_rank_*/model_optim_rng.pt).

`{prefix}language_model.encoder.layers.{i}.self_attention.query_key_value.weight`
(older files: `language_model.transformer.layers.{i}.attention.…`, which
Megatron itself renames on load). The row order depends on the file's
`checkpoint_version` (`megatron/training/checkpointing.py`
`fix_query_key_value_ordering`; a missing version means 0):
- ≥ 2.0: the Megatron-Core grouped layout, G × [q·(H/G) | k | v] (G = H
  unless group_query_attention);
- 1.0: [np, hn, 3]: rows interleave q, k, v row by row (multi-head);
- 0: [3, np, hn]: blocks [Q | K | V] (multi-head).
Head counts come from the pickled `args` (num_attention_heads,
num_query_groups, kv_channels) or the CLI flags; the version has no flag, so
a file without it cannot be read (describe it with --tensor-map instead).
Switch-MLP routers `mlp.router.weight` [E, D] are read too.
"""

from __future__ import annotations

import re

from ckptscan.errors import CkptScanError
from ckptscan.layouts.base import HeadOverrides, ModelLayout, as_mapping, find_layers
from ckptscan.layouts.geometry import HeadHints, fused_geometry, mha_hints
from ckptscan.layouts.megatron import args_head_entries
from ckptscan.layouts.plan import QKTensors, RouterTensors, layer_plan, model_info
from ckptscan.readers.base import Checkpoint

MODEL_TYPES: set[str] = set()

_QKV = re.compile(r"(?P<prefix>(?:.*\.)?language_model\.(?:encoder|transformer)\.)layers\.(?P<layer>\d+)\."
                  r"(?:self_attention|attention)\.query_key_value\.weight")
LAYOUT_BY_VERSION = {0.0: "blocked", 1.0: "row_interleaved"}


def matches(ckpt: Checkpoint, keys: set[str]) -> bool:
    return any(k.endswith("query_key_value.weight") and _QKV.fullmatch(k) for k in keys)


def resolve(ckpt: Checkpoint, keys: set[str], overrides: HeadOverrides) -> ModelLayout:
    path = ckpt.path
    layers = find_layers(keys, _QKV, path, "*language_model.encoder.layers.N.self_attention.query_key_value.weight")
    meta = ckpt.meta
    args = as_mapping(meta.get("args"))
    if not meta:
        raise CkptScanError("legacy Megatron query_key_value: the row order depends on the file's "
                            "checkpoint_version, which the reader did not find; describe the layout with "
                            "--tensor-map (fused = \"grouped\" for version >= 2)", path=path)
    version = float(meta.get("checkpoint_version") or 0)
    layout = "grouped" if version >= 2 else LAYOUT_BY_VERSION.get(version)
    if layout is None:
        raise CkptScanError(f"unknown Megatron checkpoint_version {version:g}", path=path)

    shape = ckpt.tensors.shape
    first = layers[min(layers)]
    rows, hidden = shape(first)
    heads, kv, head_dim = args_head_entries(args)
    if version < 2:
        hints = mha_hints(overrides, heads, f"checkpoint_version {version:g}", path, head_dim)
    else:
        hints = HeadHints.gather(overrides, heads, kv, head_dim, path=path)
    geometry = fused_geometry(hints, first, rows, hidden, layout, path, looked="no args in the checkpoint")
    plans = []
    for layer in sorted(layers):
        qkv = layers[layer]
        router = qkv[: qkv.index(f"layers.{layer}.") + len(f"layers.{layer}.")] + "mlp.router.weight"
        plans.append(layer_plan(layer, geometry, QKTensors(qkv, fused=layout),
                                RouterTensors(router) if router in keys else None, shape, path))
    info = model_info("megatron-legacy", geometry, plans, shape, top_k=1)
    notes = [*geometry.notes, f"checkpoint_version {version:g}: fused layout {layout}"]
    return ModelLayout(info, plans, notes)
