"""Megatron-Core GPT: fused `linear_qkv` grouped per KV group, routers, torch_dist stacking.

Per layer `{prefix}decoder.layers.{i}.self_attention.linear_qkv.weight`
[(H + 2G)·d, D] views as [G, (H/G + 2)·d]: group g holds its H/G query heads,
then k_g, then v_g ("q1 q2 k1 v1 | q3 q4 k2 v2", NVIDIA/Megatron-LM
`megatron/core/transformer/attention.py` `get_query_key_value_tensors`);
with `attention_output_gate` each group is [q, gate, k, v]. Optional QK norms
`self_attention.{q,k}_layernorm.weight` [d], scaled by 1 + w under
`--apply-layernorm-1p` (layernorm_zero_centered_gamma). `linear_qkv.
layer_norm_weight` is the fused input norm (Transformer Engine spec;
`input_layernorm.weight` in the local spec), not a QK norm: read as the
input norm, with `decoder.final_layernorm.weight` and the head
`output_layer.weight` (absent when tied to `embedding.word_embeddings.weight`,
Megatron's default `share_embeddings_and_output_weights`), only with `args`,
which state the 1 + w convention.
Routers: `mlp.router.weight` [E, D] and the selection-only
`mlp.router.expert_bias` [E] (`moe/router.py`).

torch_dist checkpoints of homogeneous models stack the layers on disk
(`decoder.layers.self_attention.linear_qkv.weight` [L, out, in]); the reader
shows them per layer under the names above, reading one layer at a time.

Head counts come from the checkpoint's `args` (num_attention_heads,
num_query_groups when group_query_attention, kv_channels defaulting to
hidden/H, attention_output_gate), exposed by the reader as metadata, or from
the CLI flags. Without args the gate and the norm convention are unknown:
the flags must make the split unambiguous, and QK norms are refused.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from ckptscan.errors import CkptScanError
from ckptscan.layouts.base import HeadOverrides, ModelLayout, as_mapping, find_layers, matched_prefix, present
from ckptscan.layouts.geometry import Geometry, HeadHints, fused_geometry
from ckptscan.layouts.plan import QKTensors, RouterTensors, attach_output, find_output, layer_plan, model_info
from ckptscan.readers.base import Checkpoint

MODEL_TYPES: set[str] = set()

_QKV = re.compile(r"(?P<prefix>.*?)decoder\.layers\.(?P<layer>\d+)\.self_attention\.linear_qkv\.weight")


def matches(ckpt: Checkpoint, keys: set[str]) -> bool:
    return any(k.endswith("self_attention.linear_qkv.weight") for k in keys) or any(
        k.endswith("self_attention.linear_kv_down_proj.weight") for k in keys
    )


def resolve(ckpt: Checkpoint, keys: set[str], overrides: HeadOverrides) -> ModelLayout:
    path = ckpt.path
    shape = ckpt.tensors.shape
    args = as_mapping(ckpt.meta.get("args"))
    if not any(_QKV.fullmatch(k) for k in keys) and any(k.endswith("linear_kv_down_proj.weight") for k in keys):
        raise CkptScanError("Megatron multi-latent attention (linear_q_down_proj/linear_kv_down_proj) is not "
                            "supported yet: its per-head ordering is unconfirmed", path=path)
    names = find_layers(keys, _QKV, path, "*decoder.layers.N.self_attention.linear_qkv.weight")
    first = names[min(names)]
    rows, hidden = shape(first)

    def sibling(qkv_name: str, suffix: str) -> str:
        """The name of another tensor of the same layer."""
        return qkv_name[: -len("self_attention.linear_qkv.weight")] + suffix

    q_norm = sibling(first, "self_attention.q_layernorm.weight")
    layout, geometry = _geometry(args, overrides, first, rows, hidden, shape(q_norm) if q_norm in keys else None,
                                 path)
    # One flag sets every norm's convention: the QK norms', the input norm's.
    offset = norm_offset(args) if args else _gain_offset(args, q_norm in keys, path, q_norm)
    # Megatron's default score function is softmax; without args it is unknown.
    scoring = (args.get("moe_router_score_function") or "softmax") if args else None

    plans = []
    for layer in sorted(names):
        qkv = names[layer]
        qk = QKTensors(
            qkv,
            fused=layout,
            q_norm=present(keys, sibling(qkv, "self_attention.q_layernorm.weight")),
            k_norm=present(keys, sibling(qkv, "self_attention.k_layernorm.weight")),
            gain_offset=offset,
            input_norm=_input_norm(keys, args, sibling(qkv, "self_attention.linear_qkv.layer_norm_weight"),
                                   sibling(qkv, "input_layernorm.weight")),
        )
        router = None
        if sibling(qkv, "mlp.router.weight") in keys:
            router = RouterTensors(sibling(qkv, "mlp.router.weight"),
                                   present(keys, sibling(qkv, "mlp.router.expert_bias")))
        plans.append(layer_plan(layer, geometry, qk, router, shape, path,
                                num_experts=args.get("num_experts") if router else None,
                                router_scoring=scoring))
    num_layers = args.get("num_layers")
    notes = list(geometry.notes)
    notes.append(f"fused layout: {layout}" + (" (args 'attention_output_gate')" if args else " (from the shape)"))
    if isinstance(num_layers, int) and num_layers != len(names):
        notes.append(f"args 'num_layers' is {num_layers} but {len(names)} layers were found (pipeline stage?)")
    info = model_info("megatron", geometry, plans, shape, num_experts=args.get("num_experts"),
                      top_k=args.get("moe_router_topk"), router_scoring=scoring)
    return attach_output(ModelLayout(info, plans, notes), *_output(keys, args, first), shape, path)


def norm_offset(args: Mapping[str, Any]) -> float:
    return 1.0 if args.get("layernorm_zero_centered_gamma", args.get("apply_layernorm_1p")) else 0.0


def _input_norm(keys: set[str], args: Mapping[str, Any], fused: str, local: str) -> str | None:
    """The input norm's gain where `args` state its convention (w or 1 + w)
    and its offset is the QK norms' (one flag sets both)."""
    return (present(keys, fused) or present(keys, local)) if args else None


def _output(keys: set[str], args: Mapping[str, Any], first: str) -> tuple[Any, str | None]:
    prefix = matched_prefix(_QKV, first)
    if not args:
        return None, "output family not judged: no args state the final norm's convention (w or 1 + w)"
    untie = args.get("untie_embeddings_and_output_weights")
    return find_output(keys, (prefix + "output_layer.weight",), (prefix + "embedding.word_embeddings.weight",),
                       (prefix + "decoder.final_layernorm.weight",), tied=None if untie is None else not untie,
                       gain_offset=norm_offset(args))


Entry = tuple[Any, str] | None


def args_head_entries(args: Mapping[str, Any]) -> tuple[Entry, Entry, Entry]:
    """(query heads, KV heads, head_dim) as Megatron's `args` state them, each
    with where it came from: KV heads are num_query_groups under
    group_query_attention, else the heads; kv_channels defaults to
    hidden_size / heads, as in Megatron."""
    heads = args.get("num_attention_heads")
    gqa = args.get("group_query_attention")
    kv = args.get("num_query_groups") if gqa else heads
    head_dim = args.get("kv_channels") or (args["hidden_size"] // heads if heads and args.get("hidden_size") else None)
    return (
        (heads, "args 'num_attention_heads'") if heads else None,
        (kv, "args 'num_query_groups'" if gqa else "args (no group_query_attention: KV heads = heads)") if kv else None,
        (head_dim, "args 'kv_channels' (default hidden_size / heads)") if head_dim else None,
    )


def _geometry(args: Mapping[str, Any], overrides: HeadOverrides, name: str, rows: int, hidden: int,
              q_norm_shape: tuple[int, ...] | None, path: Any) -> tuple[str, Geometry]:
    heads, kv, head_dim = args_head_entries(args)
    if head_dim is None and q_norm_shape is not None and len(q_norm_shape) == 1 and q_norm_shape[0]:
        head_dim = (q_norm_shape[0], "q_layernorm size")
    hints = HeadHints.gather(overrides, heads, kv, head_dim, path=path)
    looked = "no args in the checkpoint"
    if args:
        layout = "grouped_gated" if args.get("attention_output_gate") else "grouped"
        return layout, fused_geometry(hints, name, rows, hidden, layout, path, looked=looked)
    # Without args the output gate is unknown: accept the split only if exactly
    # one of the two layouts fits the flags and the shape.
    fits = {}
    errors = []
    for layout in ("grouped", "grouped_gated"):
        try:
            fits[layout] = fused_geometry(hints, name, rows, hidden, layout, path, looked=looked)
        except CkptScanError as e:
            errors.append(e)
    if len(fits) == 1:
        return next(iter(fits.items()))
    if not fits:
        raise errors[0]
    raise CkptScanError(f"{rows} rows fit both a plain and an output-gated linear_qkv with these head counts; pass "
                        "--num-heads, --num-kv-heads and --head-dim together", path=path, tensor=name)


def _gain_offset(args: Mapping[str, Any], has_norm: bool, path: Any, name: str) -> float:
    if not has_norm:
        return 0.0
    if not args:
        raise CkptScanError("QK layernorm gains without args: whether they are zero-centred (--apply-layernorm-1p, "
                            "scale 1 + w) is unknown; describe it with --tensor-map (norm_offset)", path=path,
                            tensor=name)
    return norm_offset(args)
