"""`mla_plan` checks each layer against the layer-0 MLA geometry; a layer
with a query LoRA where layer 0 had a plain q_proj has no rank to check
against, and says so (it was a shape compared against [None, D])."""

from __future__ import annotations

import pytest

from ckptscan.errors import CkptScanError
from ckptscan.layouts.mla import MLAGeometry, MLATensors, mla_plan

H, NOPE, ROPE, VALUE, KV_RANK, Q_RANK, HIDDEN = 2, 4, 2, 4, 8, 6, 16


def lora_layer(attn: str) -> MLATensors:
    return MLATensors(kv_a=attn + "kv_a_proj_with_mqa.weight", kv_a_norm=attn + "kv_a_layernorm.weight",
                      kv_b=attn + "kv_b_proj.weight", q_a=attn + "q_a_proj.weight",
                      q_a_norm=attn + "q_a_layernorm.weight", q_b=attn + "q_b_proj.weight")


SHAPES = {"kv_a_proj_with_mqa.weight": (KV_RANK + ROPE, HIDDEN), "kv_a_layernorm.weight": (KV_RANK,),
          "kv_b_proj.weight": (H * (NOPE + VALUE), KV_RANK), "q_a_proj.weight": (Q_RANK, HIDDEN),
          "q_a_layernorm.weight": (Q_RANK,), "q_b_proj.weight": (H * (NOPE + ROPE), Q_RANK)}


def shape(name: str) -> tuple[int, ...]:
    return SHAPES[name.rsplit(".", 2)[-2] + ".weight"]


@pytest.mark.parametrize("q_rank", [Q_RANK, None])
def test_a_query_lora_needs_one_in_layer_0(q_rank):
    geometry = MLAGeometry(HIDDEN, H, NOPE, ROPE, VALUE, KV_RANK, q_rank, ())
    tensors = lora_layer("model.layers.1.self_attn.")
    if q_rank is not None:
        plan = mla_plan(1, geometry, tensors, None, shape, "ckpt", None)
        assert plan.roles[tensors.query] == "W_q_b"
        return
    with pytest.raises(CkptScanError, match="a query LoRA in this layer, but none in layer 0") as caught:
        mla_plan(1, geometry, tensors, None, shape, "ckpt", None)
    assert "tensor 'model.layers.1.self_attn.q_b_proj.weight'" in str(caught.value)
