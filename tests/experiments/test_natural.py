"""experiments.natural's output-family columns: the oracle mean log Z read
from the training log, the output values read from a scanned run, and the
judging with the output ceilings off."""

import json
import math

import pytest
from factories import llama_config, llama_tensors, write_hf_checkpoint

from ckptscan import scan_run
from ckptscan.detection.rules import Thresholds
from experiments.natural import mean_log_z, output_values, without_output


def test_mean_log_z_is_the_lowest_after_the_warm_up_and_the_last(tmp_path):
    rows = [{"step": s, "loss": 1.0, "mean_log_z": z} for s, z in ((0, -9.0), (99, -8.0), (100, 6.0), (150, 5.5),
                                                                     (200, None), (250, 7.0))]
    (tmp_path / "train_log.jsonl").write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    assert mean_log_z(tmp_path) == (5.5, 7.0)
    assert mean_log_z(tmp_path, after=1000) == (None, None)


def test_output_values_are_the_last_layers_by_newer_step(tmp_path):
    config = {**llama_config(layers=2, hidden=32, heads=4, kv_heads=2), "vocab_size": 40, "tie_word_embeddings": True}
    tensors = llama_tensors(config, 1)
    for k in range(3):
        tensors = {n: t * 1.1 for n, t in tensors.items()} if k else tensors
        write_hf_checkpoint(tmp_path / f"checkpoint-{100 * k}", tensors, config)
    report = scan_run(tmp_path)
    values = output_values(report, "output_logit_rms")
    assert list(values) == [100, 200]
    assert values == {p.to_step: p.layers[-1].families["output"]["output_logit_rms"] for p in report.pairs}
    assert values[200] / values[100] == pytest.approx(1.1, rel=1e-6)  # the head scales by 1.1


def test_without_output_turns_only_the_output_ceilings_off():
    t = without_output(Thresholds())
    assert math.isinf(t.output_logit_scale_ceiling) and math.isinf(t.output_shift_ceiling)
    assert t.logit_scale_ceiling == Thresholds().logit_scale_ceiling
