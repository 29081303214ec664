"""The checkpoint a report proposes to resume from is checked against an
independent float64 brute force of the weights (issue 51): each query head's
logit scale ‖D_γ W_q,hᵀ W_k,g D_γ‖_F / √r, from the dense d × d matrix of
the saved weights in float64 (numpy, not ckptscan's Grams), against the
ceiling at the model's width. The proposed checkpoint is under the ceiling;
every checkpoint passed over for its logit scale is above it, by the value
the report names; and where the first save is already past the ceiling, the
report says that none holds."""

from __future__ import annotations

import math
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file

from ckptscan import scan_run
from ckptscan.detection.thresholds import Thresholds

from factories import llama_config, llama_tensors, write_hf_checkpoint

SAMPLES = Path(__file__).resolve().parents[1] / "sample_checkpoints"


def dense_logit_scale(checkpoint: Path) -> float:
    """The largest logit scale over the layers and query heads, written out in float64."""
    tensors: dict[str, np.ndarray] = {}
    for file in sorted(checkpoint.glob("*.safetensors")):
        tensors.update({name: value.astype(np.float64) for name, value in load_file(str(file)).items()})
    config = __import__("json").loads((checkpoint / "config.json").read_text())
    d, heads, groups = config["hidden_size"], config["num_attention_heads"], config["num_key_value_heads"]
    r = config.get("head_dim") or d // heads
    largest = 0.0
    for layer in range(config["num_hidden_layers"]):
        prefix = f"model.layers.{layer}."
        q = tensors[prefix + "self_attn.q_proj.weight"].reshape(heads, r, d)
        k = tensors[prefix + "self_attn.k_proj.weight"].reshape(groups, r, d)
        gain = tensors.get(prefix + "input_layernorm.weight", np.ones(d))
        for h in range(heads):
            g = h // (heads // groups)
            m = np.diag(gain) @ q[h].T @ k[g] @ np.diag(gain)  # d × d: the bilinear form of the logits
            largest = max(largest, float(np.sqrt(np.sum(m * m)) / math.sqrt(r)))
    return largest


def growing_run(directory: Path, steps: list[int], scale: dict[int, float], seed: int = 0) -> Path:
    """A 2-layer, d_model 64 Llama whose checkpoints carry small random q/k updates, layer 1's q and k
    multiplied so that its logit scale is about `scale[step]` (the factories' weights give about 0.026)."""
    config = llama_config(layers=2, hidden=64, heads=4, kv_heads=2)
    base = llama_tensors(config, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    for step in steps:
        for name, weight in base.items():
            if name.endswith(("q_proj.weight", "k_proj.weight")):
                base[name] = weight + torch.randn(weight.shape, generator=gen, dtype=torch.float64) * 2e-4
        tensors = dict(base)
        for name in ("model.layers.1.self_attn.q_proj.weight", "model.layers.1.self_attn.k_proj.weight"):
            tensors[name] = base[name] * math.sqrt(scale[step] / 0.026)
        write_hf_checkpoint(directory / f"checkpoint-{step}", tensors, config)
    return directory


def check_plan(run: Path) -> dict:
    """The report's plan against the brute force; returns {step: dense scale} and the plan."""
    report = scan_run(run)
    s = report.summary
    ceiling = Thresholds().at_width(report.model.hidden_size).logit_scale_ceiling
    plan = s.resume
    assert plan is not None, "the run alerts"
    dense = {int(p.name.split("-")[1]): dense_logit_scale(p) for p in run.glob("checkpoint-*")}
    if plan.checkpoint is not None:
        assert s.rollback_candidate == plan.checkpoint
        assert dense[plan.checkpoint.step] <= ceiling, "a proposed checkpoint is past the ceiling"
    for rejected in plan.rejected:
        named = re.search(r"attention logit scale ([0-9.e+-]+) \(layer \d+\) above the ceiling", rejected["why"])
        if named:
            assert dense[rejected["step"]] > ceiling
            assert float(named.group(1)) == pytest.approx(dense[rejected["step"]], rel=5e-3)
    return {"dense": dense, "plan": plan, "ceiling": ceiling, "summary": s}


def test_a_logit_scale_growing_from_the_start_is_resumed_from_the_last_checkpoint_under_the_ceiling(tmp_path):
    """The scale passes the ceiling at step 200, in the warm-up: the ceiling alerts there, and the
    checkpoint proposed is the newest whose dense scale is under it."""
    steps = list(range(0, 1300, 100))
    run = growing_run(tmp_path / "run", steps, {step: 1.5 + 0.004 * step for step in steps})
    found = check_plan(run)
    dense, plan, ceiling = found["dense"], found["plan"], found["ceiling"]
    past = [step for step in steps if dense[step] > ceiling]
    assert past == steps[2:]
    assert plan.checkpoint.step == max(step for step in steps if dense[step] <= ceiling) == 100
    assert (plan.skip_first_step, plan.skip_last_step) == (101, 200)


def test_a_run_whose_first_save_is_already_past_the_ceiling_proposes_none(tmp_path):
    steps = list(range(100, 1300, 100))
    run = growing_run(tmp_path / "run", steps, {step: 2.2 + 0.004 * step for step in steps})
    found = check_plan(run)
    assert found["dense"][100] > found["ceiling"]  # the brute force: the first save is saturated
    assert found["plan"].checkpoint is None and found["summary"].rollback_candidate is None
    assert found["plan"].reason.startswith("no saved checkpoint before the departure holds")
    # The evidence it gives, the first alert's logit scale, is the brute force's.
    step, value = re.search(r"at the first alert, step (\d+), attention logit scale ([0-9.]+) above",
                            found["plan"].reason).groups()
    assert float(value) == pytest.approx(found["dense"][int(step)], rel=5e-3) and float(value) > found["ceiling"]


@pytest.mark.skipif(not (SAMPLES / "attention_fault").is_dir(), reason="sample_checkpoints/ not present")
def test_the_attention_fault_samples_candidate_is_under_the_ceiling_and_the_alerting_one_above(tmp_path):
    run = tmp_path / "attention_fault"
    for step in range(0, 1600, 100):  # the run up to past its first alert (1400)
        shutil.copytree(SAMPLES / "attention_fault" / f"checkpoint-{step}", run / f"checkpoint-{step}")
    found = check_plan(run)
    assert found["plan"].checkpoint.step == 1300
    assert found["dense"][1300] <= found["ceiling"] < found["dense"][1400]
    assert f"attention logit scale {found['dense'][1300]:.3g}" in found["plan"].reason
