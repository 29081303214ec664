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
from ckptscan.layouts.base import HeadOverrides, ModelInfo, ModelLayout, as_mapping, find_layers
from ckptscan.layouts.geometry import HeadHints, fused_geometry, mha_hints
from ckptscan.layouts.plan import QKTensors, RouterTensors, layer_plan
from ckptscan.readers.base import Checkpoint

MODEL_TYPES: set[str] = set()

_QKV = re.compile(r"(?P<prefix>(?:.*\.)?language_model\.(?:encoder|transformer)\.)layers\.(?P<layer>\d+)\."
                  r"(?:self_attention|attention)\.query_key_value\.weight")
LAYOUT_BY_VERSION = {0.0: "blocked", 1.0: "row_interleaved"}


def matches(ckpt: Checkpoint, keys: set[str]) -> bool:
    return any(k.endswith("query_key_value.weight") and _QKV.fullmatch(k) for k in keys)


def resolve(ckpt: Checkpoint, keys: set[str], overrides: HeadOverrides) -> ModelLayout:
    path = ckpt.path
    layers = find_layers(keys, _QKV, path)
    if not layers:
        raise CkptScanError("no '*language_model.encoder.layers.N.self_attention.query_key_value.weight' tensors "
                            "found", path=path)
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
    heads = args.get("num_attention_heads")
    heads_entry = (heads, "args 'num_attention_heads'") if heads else None
    head_dim = args.get("kv_channels") or (args["hidden_size"] // heads if heads and args.get("hidden_size") else None)
    head_dim_entry = (head_dim, "args 'kv_channels' (default hidden_size / heads)") if head_dim else None
    if version < 2:
        hints = mha_hints(overrides, heads_entry, f"checkpoint_version {version:g}", path, head_dim_entry)
    else:
        gqa = args.get("group_query_attention")
        kv = args.get("num_query_groups") if gqa else heads
        kv_entry = (kv, "args 'num_query_groups'" if gqa else "args (no group_query_attention: KV heads = heads)")
        hints = HeadHints.gather(overrides, heads_entry, kv_entry if kv else None, head_dim_entry)
    geometry = fused_geometry(hints, first, rows, hidden, layout, path, looked="no args in the checkpoint")
    plans = []
    for layer in sorted(layers):
        qkv = layers[layer]
        router = qkv[: qkv.index(f"layers.{layer}.") + len(f"layers.{layer}.")] + "mlp.router.weight"
        plans.append(layer_plan(layer, geometry, QKTensors(qkv, fused=layout),
                                RouterTensors(router) if router in keys else None, shape, path))
    routed = [p for p in plans if "router" in p.roles.values()]
    info = ModelInfo(
        family="megatron-legacy",
        num_layers=len(plans),
        hidden_size=hidden,
        num_heads=geometry.num_heads,
        num_kv_heads=geometry.num_kv_heads,
        head_dim=geometry.head_dim,
        num_experts=shape(next(n for n, r in routed[0].roles.items() if r == "router"))[0] if routed else None,
        top_k=1 if routed else None,
    )
    notes = [*geometry.notes, f"checkpoint_version {version:g}: fused layout {layout}"]
    return ModelLayout(info, plans, notes)
