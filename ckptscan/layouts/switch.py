"""Switch Transformers: T5 attention and top-1 `router.classifier` routers.

Encoder block i: `encoder.block.{i}.layer.0.SelfAttention.{q,k}.weight`
[H·d_kv, d_model] and, in sparse blocks, `encoder.block.{i}.layer.1.mlp.
router.classifier.weight` [E, d_model]; decoder blocks add cross-attention as
layer.1, so their router is under layer.2 (TF `switch_transformers`: the
block's layer list is [self-attention, (cross-attention,) feed-forward]).
Heads are contiguous rows (T5Attention views (H, d_kv)); `num_heads`,
`d_kv`, `num_experts` come from config.json. Encoder blocks are layers 0…Le-1
and decoder blocks Le…; cross-attention is not monitored. The router's
optional `classifier.bias` is a logit bias, not a selection bias, and is not
read.
"""

from __future__ import annotations

import re

from ckptscan.errors import CkptScanError
from ckptscan.layouts.base import HeadOverrides, ModelLayout, config_entry, config_value
from ckptscan.layouts.geometry import HeadHints, separate_geometry
from ckptscan.layouts.plan import QKTensors, RouterTensors, layer_plan, model_info
from ckptscan.readers.base import Checkpoint

MODEL_TYPES = {"switch_transformers"}

_Q = re.compile(r"(?P<stack>(?:.*\.)?(?:encoder|decoder))\.block\.(?P<block>\d+)\.layer\.0\.SelfAttention\.q\.weight")
_ROUTER = re.compile(r"(?P<block>.*\.block\.\d+)\.layer\.\d+\.mlp\.router\.classifier\.weight")


def matches(ckpt: Checkpoint, keys: set[str]) -> bool:
    return any(k.endswith("router.classifier.weight") for k in keys) and any(_Q.fullmatch(k) for k in keys)


def resolve(ckpt: Checkpoint, keys: set[str], overrides: HeadOverrides) -> ModelLayout:
    path, config = ckpt.path, ckpt.config
    stacks: dict[str, dict[int, str]] = {}
    for key in keys:
        match = _Q.fullmatch(key)
        if match:
            stacks.setdefault(match.group("stack"), {})[int(match.group("block"))] = key
    order = sorted(stacks, key=lambda s: (not s.endswith("encoder"), s))
    if not order:
        raise CkptScanError("no '*block.N.layer.0.SelfAttention.q.weight' tensors found", path=path)
    routers = {m.group("block"): k for k in keys if (m := _ROUTER.fullmatch(k))}

    shape = ckpt.tensors.shape
    blocks = [(stack, i, stacks[stack][i]) for stack in order for i in sorted(stacks[stack])]
    first = blocks[0][2]
    hints = HeadHints.gather(overrides, num_heads=config_entry(config, "num_heads"),
                             head_dim=config_entry(config, "d_kv"), path=path)
    geometry = separate_geometry(hints, (first, shape(first)), (first.replace(".q.", ".k."),
                                 shape(first.replace(".q.", ".k."))), path, looked="no config.json with num_heads")
    config_experts = config_value(config, "num_experts")
    plans = []
    notes = list(geometry.notes)
    for layer, (stack, block, q_name) in enumerate(blocks):
        notes.append(f"layer {layer} = {stack}.block.{block}")
        router = routers.get(f"{stack}.block.{block}")
        if router is not None and config_experts is not None and shape(router)[0] != config_experts:
            raise CkptScanError(f"router has {shape(router)[0]} rows but config 'num_experts' is {config_experts}",
                                path=path, tensor=router)
        qk = QKTensors(q_name, q_name.replace(".q.", ".k."))
        plans.append(layer_plan(layer, geometry, qk, RouterTensors(router) if router else None, shape, path,
                                router_scoring="softmax"))
    info = model_info("switch_transformers", geometry, plans, shape, top_k=1, router_scoring="softmax")
    return ModelLayout(info, plans, notes)
