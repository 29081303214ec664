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
Switch-MLP routers `mlp.router.weight` [E, D] are read too. With `args`
(which state the 1 + w norm convention, `apply_layernorm_1p`): the input norm
`layers.{i}.input_norm` (`input_layernorm` in older files), and the output
family's `language_model.encoder.final_norm` (`final_layernorm`) and
`language_model.output_layer` (untied), or the tied
`language_model.embedding.word_embeddings` (`megatron/legacy/model/
language_model.py`, `transformer.py`).
"""

from __future__ import annotations

import re

from ckptscan.errors import CkptScanError
from ckptscan.layouts.base import HeadOverrides, ModelLayout, as_mapping, find_layers, matched_prefix, present
from ckptscan.layouts.geometry import HeadHints, fused_geometry, mha_hints
from ckptscan.layouts.megatron import args_head_entries, norm_offset
from ckptscan.layouts.plan import QKTensors, RouterTensors, attach_output, find_output, layer_plan, model_info
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
    offset = norm_offset(args)
    plans = []
    for layer in sorted(layers):
        qkv = layers[layer]
        base = qkv[: qkv.index(f"layers.{layer}.") + len(f"layers.{layer}.")]
        router = base + "mlp.router.weight"
        norm = (present(keys, base + "input_norm.weight") or present(keys, base + "input_layernorm.weight")
                if args else None)
        plans.append(layer_plan(layer, geometry, QKTensors(qkv, fused=layout, gain_offset=offset, input_norm=norm),
                                RouterTensors(router) if router in keys else None, shape, path))
    info = model_info("megatron-legacy", geometry, plans, shape, top_k=1)
    notes = [*geometry.notes, f"checkpoint_version {version:g}: fused layout {layout}"]
    encoder = matched_prefix(_QKV, first)
    model = encoder[: encoder.rindex("language_model.")] + "language_model."
    if args:
        untie = args.get("untie_embeddings_and_output_weights")
        output, note = find_output(keys, (model + "output_layer.weight",),
                                   (model + "embedding.word_embeddings.weight",),
                                   (encoder + "final_norm.weight", encoder + "final_layernorm.weight"),
                                   tied=None if untie is None else not untie, gain_offset=offset)
    else:
        output, note = None, "output family not judged: no args state the final norm's convention (w or 1 + w)"
    return attach_output(ModelLayout(info, plans, notes), output, note, shape, path)
