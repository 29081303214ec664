"""The live report file is byte-for-byte report_json of the report, at every
monitored step, though old pairs' text is reused."""

from __future__ import annotations

import json

import pytest
import torch

from ckptscan.detection.rules import Thresholds
from ckptscan.errors import CkptScanError
from ckptscan.live import Monitor
from ckptscan.document.writing import report_json
from experiments.model import MixtralForCausalLM
from live.helpers import tiny_config


def test_the_file_is_report_json_at_every_step(tmp_path):
    torch.manual_seed(0)
    model = MixtralForCausalLM(tiny_config())
    monitor = Monitor(model, every=1, out=tmp_path, config=model.cfg.to_hf("float32"), thresholds=Thresholds())
    rewritten = []
    for step in range(1, 14):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 1e-2 * (1 + (step > 9) * 20 * (p.shape[0] == 32)))
            if step == 12:
                model.model.layers[1].self_attn.k_proj.weight[2, 2] = float("nan")
        monitor.step(step)
        monitor.wait()  # the file as the scan of this step left it
        if monitor.report is not None:
            assert (tmp_path / "report.json").read_text() == report_json(monitor.report), step
            rewritten.append([text for _, _, text in monitor._file._pairs])
    # A pair's verdict never changes as the run grows (the lone first pair already is warm-up): each
    # pair's text is written once and reused.
    assert rewritten[0][0] == rewritten[1][0]
    assert all(later[i] is earlier[i] for earlier, later in zip(rewritten[1:], rewritten[2:])
               for i in range(len(earlier)))
    assert monitor.report.summary.status == "alert"


@pytest.mark.parametrize("per_head", ["flagged", "newest", "flagged+newest"])
def test_the_file_is_report_json_with_per_head_and_memory_keeps_only_those_heads(tmp_path, per_head):
    """With `per_head`, the file is report_json(report, per_head) at every
    step, and the intervals before the newest hold in memory only the
    per-head results the file keeps: those of flagged layers ("flagged",
    "flagged+newest"), none ("newest")."""
    torch.manual_seed(0)
    model = MixtralForCausalLM(tiny_config())
    monitor = Monitor(model, every=1, out=tmp_path, config=model.cfg.to_hf("float32"), thresholds=Thresholds(),
                      per_head=per_head)
    for step in range(1, 14):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 1e-2 * (1 + (step > 9) * 20 * (p.shape[0] == 32)))
        monitor.step(step)
        monitor.wait()
        if monitor.report is not None:
            text = (tmp_path / "report.json").read_text()
            assert text == report_json(monitor.report, per_head), step
            assert json.loads(text)["settings"]["per_head"] == per_head
    statuses = [[layer.status for layer in pair.layers] for pair in monitor.report.pairs]
    assert any("alert" in s or "warn" in s for s in statuses[:-1])  # some layer's heads worth keeping
    for pair, layers in zip(monitor.report.pairs[:-1], statuses[:-1]):
        for layer, status in zip(pair.layers, layers):
            kept = per_head in ("flagged", "flagged+newest") and status in ("warn", "alert")
            assert bool(layer.attention.heads) == kept, (pair.to_step, layer.layer)
    assert all(layer.attention.heads for layer in monitor.report.pairs[-1].layers)  # the newest: not yet


def test_per_head_must_be_known(tmp_path):
    model = MixtralForCausalLM(tiny_config())
    with pytest.raises(CkptScanError, match="per_head must be one of"):
        Monitor(model, out=tmp_path, config=model.cfg.to_hf("float32"), per_head="some")
