"""DeepSeek-V2/V3 multi-head latent attention and routers.

The test draws each head's up-projection rows and the shared low-rank factors
itself, forms the content blocks Q_h = q_b[h, nope]·diag(γ_q)·q_a and
K_h = kv_b[h, k_nope]·diag(γ_kv)·kv_a[:rkv] in numpy float64, and only then
concatenates the heads into q_b_proj / kv_b_proj as transformers stores them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pytest
import torch
from factories import random_weights
from layout_factories import F64, assert_heads_match, assert_router_matches, exact, nudged, reference, scan
from safetensors.torch import save_file

from ckptscan.errors import CkptScanError
from ckptscan.layouts import HeadOverrides, resolve_layout
from ckptscan.readers import open_checkpoint

H, NOPE, ROPE, V, Q_RANK, KV_RANK, D, E = 4, 8, 4, 6, 12, 10, 32, 8
DTYPE = torch.bfloat16


@dataclass
class MLALayer:
    """One layer's factors, float64 values exact in the stored dtype."""

    q_a: torch.Tensor | None  # [rq, D] (None: no query LoRA)
    q_norm: torch.Tensor | None  # [rq]
    q_nope: torch.Tensor  # [H, dn, rq or D]
    q_rope: torch.Tensor  # [H, dr, rq or D]
    kv_latent: torch.Tensor  # [rkv, D]
    k_rope: torch.Tensor  # [dr, D]
    kv_norm: torch.Tensor  # [rkv]
    k_nope: torch.Tensor  # [H, dn, rkv]
    value: torch.Tensor  # [H, dv, rkv]

    def nudged(self, seed: int) -> MLALayer:
        return MLALayer(*(None if x is None else nudged(x, seed + i, DTYPE) for i, x in enumerate(vars(self).values())))

    def content(self) -> tuple[np.ndarray, np.ndarray]:
        """Reference Q_h, K_h [H, dn, D], formed independently in numpy."""
        if self.q_a is None:
            q = self.q_nope.numpy()
        else:
            q = self.q_nope.numpy() @ (np.diag(self.q_norm.numpy()) @ self.q_a.numpy())
        k = self.k_nope.numpy() @ (np.diag(self.kv_norm.numpy()) @ self.kv_latent.numpy())
        return q, k

    def rope(self) -> tuple[np.ndarray, np.ndarray]:
        q = self.q_rope.numpy() if self.q_a is None else \
            self.q_rope.numpy() @ (np.diag(self.q_norm.numpy()) @ self.q_a.numpy())
        return q, self.k_rope.numpy()[None]

    def tensors(self, prefix: str) -> dict[str, torch.Tensor]:
        attn = prefix + "self_attn."
        out = {
            attn + "kv_a_proj_with_mqa.weight": torch.cat([self.kv_latent, self.k_rope]),
            attn + "kv_a_layernorm.weight": self.kv_norm,
            attn + "kv_b_proj.weight": torch.cat([self.k_nope, self.value], dim=1).reshape(-1, KV_RANK),
            attn + "o_proj.weight": exact((D, H * V), 3, DTYPE),
        }
        query = torch.cat([self.q_nope, self.q_rope], dim=1).reshape(H * (NOPE + ROPE), -1)
        if self.q_a is None:
            out[attn + "q_proj.weight"] = query
        else:
            out.update({attn + "q_a_proj.weight": self.q_a, attn + "q_a_layernorm.weight": self.q_norm,
                        attn + "q_b_proj.weight": query})
        return out


def mla_layer(seed: int, lora: bool = True) -> MLALayer:
    width = Q_RANK if lora else D

    def gain(size, s):
        return (random_weights((size,), s, 0.3) + 1.0).to(DTYPE).to(F64)

    return MLALayer(
        q_a=exact((Q_RANK, D), seed, DTYPE) if lora else None,
        q_norm=gain(Q_RANK, seed + 1) if lora else None,
        q_nope=exact((H, NOPE, width), seed + 2, DTYPE),
        q_rope=exact((H, ROPE, width), seed + 3, DTYPE),
        kv_latent=exact((KV_RANK, D), seed + 4, DTYPE),
        k_rope=exact((ROPE, D), seed + 5, DTYPE),
        kv_norm=gain(KV_RANK, seed + 6),
        k_nope=exact((H, NOPE, KV_RANK), seed + 7, DTYPE),
        value=exact((H, V, KV_RANK), seed + 8, DTYPE),
    )


def v3_config(**extra) -> dict:
    return {"model_type": "deepseek_v3", "hidden_size": D, "num_attention_heads": H, "num_key_value_heads": H,
            "num_hidden_layers": 3, "first_k_dense_replace": 1, "n_routed_experts": E, "num_experts_per_tok": 2,
            "q_lora_rank": Q_RANK, "kv_lora_rank": KV_RANK, "qk_nope_head_dim": NOPE, "qk_rope_head_dim": ROPE,
            "v_head_dim": V, "head_dim": ROPE, "num_nextn_predict_layers": 1, **extra}


def write(directory, tensors: dict[str, torch.Tensor], config: dict | None) -> None:
    """model.safetensors as DeepSeek stores it: bf16 weights, float32 scales
    and correction biases, FP8 codes as they are."""
    directory.mkdir(parents=True)
    if config is not None:
        (directory / "config.json").write_text(json.dumps(config))

    def stored(name: str, value: torch.Tensor) -> torch.Tensor:
        if value.dtype == torch.float8_e4m3fn:
            return value
        return value.float() if name.endswith(("_scale_inv", "e_score_correction_bias")) else value.to(DTYPE)

    save_file({k: stored(k, v).contiguous() for k, v in tensors.items()}, directory / "model.safetensors")


@pytest.fixture
def v3_pair(tmp_path):
    """Layer 0 dense, layers 1-2 MoE with sigmoid routers and correction
    biases, layer 3 the MTP module (num_hidden_layers = 3)."""
    layers = [mla_layer(100 * i) for i in range(4)]
    sides = [layers, [layer.nudged(7 + 100 * i) for i, layer in enumerate(layers)]]
    routers = {i: exact((E, D), 500 + i, DTYPE, 0.2) for i in (1, 2, 3)}
    routers = {i: (w, nudged(w, 600 + i, DTYPE)) for i, w in routers.items()}
    biases = {i: (exact((E,), 700 + i, torch.float32), exact((E,), 800 + i, torch.float32)) for i in routers}
    paths = []
    for side, name in enumerate(("checkpoint-100", "checkpoint-200")):
        tensors = {}
        for i, layer in enumerate(sides[side]):
            p = f"model.layers.{i}."
            tensors.update(layer.tensors(p))
            if i in routers:
                tensors[p + "mlp.gate.weight"] = routers[i][side]
                tensors[p + "mlp.gate.e_score_correction_bias"] = biases[i][side].float()
                tensors[p + "mlp.shared_experts.gate_proj.weight"] = exact((16, D), 9, DTYPE)
            else:
                tensors[p + "mlp.gate_proj.weight"] = exact((16, D), 9, DTYPE)
        tensors["model.layers.3.eh_proj.weight"] = exact((D, 2 * D), 11, DTYPE)
        tensors["model.layers.3.enorm.weight"] = torch.ones(D)
        write(tmp_path / name, tensors, v3_config())
        paths.append(tmp_path / name)
    return paths, sides, routers, biases


def test_v3_content_heads_routers_and_skipped_layers(v3_pair):
    (path_a, path_b), sides, routers, biases = v3_pair
    report = scan(path_a, path_b)
    model = report.model
    assert (model.family, model.num_layers, model.num_heads, model.num_kv_heads, model.head_dim,
            model.rope_head_dim) == ("deepseek_v3", 3, H, H, NOPE, ROPE)
    assert (model.num_experts, model.top_k, model.router_scoring) == (E, 2, "sigmoid")
    layers = report.pairs[0].layers
    assert [layer.layer for layer in layers] == [0, 1, 2]  # layer 3 is the MTP module
    for layer in layers:
        (qa, ka), (qb, kb) = sides[0][layer.layer].content(), sides[1][layer.layer].content()
        assert_heads_match(layer, reference(qa, ka, qb, kb))
    assert layers[0].router is None  # first_k_dense_replace
    for i in (1, 2):
        assert_router_matches(layers[i], *routers[i], bias_b=biases[i][1])


def test_v3_rope_terms_are_the_shared_key_and_each_heads_rope_rows(v3_pair):
    (path_a, _), sides, _, _ = v3_pair
    ckpt = open_checkpoint(path_a)
    layout = resolve_layout(ckpt)
    plan = layout.layers[1]
    weights = plan.build({name: ckpt.tensors.get(name) for name in plan.tensors}, torch.float64)
    rope_q, rope_k = sides[0][1].rope()
    np.testing.assert_allclose(weights.rope_q.numpy(), rope_q, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(weights.rope_k.numpy(), rope_k, rtol=0, atol=0)
    assert weights.router_scoring == "sigmoid"


def test_v3_rope_term_is_monitored_against_dense_brute_force(v3_pair):
    (path_a, path_b), sides, _, _ = v3_pair
    layers = scan(path_a, path_b).pairs[0].layers
    for layer in layers:
        (qa, ka), (qb, kb) = sides[0][layer.layer].rope(), sides[1][layer.layer].rope()
        expected = reference(qa, ka, qb, kb)
        att = layer.attention
        assert att.rope_delta2_entropy == pytest.approx(np.mean(expected["delta2"]), rel=1e-7)
        assert att.rope_dwq_entropy == pytest.approx(np.mean(expected["dwq"]), rel=1e-7)
        assert att.rope_dwk_entropy == pytest.approx(expected["dwk"][0], rel=1e-7)
        bound = max(np.linalg.svd(qb[h].T @ kb[0], compute_uv=False)[0] for h in range(len(qb)))
        assert att.rope_qk_logit_bound == pytest.approx(bound, rel=1e-9)
        assert att.rope_delta2_entropy != pytest.approx(att.delta2_entropy, rel=1e-3)


def test_v2_lite_query_without_lora_and_softmax_router(tmp_path):
    layers = [mla_layer(100 * i, lora=False) for i in range(2)]
    sides = [layers, [layer.nudged(3 + 100 * i) for i, layer in enumerate(layers)]]
    router_a = exact((E, D), 40, DTYPE, 0.2)
    router = (router_a, nudged(router_a, 41, DTYPE))
    config = {"model_type": "deepseek_v2", "hidden_size": D, "num_attention_heads": H, "num_hidden_layers": 2,
              "first_k_dense_replace": 1, "n_routed_experts": E, "num_experts_per_tok": 2, "q_lora_rank": None,
              "kv_lora_rank": KV_RANK, "qk_nope_head_dim": NOPE, "qk_rope_head_dim": ROPE, "v_head_dim": V,
              "scoring_func": "softmax"}
    paths = []
    for side, name in enumerate(("a", "b")):
        tensors = {}
        for i, layer in enumerate(sides[side]):
            tensors.update(layer.tensors(f"model.layers.{i}."))
        tensors["model.layers.1.mlp.gate.weight"] = router[side]
        write(tmp_path / name, tensors, config)
        paths.append(tmp_path / name)
    report = scan(*paths)
    assert report.model.router_scoring == "softmax"
    for layer in report.pairs[0].layers:
        (qa, ka), (qb, kb) = sides[0][layer.layer].content(), sides[1][layer.layer].content()
        assert_heads_match(layer, reference(qa, ka, qb, kb))
    assert_router_matches(report.pairs[0].layers[1], *router)


def test_fp8_block_scaled_weights_are_split_after_dequantisation(tmp_path):
    """DeepSeek-V3 releases store F8_E4M3 weights with block scales; with 8x8
    blocks a head's rows span several scales, so a split before dequantising
    (or with the wrong scale rows) would not agree with the reference."""
    block = 8
    paths, truth = [], []
    for side, name in enumerate(("a", "b")):
        layer = mla_layer(5 + side)
        tensors = layer.tensors("model.layers.0.")
        for key in ("model.layers.0.self_attn.q_b_proj.weight", "model.layers.0.self_attn.kv_b_proj.weight"):
            values = tensors[key]
            rows, cols = values.shape
            # Power-of-two scales: code × scale is exact in float32 and float64.
            scale = 2.0 ** -torch.randint(4, 8, ((rows + block - 1) // block, (cols + block - 1) // block),
                                          generator=torch.Generator().manual_seed(side)).double()
            full = scale.repeat_interleave(block, 0)[:rows].repeat_interleave(block, 1)[:, :cols]
            codes = (values / full).to(torch.float8_e4m3fn)
            tensors[key] = codes
            tensors[key + "_scale_inv"] = scale.float()
            dequantised = codes.to(F64) * full
            if key.endswith("q_b_proj.weight"):
                parts = dequantised.reshape(H, NOPE + ROPE, Q_RANK)
                layer.q_nope, layer.q_rope = parts[:, :NOPE], parts[:, NOPE:]
            else:
                parts = dequantised.reshape(H, NOPE + V, KV_RANK)
                layer.k_nope, layer.value = parts[:, :NOPE], parts[:, NOPE:]
        write(tmp_path / name, tensors, v3_config(num_hidden_layers=1,
                                                   quantization_config={"weight_block_size": [block, block]}))
        paths.append(tmp_path / name)
        truth.append(layer.content())
    report = scan(*paths)
    assert_heads_match(report.pairs[0].layers[0], reference(*truth[0], *truth[1]))


def test_without_config_heads_come_from_the_flag_and_dims_from_the_shapes(tmp_path):
    paths = []
    sides = [mla_layer(1), mla_layer(2)]
    for side, name in enumerate(("a", "b")):
        tensors = sides[side].tensors("model.layers.0.")
        # Without num_hidden_layers the MTP block is known by its eh_proj.
        tensors.update(mla_layer(3).tensors("model.layers.1."))
        tensors["model.layers.1.eh_proj.weight"] = exact((D, 2 * D), 4, DTYPE)
        write(tmp_path / name, tensors, None)
        paths.append(tmp_path / name)
    with pytest.raises(CkptScanError, match="--num-heads"):
        scan(*paths)
    with pytest.raises(CkptScanError, match="do not split into 3 heads"):
        scan(*paths, overrides=HeadOverrides(num_heads=3))
    report = scan(*paths, overrides=HeadOverrides(num_heads=H))
    assert (report.model.head_dim, report.model.rope_head_dim, report.model.num_layers) == (NOPE, ROPE, 1)
    assert_heads_match(report.pairs[0].layers[0], reference(*sides[0].content(), *sides[1].content()))


def test_a_config_that_contradicts_the_shapes_is_an_error(tmp_path):
    layer = mla_layer(1)
    for name in ("a", "b"):
        write(tmp_path / name, layer.tensors("model.layers.0."), v3_config(num_hidden_layers=1, qk_nope_head_dim=6))
    with pytest.raises(CkptScanError, match="qk_nope_head_dim' is 6 but the tensor shapes give 8"):
        scan(tmp_path / "a", tmp_path / "b")
