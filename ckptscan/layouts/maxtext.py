"""MaxText (JAX/Flax) attention in Orbax checkpoints.

`{prefix}decoder.layers.{i}.self_attention.query.kernel` [D, H, d] and
`key.kernel` [D, G, d]: Flax `DenseGeneral` kernels, input axis first
(`kernel_axes=("embed", "q_heads", "kv")`, MaxText `layers/attentions.py`).
Scanned layers are stacked on axis 1 and exposed per layer by the Orbax
reader; unscanned ones are named `layers_{i}`. Query head h is
`kernel[:, h, :]ᵀ` [d, D], so the geometry is in the shapes and no config is
needed. These names come from MaxText's source; the golden Orbax run is
written by Orbax with a MaxText-shaped parameter tree, not by MaxText itself.
QK-norm gains (`query_norm`/`key_norm`) are refused: their convention here is
not verified.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

import torch

from ckptscan.errors import CkptScanError
from ckptscan.layouts.base import HeadOverrides, LayerPlan, LayerWeights, ModelLayout, find_layers
from ckptscan.layouts.geometry import Geometry
from ckptscan.layouts.plan import model_info
from ckptscan.readers.base import Checkpoint

MODEL_TYPES: set[str] = set()

_QUERY = re.compile(r"(?P<prefix>.*?)decoder\.layers[._](?P<layer>\d+)\.self_attention\.query\.kernel")


def matches(ckpt: Checkpoint, keys: set[str]) -> bool:
    return any(_QUERY.fullmatch(k) for k in keys if k.endswith("query.kernel"))


def resolve(ckpt: Checkpoint, keys: set[str], overrides: HeadOverrides) -> ModelLayout:
    path, shape = ckpt.path, ckpt.tensors.shape
    layers = find_layers(keys, _QUERY, path, "*decoder.layers.N.self_attention.query.kernel")
    first = layers[min(layers)]
    k_first = first[: -len("query.kernel")] + "key.kernel"
    if k_first not in keys:
        raise CkptScanError("no matching key kernel", path=path, tensor=k_first)
    q_shape, k_shape = tuple(shape(first)), tuple(shape(k_first))
    if len(q_shape) != 3 or len(k_shape) != 3 or q_shape[0] != k_shape[0] or q_shape[2] != k_shape[2]:
        raise CkptScanError(f"query/key kernels of shapes {list(q_shape)} and {list(k_shape)} are not [D, heads, d]",
                            path=path, tensor=first)
    hidden, heads, head_dim = q_shape
    kv_heads = k_shape[1]
    for flag, value, found in (("--num-heads", overrides.num_heads, heads),
                               ("--num-kv-heads", overrides.num_kv_heads, kv_heads),
                               ("--head-dim", overrides.head_dim, head_dim)):
        if value is not None and value != found:
            raise CkptScanError(f"{flag} {value} contradicts the kernel shapes ({found})", path=path, tensor=first)
    if heads % kv_heads:
        raise CkptScanError(f"{heads} query heads do not group over {kv_heads} KV heads", path=path)
    geometry = Geometry(hidden, heads, kv_heads, head_dim,
                        (f"query heads {heads}, head_dim {head_dim}: {first} shape [D, H, d]",
                         f"KV heads {kv_heads}: {k_first} shape [D, G, d]"))
    plans = []
    for layer in sorted(layers):
        q_name = layers[layer]
        attention = q_name[: -len("query.kernel")]
        k_name = attention + "key.kernel"
        norm = next((attention + n for n in ("query_norm.scale", "key_norm.scale") if attention + n in keys), None)
        if norm is not None:
            raise CkptScanError("MaxText QK-norm gains: convention not verified; describe the layout with "
                                "--tensor-map", path=path, tensor=norm)
        for name, expected in ((q_name, q_shape), (k_name, k_shape)):
            if tuple(shape(name)) != expected:
                raise CkptScanError(f"shape {list(shape(name))} but layer {min(layers)} has {list(expected)}",
                                    path=path, tensor=name)
        roles = {q_name: "W_q (kernel [D, H, d])", k_name: "W_k (kernel [D, G, d])"}
        plans.append(LayerPlan(layer, (q_name, k_name), _builder(q_name, k_name), roles))
    return ModelLayout(model_info("maxtext", geometry, plans, shape), plans, list(geometry.notes))


def _builder(q_name: str, k_name: str) -> Any:
    def build(raw: Mapping[str, torch.Tensor], dtype: torch.dtype) -> LayerWeights:
        # kernel [D, n, d] -> head blocks [n, d, D] (head h is kernel[:, h, :]ᵀ)
        return LayerWeights(q=raw[q_name].permute(1, 2, 0).to(dtype), k=raw[k_name].permute(1, 2, 0).to(dtype))

    return build
