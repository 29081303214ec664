"""The reference-free logit-growth rule: the QK logit bound against its value at the first judged pair."""

import pytest

from ckptscan.detection.judge import judge
from ckptscan.detection.thresholds import Thresholds
from ckptscan.errors import CkptScanError
from ckptscan.metrics import Metrics
from detection.helpers import MODEL, run_report

RULE = Thresholds(warmup_pairs=2, logit_growth_warn=3.0, logit_growth_alert=4.0, consecutive=2)


def growth_findings(report):
    return [(p.to_step, layer.layer, f.severity, f.score, f.onset_step) for p in report.pairs
            for layer in p.layers for f in layer.findings if f.rule == "growth"]


def judged(bounds, thresholds=RULE, layers=1):
    report = run_report(len(bounds), layers=layers, logit=lambda i, n: bounds[i])
    return judge(Metrics("run", MODEL, [], report.pairs), thresholds)


def test_growth_is_measured_from_the_first_judged_pair_not_from_initialisation():
    """Warm-up growth (pairs 0-1: ×10) is not counted; ×2.9 after it is below the warning."""
    report = judged([0.5, 5.0, 10.0, 15.0, 20.0, 29.0, 29.0])
    assert growth_findings(report) == []


def test_growth_past_the_warning_factor_warns_and_held_past_the_alert_factor_alerts():
    report = judged([1.0, 1.0, 2.0, 4.0, 6.5, 9.0, 12.0])
    found = growth_findings(report)
    # base 2.0 at step 300: ×2 (none), ×3.25 (warn), ×4.5 then ×6 (alert on the second pair in a row at ≥ ×4)
    assert [(step, severity) for step, _, severity, _, _ in found] == [(500, "warn"), (600, "warn"), (700, "alert")]
    assert found[-1][3] == pytest.approx(12.0 / 2.0)
    assert found[-1][4] == 600  # the onset: the first pair of the run at ≥ ×4
    assert report.summary.first_alert_step["attention"] == 700


def test_a_dip_below_the_alert_factor_restarts_the_run_of_pairs():
    report = judged([1.0, 1.0, 2.0, 8.2, 7.0, 8.4, 9.0])
    assert [(s, sev) for s, _, sev, _, _ in growth_findings(report)] == \
        [(400, "warn"), (500, "warn"), (600, "warn"), (700, "alert")]


def test_each_layer_has_its_own_base():
    bounds = {0: [1.0, 1.0, 1.0, 1.2, 1.3, 1.4], 1: [5.0, 5.0, 5.0, 25.0, 26.0, 27.0]}
    report = run_report(6, layers=2, logit=lambda i, n: bounds[n][i])
    found = growth_findings(judge(Metrics("run", MODEL, [], report.pairs), RULE))
    assert {layer for _, layer, _, _, _ in found} == {1}


def test_the_rule_is_off_with_the_logit_bound_monitor_disabled():
    thresholds = Thresholds(warmup_pairs=2, disabled_monitors=("qk_logit_bound",))
    assert growth_findings(judged([1.0, 1.0, 2.0, 9.0, 12.0, 15.0], thresholds)) == []


def test_factors_must_be_above_one_and_ordered():
    with pytest.raises(CkptScanError, match="logit_growth_warn"):
        Thresholds(logit_growth_warn=5.0, logit_growth_alert=4.0)
    with pytest.raises(CkptScanError, match="logit_growth_warn"):
        Thresholds(logit_growth_warn=1.0)
