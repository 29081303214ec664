"""Every layout reads the output family's tensors (the LM head, or the token
embedding when the head is tied, and the final norm) beside the model's last
layer, and the attention input norm with each layer; a checkpoint without a
head says so in the layout's notes instead of failing. The scanned values
are the dense float64 ones of the stored tensors (tests/monitors/test_output.py
has the brute force)."""

from __future__ import annotations

import pytest
import torch
from factories import llama_config, llama_tensors, random_weights, write_hf_checkpoint
from format_writers import GOLDEN_MEGATRON, write_nanogpt
from output_reference import brute_scales, brute_update

from ckptscan import scan_run
from ckptscan.errors import CkptScanError
from ckptscan.layouts import HeadOverrides, resolve_layout
from ckptscan.layouts.megatron import norm_offset
from ckptscan.scan import ScanOptions
from ckptscan.readers import open_checkpoint

D, V, HEADS = 32, 48, 4


def _roles(path, **overrides):
    layout = resolve_layout(open_checkpoint(path), HeadOverrides(**overrides))
    last = layout.layers[-1].roles
    inputs = [next((n for n, r in p.roles.items() if r == "input_norm"), None) for p in layout.layers]
    return layout, {role: name for name, role in last.items() if role in ("lm_head", "embedding", "final_norm")}, inputs


def _w(*shape, seed=0):
    return random_weights(shape, seed)


def test_hf_llama_untied_tied_and_told_untied(tmp_path):
    config = llama_config(layers=2, hidden=D, heads=HEADS, kv_heads=2)
    config["vocab_size"] = V
    tensors = llama_tensors(config, 1)
    tensors["model.norm.weight"] = torch.ones(D)
    untied = {**tensors, "lm_head.weight": _w(V, D, seed=5)}
    _, out, inputs = _roles(write_hf_checkpoint(tmp_path / "untied", untied, config))
    assert out == {"lm_head": "lm_head.weight", "final_norm": "model.norm.weight"}
    assert inputs == ["model.layers.0.input_layernorm.weight", "model.layers.1.input_layernorm.weight"]
    layout, out, _ = _roles(write_hf_checkpoint(tmp_path / "tied", tensors, {**config, "tie_word_embeddings": True}))
    assert out == {"embedding": "model.embed_tokens.weight", "final_norm": "model.norm.weight"}
    assert "output family: the head is tied to model.embed_tokens.weight" in layout.notes
    layout, out, _ = _roles(write_hf_checkpoint(tmp_path / "stage", tensors, {**config, "tie_word_embeddings": False}))
    assert out == {} and any(n.startswith("output family not judged: the config says the head is not tied")
                             for n in layout.notes)


def test_gpt2_ties_the_head_to_wte_and_reads_ln_1(tmp_path):
    tensors = {"transformer.wte.weight": _w(V, D), "transformer.ln_f.weight": torch.ones(D)}
    for i in range(2):
        tensors[f"transformer.h.{i}.attn.c_attn.weight"] = _w(D, 3 * D, seed=i + 1)
        tensors[f"transformer.h.{i}.ln_1.weight"] = torch.ones(D)
    config = {"model_type": "gpt2", "n_head": HEADS, "n_embd": D}
    _, out, inputs = _roles(write_hf_checkpoint(tmp_path / "g", tensors, config))
    assert out == {"embedding": "transformer.wte.weight", "final_norm": "transformer.ln_f.weight"}
    assert inputs == ["transformer.h.0.ln_1.weight", "transformer.h.1.ln_1.weight"]


def test_nanogpt_reads_wte_as_the_tied_head_of_a_compiled_model(tmp_path):
    tensors = {"transformer.wte.weight": _w(V, D), "lm_head.weight": _w(V, D), "transformer.ln_f.weight": torch.ones(D)}
    for i in range(2):
        tensors[f"transformer.h.{i}.attn.c_attn.weight"] = _w(3 * D, D, seed=i + 1)
        tensors[f"transformer.h.{i}.ln_1.weight"] = torch.ones(D)
    path = write_nanogpt(tmp_path / "n", tensors, {"n_head": HEADS, "n_embd": D}, 10)
    _, out, inputs = _roles(path)
    # (the reader names the tensors without torch.compile's `_orig_mod.`)
    assert out == {"embedding": "transformer.wte.weight", "final_norm": "transformer.ln_f.weight"}
    assert inputs == ["transformer.h.0.ln_1.weight", "transformer.h.1.ln_1.weight"]


def test_neox_torchtitan_litgpt_and_olmo_core_names(tmp_path):
    neox = {"gpt_neox.embed_in.weight": _w(V, D), "embed_out.weight": _w(V, D),
            "gpt_neox.final_layer_norm.weight": torch.ones(D),
            "gpt_neox.layers.0.attention.query_key_value.weight": _w(3 * D, D),
            "gpt_neox.layers.0.input_layernorm.weight": torch.ones(D)}
    _, out, inputs = _roles(write_hf_checkpoint(tmp_path / "neox", neox, {"model_type": "gpt_neox", "hidden_size": D,
                                                                            "num_attention_heads": HEADS}))
    assert out == {"lm_head": "embed_out.weight", "final_norm": "gpt_neox.final_layer_norm.weight"}
    assert inputs == ["gpt_neox.layers.0.input_layernorm.weight"]

    titan = {"tok_embeddings.weight": _w(V, D), "output.weight": _w(V, D), "norm.weight": torch.ones(D),
             "layers.0.attention.wq.weight": _w(D, D), "layers.0.attention.wk.weight": _w(D // 2, D),
             "layers.0.attention_norm.weight": torch.ones(D)}
    _, out, inputs = _roles(write_hf_checkpoint(tmp_path / "titan", titan, None), num_heads=HEADS)
    assert out == {"lm_head": "output.weight", "final_norm": "norm.weight"}
    assert inputs == ["layers.0.attention_norm.weight"]

    lit = {"transformer.wte.weight": _w(V, D), "lm_head.weight": _w(V, D), "transformer.ln_f.weight": torch.ones(D),
           "transformer.h.0.attn.qkv.weight": _w(3 * D, D), "transformer.h.0.norm_1.weight": torch.ones(D)}
    _, out, inputs = _roles(write_hf_checkpoint(tmp_path / "lit", lit, None), num_heads=HEADS, num_kv_heads=HEADS)
    assert out == {"lm_head": "lm_head.weight", "final_norm": "transformer.ln_f.weight"}
    assert inputs == ["transformer.h.0.norm_1.weight"]

    olmo = {"embeddings.weight": _w(V, D), "lm_head.w_out.weight": _w(V, D), "lm_head.norm.weight": torch.ones(D),
            "blocks.0.attention.w_q.weight": _w(D, D), "blocks.0.attention.w_k.weight": _w(D, D)}
    _, out, inputs = _roles(write_hf_checkpoint(tmp_path / "olmo", olmo, None), num_heads=HEADS)
    assert out == {"lm_head": "lm_head.w_out.weight", "final_norm": "lm_head.norm.weight"}
    assert inputs == [None]  # a reordered-norm block's attention_norm follows attention: not read


@pytest.mark.parametrize("run", ["dense", "legacy"])
def test_megatron_core_reads_the_head_the_final_norm_and_the_input_norm(run):
    # Real megatron-core saves (tests/golden/make_megatron.py): the untied
    # output_layer, the final norm, and the input norm torch_dist stores fused
    # into linear_qkv (the torch format keeps the local spec's own name).
    path = sorted((GOLDEN_MEGATRON / run).glob("iter_*"))[0]
    layout, out, inputs = _roles(path)
    assert out == {"lm_head": "output_layer.weight", "final_norm": "decoder.final_layernorm.weight"}
    norm = "self_attention.linear_qkv.layer_norm_weight" if run == "dense" else "input_layernorm.weight"
    assert inputs == [f"decoder.layers.{i}.{norm}" for i in range(2)]
    checkpoint = open_checkpoint(path)
    last = layout.layers[-1]
    weights = last.build({k: checkpoint.tensors.get(k) for k in last.tensors}, torch.float64)
    # args say nothing of --apply-layernorm-1p: the gains are the stored w
    assert torch.equal(weights.final_gain, checkpoint.tensors.get("decoder.final_layernorm.weight").double())
    assert torch.equal(weights.input_gain, checkpoint.tensors.get(f"decoder.layers.1.{norm}").double())


def test_megatron_zero_centred_gains_are_one_plus_w_when_either_flag_says_so():
    assert norm_offset({}) == 0.0
    assert norm_offset({"apply_layernorm_1p": True}) == 1.0
    assert norm_offset({"layernorm_zero_centered_gamma": True}) == 1.0
    # the newer flag, where present, is the one megatron-core reads
    assert norm_offset({"layernorm_zero_centered_gamma": False, "apply_layernorm_1p": True}) == 0.0


def test_a_head_of_the_wrong_width_is_one_error_naming_it(tmp_path):
    config = llama_config(layers=1, hidden=D, heads=HEADS, kv_heads=2)
    tensors = {**llama_tensors(config, 1), "lm_head.weight": _w(V, D + 1)}
    with pytest.raises(CkptScanError, match=r"not \[vocabulary, hidden 32\]"):
        resolve_layout(open_checkpoint(write_hf_checkpoint(tmp_path / "c", tensors, config)))


@pytest.mark.parametrize("tied", [False, True])
def test_a_scanned_run_gives_the_last_layer_the_heads_dense_values(tmp_path, tied):
    config = {**llama_config(layers=2, hidden=D, heads=HEADS, kv_heads=2), "vocab_size": V,
              "tie_word_embeddings": tied}
    tensors = llama_tensors(config, 2)
    tensors["model.norm.weight"] = torch.rand(D, generator=torch.Generator().manual_seed(3), dtype=torch.float64) + 0.5
    if not tied:
        tensors["lm_head.weight"] = _w(V, D, seed=9)
    head = "model.embed_tokens.weight" if tied else "lm_head.weight"
    stored = []
    for k in range(3):
        if k:
            tensors = {n: t + _w(*t.shape, seed=20 + k) * (0.3 if n == head else 0.05) for n, t in tensors.items()}
        write_hf_checkpoint(tmp_path / f"checkpoint-{100 * k}", tensors, config, dtype=torch.bfloat16)
        stored.append({n: t.to(torch.bfloat16) for n, t in tensors.items()})
    report = scan_run(tmp_path)
    full = scan_run(tmp_path, ScanOptions(full_spectrum=True))
    for k, pair in enumerate(report.pairs):
        assert ["output" in layer.families for layer in pair.layers] == [False, True]
        values = pair.layers[-1].families["output"]
        a, b = stored[k][head], stored[k + 1][head]
        expected = {**brute_scales(b, stored[k + 1]["model.norm.weight"].to(torch.float64)), **brute_update(a, b)}
        # The update's spectrum (a V·d² Gram) is computed only when asked for (--full-spectrum).
        assert full.pairs[k].layers[-1].families["output"] == pytest.approx(expected, rel=1e-9)
        assert values.pop("dw_head_entropy_norm") is None
        del expected["dw_head_entropy_norm"]
        assert values == pytest.approx(expected, rel=1e-9)
        assert pair.layers[-1].stored_dtype[("embedding" if tied else "lm_head")] == "BF16"
