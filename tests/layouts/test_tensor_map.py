"""User tensor maps: regex -> role for naming schemes no resolver knows.

Checkpoints with made-up (GGUF-like) names are written from per-head blocks
the test drew; scanned through a map, every head must match the dense
reference, and malformed maps must fail with a message that names the file."""

from __future__ import annotations

import json

import pytest
import torch
from factories import write_hf_checkpoint
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

from ckptscan.errors import CkptScanError
from ckptscan.layouts import HeadOverrides, load_tensor_map

D = 32
SEPARATE = """
family = "gguf-llama"
q = 'blk\\.(\\d+)\\.attn_q\\.weight'
k = 'blk\\.(\\d+)\\.attn_k\\.weight'
q_norm = 'blk\\.(\\d+)\\.attn_q_norm\\.weight'
k_norm = 'blk\\.(\\d+)\\.attn_k_norm\\.weight'
router = 'blk\\.(\\d+)\\.ffn_gate_inp\\.weight'
router_bias = 'blk\\.(\\d+)\\.exp_probs_b\\.bias'
num_heads = 4
norm_offset = 1.0
router_scoring = "sigmoid"
top_k = 2
"""


def test_separate_projections_with_one_plus_w_norms_and_sigmoid_router(tmp_path):
    heads, kv_heads, d, experts = 4, 2, 8, 4
    pairs = [head_pair(heads, kv_heads, d, D, seed=10 * i, dtype=torch.float32) for i in range(2)]
    gains = [exact((d,), 40 + i, torch.float32, 0.3) for i in range(4)]
    gains_b = [nudged(g, 50 + i, torch.float32) for i, g in enumerate(gains)]
    routers = router_pair(experts, D, 60, torch.float32)
    biases = (exact((experts,), 70, torch.float32), exact((experts,), 71, torch.float32))
    folded = []
    for side, name in enumerate(("a", "b")):
        tensors, truth = {"token_embd.weight": exact((8, D), 1, torch.float32)}, []
        for i, pair in enumerate(pairs):
            q, k = (pair.q_a, pair.k_a) if side == 0 else (pair.q_b, pair.k_b)
            g_q, g_k = (gains if side == 0 else gains_b)[2 * i:2 * i + 2]
            tensors.update({f"blk.{i}.attn_q.weight": q.reshape(-1, D), f"blk.{i}.attn_k.weight": k.reshape(-1, D),
                            f"blk.{i}.attn_q_norm.weight": g_q, f"blk.{i}.attn_k_norm.weight": g_k})
            if i == 1:  # only layer 1 is MoE
                tensors[f"blk.{i}.ffn_gate_inp.weight"] = routers[side]
                tensors[f"blk.{i}.exp_probs_b.bias"] = biases[side]
            truth.append((q * (1 + g_q)[None, :, None], k * (1 + g_k)[None, :, None]))
        folded.append(truth)
        write_hf_checkpoint(tmp_path / name, tensors, None)
    (tmp_path / "map.toml").write_text(SEPARATE)
    report = scan(tmp_path / "a", tmp_path / "b", tensor_map=load_tensor_map(tmp_path / "map.toml"))
    assert (report.model.family, report.model.num_kv_heads, report.model.router_scoring) == ("gguf-llama", 2,
                                                                                             "sigmoid")
    layers = report.pairs[0].layers
    for layer in layers:
        assert_heads_match(layer, reference(*folded[0][layer.layer], *folded[1][layer.layer]))
    assert layers[0].router is None
    assert_router_matches(layers[1], *routers, bias_b=biases[1])


@pytest.mark.parametrize("fused", ["qkv", "grouped", "per_head"])
def test_fused_and_transposed_weights(fused, tmp_path):
    heads, d = 4, 8
    kv_heads = {"qkv": 1, "grouped": 2, "per_head": heads}[fused]
    pairs = [head_pair(heads, kv_heads, d, D, seed=10 * i, dtype=torch.bfloat16) for i in range(2)]

    def lay_out(q, k, v):
        if fused == "qkv":
            return torch.cat([q, k, v]).reshape(-1, D)
        per = heads // kv_heads
        return torch.cat([torch.cat([q[g * per:(g + 1) * per], k[g:g + 1], v[g:g + 1]])
                          for g in range(kv_heads)]).reshape(-1, D)

    for side, name in enumerate(("a", "b")):
        tensors = {}
        for i, pair in enumerate(pairs):
            q, k = (pair.q_a, pair.k_a) if side == 0 else (pair.q_b, pair.k_b)
            # Stored [in, out], as a Conv1D would.
            tensors[f"layer_{i}/attention/qkv/kernel"] = lay_out(q, k, exact((kv_heads, d, D), 9, torch.bfloat16)).T
        write_hf_checkpoint(tmp_path / name, tensors, None, dtype=torch.bfloat16)
    settings = {"q": r"layer_(\d+)/attention/qkv/kernel", "fused": fused, "transpose": True, "num_heads": heads}
    if fused != "per_head":
        settings["num_kv_heads"] = kv_heads
    (tmp_path / "map.json").write_text(json.dumps(settings))
    report = scan(tmp_path / "a", tmp_path / "b", tensor_map=load_tensor_map(tmp_path / "map.json"))
    assert report.model.num_kv_heads == kv_heads
    for layer, pair in zip(report.pairs[0].layers, pairs, strict=True):
        assert_heads_match(layer, reference(pair.q_a, pair.k_a, pair.q_b, pair.k_b))


def test_flags_override_the_map_and_must_fit_the_shapes(tmp_path):
    pair = head_pair(4, 2, 8, D, seed=1, dtype=torch.float32)
    for side, name in enumerate(("a", "b")):
        q, k = (pair.q_a, pair.k_a) if side == 0 else (pair.q_b, pair.k_b)
        write_hf_checkpoint(tmp_path / name, {"x.0.q": q.reshape(-1, D), "x.0.k": k.reshape(-1, D)}, None)
    (tmp_path / "map.toml").write_text("q = 'x\\.(\\d+)\\.q'\nk = 'x\\.(\\d+)\\.k'\nnum_heads = 4\n")
    tensor_map = load_tensor_map(tmp_path / "map.toml")
    with pytest.raises(CkptScanError, match="do not split into 3 heads"):
        scan(tmp_path / "a", tmp_path / "b", tensor_map=tensor_map, overrides=HeadOverrides(num_heads=3))
    with pytest.raises(CkptScanError, match="--num-kv-heads says 4 KV heads"):
        scan(tmp_path / "a", tmp_path / "b", tensor_map=tensor_map, overrides=HeadOverrides(num_kv_heads=4))


@pytest.mark.parametrize("text, message", [
    ("k = 'a(\\d+)'", "needs a q pattern"),
    ("q = 'a(\\d+'", "invalid regex"),
    ("q = 'a\\.(\\d+)\\.(\\w+)'\nk = 'b(\\d+)'", "one capture group"),
    ("q = 'a(\\d+)'\nk = 'b(\\d+)'\nvalue = 'c(\\d+)'", "unknown tensor map entries \\['value'\\]"),
    ("q = 'a(\\d+)'", "needs a k pattern unless q is fused"),
    ("q = 'a(\\d+)'\nk = 'b(\\d+)'\nfused = 'qkv'", "and none when it is"),
    ("q = 'a(\\d+)'\nfused = 'zigzag'", "fused must be one of"),
    ("q = 'a(\\d+)'\nk = 'b(\\d+)'\nnum_heads = '4'", "num_heads has the wrong type"),
    ("q = 'a(\\d+)'\nk = 'b(\\d+)'\nrouter_scoring = 'relu'", "router_scoring must be"),
    ("q = [", "invalid tensor map"),
])
def test_malformed_maps_are_refused_naming_the_file(text, message, tmp_path):
    path = tmp_path / "map.toml"
    path.write_text(text)
    with pytest.raises(CkptScanError, match=message) as error:
        load_tensor_map(path)
    assert str(path) in str(error.value)


def test_a_map_that_does_not_fit_the_checkpoint_is_an_error(tmp_path):
    pair = head_pair(4, 4, 8, D, seed=1, dtype=torch.float32)
    tensors = {"x.0.q": pair.q_a.reshape(-1, D), "x.0.k": pair.k_a.reshape(-1, D), "x.1.q": pair.q_a.reshape(-1, D),
               "y.1.q": pair.q_a.reshape(-1, D)}
    for name in ("a", "b"):
        write_hf_checkpoint(tmp_path / name, tensors, None)
    cases = {
        "q = 'z\\.(\\d+)\\.q'\nk = 'x\\.(\\d+)\\.k'\nnum_heads = 4": "matches no tensor",
        "q = 'x\\.(\\d+)\\.q'\nk = 'x\\.(\\d+)\\.k'\nnum_heads = 4": "k pattern matches nothing in layers \\[1\\]",
        "q = '[xy]\\.(\\d+)\\.q'\nk = 'x\\.(\\d+)\\.k'\nnum_heads = 4": "matches both 'x.1.q' and 'y.1.q'",
    }
    for i, (text, message) in enumerate(cases.items()):
        (tmp_path / f"map{i}.toml").write_text(text)
        with pytest.raises(CkptScanError, match=message):
            scan(tmp_path / "a", tmp_path / "b", tensor_map=load_tensor_map(tmp_path / f"map{i}.toml"))
