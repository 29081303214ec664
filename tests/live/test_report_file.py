"""The live report file is byte-for-byte report_json of the report, at every
monitored step, though old pairs' text is reused."""

from __future__ import annotations

import torch

from ckptscan.detection.rules import Thresholds
from ckptscan.live import Monitor
from ckptscan.report.json import report_json
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
        if monitor.report is not None:
            assert (tmp_path / "report.json").read_text() == report_json(monitor.report), step
            rewritten.append([text for _, _, text in monitor._file._pairs])
    # The lone first pair is written again once it becomes warm-up; the others are reused.
    assert rewritten[0][0] != rewritten[1][0]
    assert all(later[i] is earlier[i] for earlier, later in zip(rewritten[1:], rewritten[2:])
               for i in range(len(earlier)))
    assert monitor.report.summary.status == "alert"
