"""The attention logit-scale ceiling follows the model's width: healthy runs'
logit scale grows with d_model, so the ceiling is logit_scale_ceiling at
logit_scale_width and grows as √(d_model / logit_scale_width) above it."""

import dataclasses
import math

import pytest

from ckptscan.detection.findings import ceiling_findings
from ckptscan.detection.rules import Thresholds, assess_report
from ckptscan.errors import CkptScanError

from detection.helpers import MODEL, layer_result, run_report

T = Thresholds()


@pytest.mark.parametrize("width", [256, 1024, 8192])
def test_the_ceiling_grows_as_the_square_root_of_the_width(width):
    wide = T.at_width(width)
    assert wide.logit_scale_ceiling == pytest.approx(T.logit_scale_ceiling * math.sqrt(width / T.logit_scale_width))
    assert wide.logit_scale_width == width
    assert dataclasses.replace(wide, logit_scale_ceiling=T.logit_scale_ceiling, logit_scale_width=T.logit_scale_width) == T


@pytest.mark.parametrize("width", [None, 16, 32, 64])
def test_no_narrower_model_gets_a_lower_ceiling(width):
    assert T.at_width(width) is T


def test_applying_the_width_twice_changes_nothing():
    assert T.at_width(512).at_width(512) == T.at_width(512)


def test_the_ceiling_and_the_width_must_be_positive():
    with pytest.raises(CkptScanError, match="logit_scale_ceiling > 0 and logit_scale_width ≥ 1"):
        Thresholds(logit_scale_width=0)
    with pytest.raises(CkptScanError, match="logit_scale_ceiling > 0"):
        Thresholds(logit_scale_ceiling=0.0)


def test_the_finding_alerts_only_above_the_ceiling_it_was_given():
    wide = T.at_width(256)
    for thresholds in (T, wide):
        c = thresholds.logit_scale_ceiling
        assert ceiling_findings(layer_result(0, scale=c), thresholds) == []
        [finding] = ceiling_findings(layer_result(0, scale=c * 1.01), thresholds)
        assert (finding.monitor, finding.family, finding.severity, finding.threshold) == (
            "logit_scale", "attention", "alert", c)


@pytest.mark.parametrize("width, alerts", [(64, True), (256, False)])
def test_a_judged_run_takes_its_ceiling_from_its_models_width(width, alerts):
    """A logit scale of 2.5 from the first pair on: over the ceiling of a
    d_model-64 model (2), under that of a d_model-256 one (4)."""
    report = run_report(10, scale=lambda i, n: 2.5)
    report.model = dataclasses.replace(MODEL, hidden_size=width)
    assess_report(report, T)
    assert (report.summary.first_alert_step["attention"] == report.pairs[0].to_step) is alerts
    assert report.thresholds["logit_scale_ceiling"] == pytest.approx(2.0 * math.sqrt(width / 64))
