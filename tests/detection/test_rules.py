"""assess_report on synthetic runs: rules, families, corroboration, summary."""

import dataclasses
import math
import random

import pytest

from ckptscan.detection.findings import cross_layer_applies, cross_layer_findings
from ckptscan.detection.rules import ORDER_NOT_JUDGED, Thresholds, assess_report
from ckptscan.monitors import registry
from ckptscan.monitors.spec import Judging
from ckptscan.errors import CkptScanError
from ckptscan.schema.results import PairResult, ScanReport, Summary

from detection.helpers import MODEL, alerts, layer_result, run_report
from monitors.toy_family import MONITOR, NAME, TOY


def test_healthy_run_with_an_lr_schedule_is_healthy():
    # Norm-like metrics follow a warm-up + cosine schedule (x10); entropies are flat with noise.
    def logit(i, n):
        return 2.0 + 2.0 * (1 - math.exp(-i / 5))

    def eps(i, n):
        return 3.0 + 3.0 * (1 - math.exp(-i / 4))

    report = run_report(40, logit=logit, eps=eps, routing=lambda i, n: 0.9 - 0.004 * i)
    assess_report(report, Thresholds())
    assert report.summary.status == "ok"
    assert report.summary.rollback_candidate is None
    assert report.summary.message.startswith("HEALTHY")


def test_attention_collapse_names_the_attention_family_and_rollback():
    report = run_report(30, d2n=lambda i, n: 0.55 if n == 0 or i < 15 else 0.25)
    assess_report(report, Thresholds(), loss_divergence_step=2300)
    s = report.summary
    assert s.status == "alert" and s.first_family == "attention"
    # The first departing pair already alerts: layer 1's departure, capped at 6 σ, less the 1 σ
    # drift, takes its own CUSUM to 5.0, the calibrated alert level. The consecutive-pairs rule
    # confirms one pair later.
    assert s.first_alert_step == {"attention": 1600, "router": None, "numeric": None, "update": None, "output": None, "optimizer": None}
    assert s.first_alert_onset_step == 1600  # the pair 1500 -> 1600 departed first
    assert s.rollback_candidate.step == 1500 and s.rollback_candidate.path == "run/checkpoint-1500"
    assert s.lead_steps == 2300 - 1600
    assert s.flagged_layers == [1]
    layer1 = s.layers[1]
    assert (layer1.first_alert_step, layer1.first_alert_family) == (1600, "attention")
    first = next(f for step, layer, f in alerts(report) if step == 1600)
    assert first.rule == "cusum" and first.score >= first.threshold == Thresholds().cusum_alert
    assert layer1.current["delta2_entropy_norm"] == pytest.approx(report.pairs[-1].layers[1].attention
                                                                   .delta2_entropy_norm)
    assert layer1.baseline["delta2_entropy_norm"] == pytest.approx(0.55, abs=0.02)
    finding = next(f for _, layer, f in alerts(report) if layer == 1 and f.rule in ("trend", "level"))
    assert finding.monitor == "delta2_entropy_norm" and finding.score >= 6
    assert finding.value < finding.threshold < finding.baseline


def test_router_collapse_names_the_router_family_even_when_attention_follows():
    report = run_report(
        30,
        routing=lambda i, n: 0.8 if i < 12 else 0.4,
        d2n=lambda i, n: 0.55 if i < 20 else 0.25,  # the coupled, later attention change
    )
    assess_report(report, Thresholds())
    s = report.summary
    assert s.first_family == "router"
    # Both layers depart together on the first pair: their pooled CUSUM alerts at once (rule
    # "pooled_cusum"); a single layer would need the consecutive pair.
    assert s.first_alert_step["router"] == 1300
    assert s.first_alert_step["attention"] == 2100


def test_a_secondary_monitor_alone_only_warns():
    report = run_report(30, dwq=lambda i, n: 0.8 if i < 15 else 0.4)
    assess_report(report, Thresholds())
    assert report.summary.status == "warn"
    findings = [f for p in report.pairs for layer in p.layers for f in layer.findings]
    assert {f.monitor for f in findings} == {"dwq_entropy_norm"}
    assert any("not corroborated" in f.message for f in findings)


def test_a_secondary_monitor_corroborated_by_a_specific_one_alerts():
    report = run_report(30, dwq=lambda i, n: 0.8 if i < 15 else 0.4, d2n=lambda i, n: 0.55 if i < 15 else 0.35)
    assess_report(report, Thresholds())
    assert {f.monitor for _, _, f in alerts(report)} >= {"dwq_entropy_norm", "delta2_entropy_norm"}


def test_nonfinite_is_always_an_alert_even_in_warm_up():
    report = run_report(10, nonfinite=lambda i, n: {"W_q": 3} if (i, n) == (0, 1) else None)
    assess_report(report, Thresholds())
    s = report.summary
    assert s.status == "alert" and s.first_family == "numeric"
    assert s.first_alert_step["numeric"] == 100
    assert s.rollback_candidate.step == 0


def test_floors_wait_for_the_warm_up_in_a_run():
    # Healthy runs dip below the floors at the end of the LR ramp: a warm-up pair of a run is not judged
    # by them, and says so; after the warm-up the same collapse alerts. `diff` of the pair knows no warm-up.
    report = run_report(10, d2n=lambda i, n: 0.1 if (i, n) in ((0, 1), (3, 1)) else 0.55)
    assess_report(report, Thresholds())
    assert [(step, layer, f.rule) for step, layer, f in alerts(report)] == [(400, 1, "floor")]
    assert report.pairs[0].status == "not_judged" and report.pairs[0].not_judged_reason.startswith("warm-up")
    single = ScanReport("diff", MODEL, [], [report.pairs[0]], Summary("ok", [], {}))
    assess_report(single, Thresholds())
    assert [(layer, f.rule) for _, layer, f in alerts(single)] == [(1, "floor")]


def test_a_run_whose_pairs_are_all_in_warm_up_is_not_judged_never_healthy():
    report = run_report(2)
    assess_report(report, Thresholds())
    s = report.summary
    assert (s.status, s.judged_pairs) == ("not_judged", 0)
    assert s.not_judged_reason == "warm-up (the first 2 pairs)"
    assert s.message.startswith("NOT JUDGED: none of the 2 pairs could be judged yet: warm-up")
    assert [p.status for p in report.pairs] == ["not_judged"] * 2
    assert {layer.status for p in report.pairs for layer in p.layers} == {"not_judged"}
    assert [layer.status for layer in s.layers] == ["not_judged"] * 2


def test_a_run_says_which_pairs_it_judged_and_why_not_the_others():
    report = run_report(12)
    assess_report(report, Thresholds())
    s = report.summary
    # 2 warm-up pairs, then 5 that make the baselines, then 5 judged against them.
    assert (s.status, s.judged_pairs) == ("ok", 5)
    assert [p.not_judged_reason is None for p in report.pairs] == [False] * 7 + [True] * 5
    assert s.not_judged[:2] == ["2 pairs: warm-up (the first 2 pairs)",
                                "5 pairs: no baseline yet (the 5 pairs after the warm-up make each series' baseline)"]
    assert s.message.startswith("HEALTHY: no monitor fired over 12 pairs (5 judged); not judged: 2 pairs: warm-up")
    assert s.not_judged_reason is None and {layer.status for layer in s.layers} == {"ok"}


def test_a_single_pair_is_judged_and_says_when_no_step_tells_its_order():
    named = dataclasses.replace(run_report(1), command="diff")
    assess_report(named, Thresholds())
    assert (named.summary.status, named.summary.judged_pairs) == ("ok", 1)
    unnamed = ScanReport("diff", MODEL, [], [dataclasses.replace(named.pairs[0], from_step=None, to_step=None)],
                         Summary("ok", [], {}))
    assess_report(unnamed, Thresholds())
    s = unnamed.summary
    assert s.status == "ok" and s.not_judged == [ORDER_NOT_JUDGED]
    assert s.message == f"HEALTHY: no monitor fired over 1 pair; not judged: {ORDER_NOT_JUDGED}"


def test_router_floors():
    report = run_report(10, routing=lambda i, n: 0.05, eps=lambda i, n: 0.05)
    assess_report(report, Thresholds())
    monitors = {f.monitor for _, _, f in alerts(report) if f.rule == "floor"}
    assert monitors == {"routing_entropy_norm", "epsilon"}
    assert report.summary.first_family == "router"


def test_cross_layer_rule_in_a_single_pair():
    layers = [layer_result(n, d2n=0.55 + 0.005 * n) for n in range(8)]
    layers[5] = layer_result(5, d2n=0.3)
    report = ScanReport("diff", MODEL, [], [PairResult(0, 100, layers)], Summary("ok", [], {}))
    assess_report(report, Thresholds())
    assert [(layer, f.rule) for _, layer, f in alerts(report)] == [(5, "cross_layer")]


def brute_force_cross_layer(values, t, toward):
    """The cross-layer rule written out in float64: each layer against the
    median and MAD σ (1.4826·MAD, floored) of the others, toward the alarm side."""
    found = {}
    for layer, value in values.items():
        others = sorted(float(v) for k, v in values.items() if k != layer)
        middle = len(others) // 2
        median = others[middle] if len(others) % 2 else (others[middle - 1] + others[middle]) / 2
        deviations = sorted(abs(v - median) for v in others)
        mad = deviations[middle] if len(others) % 2 else (deviations[middle - 1] + deviations[middle]) / 2
        excess = toward * (float(value) - median) / max(1.4826 * mad, t.cross_layer_min_scale)
        if excess >= t.cross_layer_z_warn:
            found[layer] = ("alert" if excess >= t.cross_layer_z_alert else "warn", excess)
    return found


def test_the_cross_layer_rule_matches_a_float64_brute_force_on_random_layers():
    rng = random.Random(53)
    t = Thresholds()
    flagged = 0
    for _ in range(300):
        values = {n: rng.gauss(0.55, 0.02) for n in range(rng.randint(6, 12))}
        for n in rng.sample(sorted(values), rng.randint(0, 2)):
            values[n] -= rng.uniform(0.0, 0.4)
        pair = PairResult(0, 100, [layer_result(n, d2n=v) for n, v in values.items()])
        cross_layer_findings(pair, t)
        got = {layer.layer: (f.severity, f.score) for layer in pair.layers for f in layer.findings}
        expected = brute_force_cross_layer(values, t, -1.0) if len(values) >= t.cross_layer_min_layers else {}
        assert cross_layer_applies(pair, t) == (len(values) >= t.cross_layer_min_layers)
        assert got.keys() == expected.keys()
        for layer, (severity, excess) in expected.items():
            assert got[layer][0] == severity and math.isclose(got[layer][1], excess, rel_tol=1e-12)
        flagged += len(expected)
    assert flagged > 50  # the rule fired, on both sides of the 8-layer minimum


def test_the_cross_layer_rule_judges_any_registered_monitor_that_sets_it_toward_its_alarm_side():
    """A family's monitor that sets `Judging.cross_layer` is judged against the
    other layers as the Δ2 entropy is, on its own alarm side (here: high)."""
    monitor = dataclasses.replace(TOY.monitors[0], judging=Judging(0.001, "alert", per_update=True,
                                                                  cross_layer=True))
    t = Thresholds()
    with registry.registered(dataclasses.replace(TOY, monitors=(monitor,))):
        layers = [layer_result(n, d2n=0.55) for n in range(8)]
        for n, layer in enumerate(layers):
            layer.families = {NAME: {MONITOR: 0.010 + 0.0005 * n if n != 3 else 0.2}}
        cross_layer_findings(PairResult(0, 100, layers), t)
        found = [(layer.layer, f.family, f.monitor, f.severity) for layer in layers for f in layer.findings]
        assert found == [(3, NAME, MONITOR, "alert")]
        assert "above the other layers' median" in layers[3].findings[0].message


def test_disabled_monitors_are_not_judged():
    report = run_report(30, d2n=lambda i, n: 0.55 if i < 15 else 0.35)
    assess_report(report, Thresholds(disabled_monitors=("delta2_entropy_norm", "delta2_entropy_norm_min")))
    assert report.summary.status == "ok"


def test_assess_report_is_repeatable_and_records_thresholds():
    report = run_report(30, d2n=lambda i, n: 0.55 if i < 15 else 0.25)
    thresholds = Thresholds(alert_sigma=7.0)
    assess_report(report, thresholds)
    first = dataclasses.asdict(report)
    assess_report(report, thresholds)
    assert dataclasses.asdict(report) == first
    assert report.thresholds["alert_sigma"] == 7.0
    assert report.settings["warmup_end_step"] == 200


def test_warmup_steps_delay_judging():
    report = run_report(30, d2n=lambda i, n: 0.25 if i < 9 else 0.55)
    assess_report(report, Thresholds(warmup_steps=900))
    assert report.summary.status == "ok"
    assert report.settings["warmup_end_step"] == 900


@pytest.mark.parametrize("kwargs", [
    {"warn_sigma": 5.0, "alert_sigma": 4.0},
    {"consecutive": 0},
    {"min_baseline_pairs": 1},
    {"disabled_monitors": ("no_such_monitor",)},
])
def test_invalid_thresholds_are_user_errors(kwargs):
    with pytest.raises(CkptScanError, match="invalid thresholds"):
        Thresholds(**kwargs)
