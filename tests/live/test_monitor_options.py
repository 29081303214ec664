"""Live mode's options as one value (`MonitorOptions`), and the old keyword
arguments: both make the same monitor, run it to the same report, and check
their values alike."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from ckptscan.detection.rules import Thresholds
from ckptscan.errors import CkptScanError
from ckptscan.live import Monitor, MonitorOptions
from ckptscan.scan import ScanOptions
from live.helpers import tiny_config

# What a Monitor is made of, beyond its model: the same for both forms.
STATE = ("every", "out", "on_alert", "save", "per_head", "thresholds", "options", "probe")


def _model():
    from experiments.model import MixtralForCausalLM

    torch.manual_seed(0)
    return MixtralForCausalLM(tiny_config())


def _run(monitor: Monitor, model) -> dict:
    for step in (1, 2, 3):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(step)) * 1e-2)
        monitor.step(step)
    monitor.close()
    return json.loads(monitor.report_path.read_text())


def test_monitor_options_and_the_old_keyword_arguments_make_the_same_monitor(tmp_path):
    saved: list[int] = []
    fields = dict(every=1, on_alert="save", save=saved.append, per_head="newest", thresholds=Thresholds(),
                  options=ScanOptions(workers=1), background=False)
    model_a, model_b = _model(), _model()
    by_keywords = Monitor(model_a, out=tmp_path / "a", config=model_a.cfg.to_hf("float32"), **fields)
    by_value = Monitor(model_b, MonitorOptions(out=tmp_path / "b", config=model_b.cfg.to_hf("float32"), **fields))
    assert by_keywords.settings == dataclasses.replace(by_value.settings, out=tmp_path / "a")
    for name in STATE:
        a, b = getattr(by_keywords, name), getattr(by_value, name)
        assert (a == b) if name != "out" else (a.parent == b.parent and (a.name, b.name) == ("a", "b")), name
    reports = [_run(by_keywords, model_a), _run(by_value, model_b)]
    for report in reports:
        report["settings"].pop("run")
        report.pop("tool", None)
    assert reports[0] == reports[1] and len(reports[0]["pairs"]) == 2


def test_every_positional_and_keywords_beside_a_value_replace_its_fields(tmp_path):
    model = _model()
    config = model.cfg.to_hf("float32")
    assert Monitor(model, 7, out=tmp_path, config=config).settings == MonitorOptions(7, out=tmp_path, config=config)
    base = MonitorOptions(every=3, out=tmp_path, config=config)
    assert Monitor(model, base, per_head="flagged").settings == dataclasses.replace(base, per_head="flagged")
    with pytest.raises(TypeError, match="by keyword"):
        Monitor(model, base, 5)


@pytest.mark.parametrize("bad, message", [(dict(every=0), "every must be ≥ 1, not 0"),
                                          (dict(per_head="some"), "per_head must be one of"),
                                          (dict(on_alert="panic"), "on_alert must be one of")])
def test_both_forms_refuse_a_bad_value_alike(tmp_path, bad, message):
    with pytest.raises(CkptScanError, match=message):
        MonitorOptions(out=tmp_path, **bad)
    with pytest.raises(CkptScanError, match=message):
        Monitor(_model(), out=tmp_path, **bad)
