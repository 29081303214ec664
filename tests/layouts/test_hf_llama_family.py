"""Hugging Face decoders with separate q_proj/k_proj: every model_type the
resolver claims, written in its on-disk layout, scanned, and checked per head
against dense float64 spectra of the blocks the test drew itself."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from factories import random_weights, write_hf_checkpoint
from layout_factories import (
    assert_heads_match,
    assert_router_matches,
    exact,
    head_pair,
    nudged,
    reference,
    router_pair,
    scan,
)

HIDDEN = 32


@dataclass
class Case:
    model_type: str
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 8
    norm: str | None = None  # "head": q_norm [d]; "flat": q_norm [H·d], k_norm [G·d]
    one_plus: bool = False  # Gemma: the norm scales by 1 + w
    router: str | None = None  # router key under the layer
    experts: int = 4
    dtype: torch.dtype = torch.bfloat16
    prefix: str = "model."
    multimodal: bool = False
    head_dim_in_config: bool = False


CASES = [
    Case("llama", dtype=torch.float32),
    Case("mistral", kv_heads=1),
    Case("qwen2", dtype=torch.float16),
    Case("qwen3", head_dim=16, norm="head", head_dim_in_config=True),
    Case("gemma", heads=4, kv_heads=1, head_dim=16, head_dim_in_config=True),
    Case("gemma2", head_dim=16, head_dim_in_config=True),
    Case("gemma3", head_dim=16, norm="head", one_plus=True, head_dim_in_config=True),
    Case("olmo", kv_heads=4),
    Case("olmo2", kv_heads=4, norm="flat"),
    Case("olmoe", kv_heads=4, norm="flat", router="mlp.gate.weight"),
    Case("mixtral", router="block_sparse_moe.gate.weight"),
    Case("qwen2_moe", router="mlp.gate.weight"),
    Case("qwen3_moe", norm="head", router="mlp.gate.weight", head_dim_in_config=True),
    # transformers v5 saves Mixtral's router as mlp.gate (and fused experts).
    Case("mixtral", router="mlp.gate.weight"),
    # Gemma 3 multimodal: settings under text_config, a vision tower beside the language model.
    Case("gemma3", head_dim=16, norm="head", one_plus=True, head_dim_in_config=True, multimodal=True,
         prefix="language_model.model."),
]


def _config(case: Case, layers: int) -> dict:
    text = {
        "model_type": case.model_type if not case.multimodal else "gemma3_text",
        "hidden_size": HIDDEN,
        "num_attention_heads": case.heads,
        "num_key_value_heads": case.kv_heads,
        "num_hidden_layers": layers,
    }
    if case.head_dim_in_config:
        text["head_dim"] = case.head_dim
    if case.router:
        text["num_local_experts" if case.model_type == "mixtral" else "num_experts"] = case.experts
        text["num_experts_per_tok"] = 2
    if case.multimodal:
        return {"model_type": "gemma3", "text_config": text, "vision_config": {"hidden_size": 24}}
    return text


def _gain(case: Case, heads: int, seed: int) -> torch.Tensor:
    size = case.head_dim if case.norm == "head" else heads * case.head_dim
    # Trained gains sit near 1 (near 0 for Gemma's 1 + w form); exact in the stored dtype.
    return (random_weights((size,), seed, 0.3) + (0.0 if case.one_plus else 1.0)).to(case.dtype).to(torch.float64)


def _folded(blocks: torch.Tensor, gain: torch.Tensor, one_plus: bool) -> torch.Tensor:
    scale = (1 + gain) if one_plus else gain
    return blocks * scale.reshape(-1, blocks.shape[1], 1) if scale.numel() > blocks.shape[1] else \
        blocks * scale.reshape(1, -1, 1)


def _checkpoint_pair(case: Case, tmp_path, layers: int = 2):
    """Two checkpoints in the family's exact on-disk layout, and per layer the
    folded head blocks and routers they must produce."""
    tensors = ({}, {})
    truth = []
    for i in range(layers):
        pair = head_pair(case.heads, case.kv_heads, case.head_dim, HIDDEN, seed=100 * i + 1, dtype=case.dtype)
        qs, ks = [pair.q_a, pair.q_b], [pair.k_a, pair.k_b]
        p = f"{case.prefix}layers.{i}."
        routers = router_pair(case.experts, HIDDEN, seed=100 * i + 50, dtype=case.dtype) if case.router else None
        for side, out in enumerate(tensors):
            out[p + "self_attn.q_proj.weight"] = qs[side].reshape(-1, HIDDEN)
            out[p + "self_attn.k_proj.weight"] = ks[side].reshape(-1, HIDDEN)
            out[p + "self_attn.v_proj.weight"] = exact((case.kv_heads * case.head_dim, HIDDEN), 7 + side, case.dtype)
            out[p + "self_attn.o_proj.weight"] = exact((HIDDEN, case.heads * case.head_dim), 9 + side, case.dtype)
            out[p + "input_layernorm.weight"] = torch.ones(HIDDEN, dtype=torch.float64)
            if case.model_type == "qwen2":
                out[p + "self_attn.q_proj.bias"] = exact((case.heads * case.head_dim,), 11 + side, case.dtype)
            if routers is not None:
                out[p + case.router] = routers[side]
                out[p + "mlp.experts.0.gate_proj.weight"] = exact((16, HIDDEN), 13 + side, case.dtype)
            if case.model_type == "qwen2_moe":
                out[p + "mlp.shared_expert_gate.weight"] = exact((1, HIDDEN), 15 + side, case.dtype)
        if case.norm:
            q_gain = _gain(case, case.heads, 100 * i + 20)
            k_gain = _gain(case, case.kv_heads, 100 * i + 21)
            gains = [(q_gain, k_gain), (nudged(q_gain, 100 * i + 22, case.dtype), nudged(k_gain, 100 * i + 23,
                                                                                          case.dtype))]
            for side, out in enumerate(tensors):
                out[p + "self_attn.q_norm.weight"], out[p + "self_attn.k_norm.weight"] = gains[side]
            qs = [_folded(q, g[0], case.one_plus) for q, g in zip(qs, gains)]
            ks = [_folded(k, g[1], case.one_plus) for k, g in zip(ks, gains)]
        truth.append((reference(qs[0], ks[0], qs[1], ks[1]), routers))
    if case.multimodal:
        for side, out in enumerate(tensors):
            vision = "vision_tower.vision_model.encoder.layers.0.self_attn."
            out[vision + "q_proj.weight"] = exact((24, 24), 30 + side, case.dtype)
            out[vision + "k_proj.weight"] = exact((24, 24), 32 + side, case.dtype)
    config = _config(case, layers)
    path_a = write_hf_checkpoint(tmp_path / "checkpoint-10", tensors[0], config, dtype=case.dtype)
    path_b = write_hf_checkpoint(tmp_path / "checkpoint-20", tensors[1], config, shards=2, dtype=case.dtype)
    return path_a, path_b, truth


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.model_type + ("-mm" if c.multimodal else "") +
                         ("-" + c.router.split(".")[0] if c.router else ""))
def test_heads_and_routers_match_the_dense_reference(case: Case, tmp_path):
    path_a, path_b, truth = _checkpoint_pair(case, tmp_path)
    report = scan(path_a, path_b)
    model = report.model
    assert (model.num_heads, model.num_kv_heads, model.head_dim, model.num_layers) == (
        case.heads, case.kv_heads, case.head_dim, len(truth))
    assert model.family == (case.model_type if not case.multimodal else "gemma3")
    for layer, (expected, routers) in zip(report.pairs[0].layers, truth):
        assert_heads_match(layer, expected)
        if routers is None:
            assert layer.router is None
        else:
            assert_router_matches(layer, *routers)
    if case.router:
        assert model.num_experts == case.experts and model.top_k == 2 and model.router_scoring == "softmax"


def test_a_gain_folded_as_w_instead_of_one_plus_w_would_disagree(tmp_path):
    """The Gemma check above can fail: reading Gemma 3's gains as plain w gives other entropies."""
    case = Case("gemma3", head_dim=16, norm="head", one_plus=True, head_dim_in_config=True)
    path_a, path_b, truth = _checkpoint_pair(case, tmp_path)
    config_path = path_a / "config.json"
    for path in (path_a, path_b):
        (path / "config.json").write_text(config_path.read_text().replace('"gemma3"', '"qwen3"'))
    report = scan(path_a, path_b)
    with pytest.raises(AssertionError):
        assert_heads_match(report.pairs[0].layers[0], truth[0][0])


def test_without_config_num_heads_alone_fixes_the_split(tmp_path):
    case = Case("llama", heads=8, kv_heads=2, head_dim=4, dtype=torch.float32)
    path_a, path_b, truth = _checkpoint_pair(case, tmp_path)
    for path in (path_a, path_b):
        (path / "config.json").unlink()
    from ckptscan.layouts import HeadOverrides

    report = scan(path_a, path_b, overrides=HeadOverrides(num_heads=8))
    assert (report.model.num_heads, report.model.num_kv_heads, report.model.head_dim) == (8, 2, 4)
    assert_heads_match(report.pairs[0].layers[1], truth[1][0])


def _qk_norm_run(tmp_path, extra_names: tuple[str, ...], flat: bool = False):
    """Two checkpoints with per-head (or flat) q_norm/k_norm and no config.json."""
    heads, kv_heads, d = 4, 2, 8
    pair = head_pair(heads, kv_heads, d, HIDDEN, seed=21, dtype=torch.float32)
    gq = exact((heads * d,) if flat else (d,), 22, torch.float32, scale=0.5)
    gk = exact((kv_heads * d,) if flat else (d,), 23, torch.float32, scale=0.5)
    paths = []
    for side, (q, k) in enumerate(((pair.q_a, pair.k_a), (pair.q_b, pair.k_b))):
        p = "model.layers.0."
        tensors = {p + "self_attn.q_proj.weight": q.reshape(-1, HIDDEN), p + "self_attn.k_proj.weight":
                   k.reshape(-1, HIDDEN), p + "self_attn.q_norm.weight": gq, p + "self_attn.k_norm.weight": gk}
        tensors.update({p + name + ".weight": torch.ones(HIDDEN) for name in extra_names})
        paths.append(write_hf_checkpoint(tmp_path / f"step_{side + 1}", tensors, None))
    return pair, gq, gk, paths


def _fold(blocks, gain, offset, heads=None):
    return blocks * (gain + offset).reshape(heads or 1, blocks.shape[1], 1)


def test_without_config_qk_norm_without_gemma_names_is_folded_as_w_and_fixes_the_heads(tmp_path):
    pair, gq, gk, paths = _qk_norm_run(tmp_path, ("input_layernorm", "post_attention_layernorm"))
    report = scan(*paths)  # no --num-heads: the per-head q_norm [d] gives d, so H = rows / d
    assert (report.model.family, report.model.num_heads, report.model.num_kv_heads) == ("qwen3-like", 4, 2)
    from ckptscan.pipeline.inspection import inspect_path

    notes = inspect_path(paths[0])["checkpoint"]["notes"]  # inspect says what was inferred, and from what
    assert any("QK-norm convention inferred from the tensor names" in n and "gain is w" in n for n in notes)
    assert any(n.startswith("query heads 4: ") and "per-head q_norm size 8" in n for n in notes)
    expected = reference(_fold(pair.q_a, gq, 0), _fold(pair.k_a, gk, 0), _fold(pair.q_b, gq, 0),
                         _fold(pair.k_b, gk, 0))
    assert_heads_match(report.pairs[0].layers[0], expected)


def test_without_config_gemma_names_fold_one_plus_w(tmp_path):
    pair, gq, gk, paths = _qk_norm_run(tmp_path, ("pre_feedforward_layernorm", "post_feedforward_layernorm"))
    report = scan(*paths)
    assert report.model.family == "gemma3-like"
    expected = reference(_fold(pair.q_a, gq, 1), _fold(pair.k_a, gk, 1), _fold(pair.q_b, gq, 1),
                         _fold(pair.k_b, gk, 1))
    assert_heads_match(report.pairs[0].layers[0], expected)


def test_without_config_flat_qk_norm_needs_the_head_count_and_is_folded_as_w(tmp_path):
    from ckptscan.errors import CkptScanError
    from ckptscan.layouts import HeadOverrides

    pair, gq, gk, paths = _qk_norm_run(tmp_path, ("post_feedforward_layernorm",), flat=True)
    with pytest.raises(CkptScanError, match="--num-heads, or --model-config"):
        scan(*paths)  # a flat [H·d] gain says nothing about d
    report = scan(*paths, overrides=HeadOverrides(num_heads=4))
    assert report.model.family == "olmo2-like"
    expected = reference(_fold(pair.q_a, gq, 0, 4), _fold(pair.k_a, gk, 0, 2), _fold(pair.q_b, gq, 0, 4),
                         _fold(pair.k_b, gk, 0, 2))
    assert_heads_match(report.pairs[0].layers[0], expected)
