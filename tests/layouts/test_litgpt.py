"""litgpt `lit_model.pth` beside `model_config.yaml`: blocked qkv (litgpt >= 0.5,
also seen in the golden run), the legacy per-group interleaved `attn.attn`
(from litgpt's source: not seen in a real file), flat OLMo2-style QK-norm
gains and Gemma's (1 + w). Rows are fused by the test from head blocks it drew
first, and the scan is compared per head with their dense reference."""

from __future__ import annotations

import pytest
import torch
import yaml
from layout_factories import assert_heads_match, exact, head_pair, reference, scan

from ckptscan.errors import CkptScanError
from ckptscan.readers import open_checkpoint

D, H, G, R = 32, 4, 2, 8
F64 = torch.float64


def blocked(q, k, v):
    return torch.cat([q.reshape(-1, D), k.reshape(-1, D), v.reshape(-1, D)])


def grouped(q, k, v):
    """litgpt < 0.5 `attn.attn`: G × [q·(H/G) | k | v] (qkv_reassemble's inverse)."""
    per = q.shape[0] // k.shape[0]
    return torch.cat([torch.cat([q[g * per:(g + 1) * per], k[g:g + 1], v[g:g + 1]]).reshape(-1, D)
                      for g in range(k.shape[0])])


def write_litgpt(folder, step, blocks, fuse, name="tiny", gains=None, norm_type="default"):
    """`fabric.save(step-N/lit_model.pth, {"model", "iter_num", "step_count"})` + model_config.yaml."""
    folder.mkdir(parents=True)
    q, k = blocks
    v = exact(k.shape, 99, torch.float32)
    tensor = "qkv" if fuse is blocked else "attn"
    model = {f"transformer.h.0.attn.{tensor}.weight": fuse(q, k, v).float(),
             "transformer.wte.weight": torch.zeros(8, D)}
    if gains is not None:
        model["transformer.h.0.attn.norm_q.weight"], model["transformer.h.0.attn.norm_k.weight"] = gains
    torch.save({"model": model, "iter_num": 2 * step, "step_count": step}, folder / "lit_model.pth")
    config = {"name": name, "n_layer": 1, "n_head": H, "n_query_groups": G, "head_size": R, "n_embd": D,
              "norm_class_name": "RMSNorm", "norm_qk": gains is not None, "norm_qk_type": norm_type}
    (folder / "model_config.yaml").write_text(yaml.safe_dump(config))
    return folder


@pytest.mark.parametrize("fuse", [blocked, grouped], ids=["qkv-blocked", "legacy-attn-grouped"])
def test_fused_qkv_splits_into_heads(tmp_path, fuse):
    pair = head_pair(H, G, R, D, seed=3, dtype=torch.float32)
    a = write_litgpt(tmp_path / "step-00000010", 10, (pair.q_a, pair.k_a), fuse)
    b = write_litgpt(tmp_path / "step-00000020", 20, (pair.q_b, pair.k_b), fuse)
    report = scan(a, b)
    assert (report.model.family, report.model.num_heads, report.model.num_kv_heads) == ("litgpt", H, G)
    assert [c.step for c in report.checkpoints] == [10, 20]  # step_count, not iter_num
    assert_heads_match(report.pairs[0].layers[0], reference(pair.q_a, pair.k_a, pair.q_b, pair.k_b))


@pytest.mark.parametrize("name, norm_type, offset", [("tiny-qwen3", "default", 0.0), ("tiny-olmo2", "olmo2", 0.0),
                                                     ("Gemma-3-tiny", "default", 1.0)])
def test_qk_norm_gains_are_folded_by_litgpts_convention(tmp_path, name, norm_type, offset):
    pair = head_pair(H, G, R, D, seed=5, dtype=torch.float32)
    flat = norm_type == "olmo2"
    gq = exact((H * R,) if flat else (R,), 7, torch.float32, scale=0.5)
    gk = exact((G * R,) if flat else (R,), 8, torch.float32, scale=0.5)
    paths = [write_litgpt(tmp_path / f"step-{s:08d}", s, blocks, blocked, name, (gq.float(), gk.float()), norm_type)
             for s, blocks in ((1, (pair.q_a, pair.k_a)), (2, (pair.q_b, pair.k_b)))]

    def fold(blocks, gain, heads):
        scale = (gain + offset).reshape(heads if flat else 1, R, 1)
        return blocks * scale

    expected = reference(fold(pair.q_a, gq, H), fold(pair.k_a, gk, G), fold(pair.q_b, gq, H), fold(pair.k_b, gk, G))
    assert_heads_match(scan(*paths).pairs[0].layers[0], expected)


def test_without_model_config_yaml_the_error_names_what_would_help(tmp_path):
    pair = head_pair(H, G, R, D, seed=3, dtype=torch.float32)
    folder = write_litgpt(tmp_path / "step-00000001", 1, (pair.q_a, pair.k_a), blocked)
    (folder / "model_config.yaml").unlink()
    from ckptscan.layouts import resolve_layout

    with pytest.raises(CkptScanError, match=r"no model_config.yaml beside lit_model.pth\); pass --num-heads"):
        resolve_layout(open_checkpoint(folder))


def test_litgpts_final_folder_joins_the_run_at_the_step_it_records(tmp_path):
    from ckptscan.pipeline.discovery import discover_run

    pair = head_pair(H, G, R, D, seed=3, dtype=torch.float32)
    write_litgpt(tmp_path / "step-00000010", 10, (pair.q_a, pair.k_a), blocked)
    write_litgpt(tmp_path / "final", 15, (pair.q_b, pair.k_b), blocked)  # training ended between saves
    run = discover_run(tmp_path)
    assert [(c.step, c.path.name) for c in run.checkpoints] == [(10, "step-00000010"), (15, "final")]
