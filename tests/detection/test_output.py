"""The output family's rule: its logit scale and log Z shift scale over their
ceilings alert from the first pair, name the family `output` as the cause,
and bring its interventions (z-loss, weight decay on the head, lower LR)."""

import dataclasses

import pytest
import torch
from factories import llama_config, llama_tensors, random_weights, write_hf_checkpoint

from ckptscan import scan_run
from ckptscan.detection.output import output_findings
from ckptscan.detection.rules import Thresholds, assess_report
from ckptscan.errors import CkptScanError
from ckptscan.schema.results import LayerResult

from detection.helpers import run_report

T = Thresholds()


def _layer(rms, shift):
    return LayerResult(layer=1, families={"output": {"output_logit_rms": rms, "output_shift": shift}})


def test_each_ceiling_alerts_only_above_it():
    assert output_findings(_layer(T.output_logit_scale_ceiling, T.output_shift_ceiling), T) == []
    above = output_findings(_layer(T.output_logit_scale_ceiling * 1.01, T.output_shift_ceiling * 1.01), T)
    assert [(f.monitor, f.family, f.severity, f.rule) for f in above] == [
        ("output_logit_rms", "output", "alert", "ceiling"), ("output_shift", "output", "alert", "ceiling")]
    assert above[0].threshold == T.output_logit_scale_ceiling and above[1].threshold == T.output_shift_ceiling
    assert output_findings(LayerResult(layer=0), T) == []
    assert output_findings(_layer(None, None), T) == []


def test_ceilings_must_be_positive():
    with pytest.raises(CkptScanError, match="output_shift_ceiling > 0"):
        Thresholds(output_shift_ceiling=0.0)


def test_a_judged_run_alerts_at_the_first_pair_whose_head_passes_the_ceiling():
    report = run_report(12)
    for k, pair in enumerate(report.pairs):  # the head grows past the ceiling from pair 1, in the warm-up
        pair.layers[-1] = dataclasses.replace(pair.layers[-1], families={
            "output": {"output_logit_rms": 3.0 * (1.5 ** k), "output_shift": 1.0}})
    assess_report(report, T)
    s = report.summary
    first = next(p.to_step for p in report.pairs if p.layers[-1].families["output"]["output_logit_rms"] > 9.0)
    assert s.first_alert_step["output"] == first and s.first_family == "output"
    assert [i["short"] for i in s.interventions if i["family"] == "output"][:3] == [
        "z-loss", "weight decay on the head", "lower LR"]


def test_a_scanned_run_whose_head_grows_names_the_output_family(tmp_path):
    config = {**llama_config(layers=2, hidden=32, heads=4, kv_heads=2), "vocab_size": 40}
    tensors = llama_tensors(config, 1)
    tensors["model.norm.weight"] = torch.ones(32, dtype=torch.float64)
    tensors["lm_head.weight"] = random_weights((40, 32), 7, scale=1.0)  # logit scale about 1 at step 0
    gen = torch.Generator().manual_seed(2)
    for k in range(8):
        if k:
            tensors = {n: t + torch.randn(t.shape, generator=gen, dtype=torch.float64) * 1e-4
                       for n, t in tensors.items()}
            tensors["model.norm.weight"] = tensors["model.norm.weight"] * 1.6  # the final norm's gain grows
        write_hf_checkpoint(tmp_path / f"checkpoint-{100 * k}", tensors, config)
    report = scan_run(tmp_path)
    scales = [p.layers[-1].families["output"]["output_logit_rms"] for p in report.pairs]
    first = next(p.to_step for p, scale in zip(report.pairs, scales) if scale > T.output_logit_scale_ceiling)
    assert report.summary.first_alert_step["output"] == first and report.summary.first_family == "output"
    assert report.summary.first_alert_step["attention"] is None


def test_verdicts_are_the_same_with_or_without_the_heads_update_spectrum():
    """dw_head_entropy_norm is null unless asked for (it costs V·d²); nothing
    judges it, so its absence changes no finding, status or first alert."""
    reports = []
    for entropy in (None, lambda k: 0.9 - 0.05 * k):  # absent, or falling steadily as a collapse would
        report = run_report(12)
        for k, pair in enumerate(report.pairs):
            pair.layers[-1] = dataclasses.replace(pair.layers[-1], families={"output": {
                "output_logit_rms": 3.0 * (1.2 ** k), "output_shift": 1.0, "dw_head_rel_norm": 1e-3,
                "dw_head_mean_coherence": 1.0, "dw_head_entropy_norm": entropy(k) if entropy else None}})
        assess_report(report, T)
        reports.append(report)
    without, with_spectrum = reports
    assert [p.status for p in without.pairs] == [p.status for p in with_spectrum.pairs]
    assert [[f.monitor for layer in p.layers for f in layer.findings] for p in without.pairs] == \
        [[f.monitor for layer in p.layers for f in layer.findings] for p in with_spectrum.pairs]
    assert without.summary.first_alert_step == with_spectrum.summary.first_alert_step
    assert not any(f.monitor == "dw_head_entropy_norm" for p in with_spectrum.pairs for layer in p.layers
                   for f in layer.findings)
