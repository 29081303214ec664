"""The summary's primary family: among the families alerting on the first
alerting pair, the one whose departure began first, then the one further past
its own alert level, then the more specific monitor, then router before
attention; the reason says which criterion decided."""

import json

import pytest

from ckptscan.detection.provenance import RULE_UNRELATED
from ckptscan.detection.rules import Thresholds, assess_report
from ckptscan.detection.summary import CHECKS_KEPT, SummaryState, summarize
from ckptscan.monitors import registry
from ckptscan.document.writing import report_json
from ckptscan.document.reading import report_from_dict
from ckptscan.schema.results import Finding, LayerResult, PairResult, ScanReport, Summary

from detection.helpers import MODEL, run_report

INTERVAL = 100


def alert(monitor, family, rule, score, onset, severity="alert"):
    """A finding as the rules raise it; `score` in the rule's statistic (None: a floor or non-finite value)."""
    threshold = {"cusum": 5.0, "pooled_cusum": 4.6}.get(rule)
    return Finding(monitor, family, severity, 0.5, f"{monitor} {rule}", threshold=threshold, rule=rule, score=score,
                   onset_step=onset)


def run(findings_at, num_pairs=8):
    """A run of `num_pairs` pairs (newer steps 100, 200, …) whose pairs carry
    the given findings: {newer step: {layer: [Finding]}}."""
    pairs = []
    for i in range(num_pairs):
        to_step = (i + 1) * INTERVAL
        layers = []
        for number in (0, 1):
            findings = findings_at.get(to_step, {}).get(number, [])
            status = "alert" if any(f.severity == "alert" for f in findings) else \
                "warn" if findings else "ok"
            layers.append(LayerResult(number, status=status, findings=findings))
        status = "alert" if any(layer.status == "alert" for layer in layers) else \
            "warn" if any(layer.status == "warn" for layer in layers) else "ok"
        pairs.append(PairResult(i * INTERVAL, to_step, layers, f"run/checkpoint-{i * INTERVAL}",
                                f"run/checkpoint-{to_step}", status))
    return ScanReport("trend", MODEL, [], pairs, Summary("ok", [], {}))


def test_two_families_on_one_pair_the_earlier_onset_is_primary_however_far_the_other_went():
    report = run({600: {0: [alert("qk_logit_bound", "attention", "cusum", 5.0, 300)],
                        1: [alert("routing_entropy_norm", "router", "cusum", 30.0, 400)]}})
    s = summarize(report)
    assert (s.primary_family, s.secondary_families, s.first_family) == ("attention", ["router"], "attention")
    assert s.primary_family_reason == ("attention and router alerted together at step 600: attention's departure "
                                       "began earlier, at step 300 (router's at step 400)")
    assert s.first_alert_onset_step == 300 and s.rollback_candidate.step == 200
    assert "primary: attention (attention and router alerted together at step 600: " in s.message
    assert ("; also: router; first alert per family: attention 600, router 600, update –, output –, optimizer –, "
            "numeric –" in s.message)


def test_the_earlier_onset_wins_whichever_family_it_is():
    report = run({600: {0: [alert("qk_logit_bound", "attention", "cusum", 30.0, 400)],
                        1: [alert("routing_entropy_norm", "router", "cusum", 5.0, 300)]}})
    s = summarize(report)
    assert (s.primary_family, s.secondary_families) == ("router", ["attention"])
    assert "router's departure began earlier, at step 300 (attention's at step 400)" in s.primary_family_reason


def test_same_onset_the_family_further_past_its_own_alert_level_is_primary():
    """Attention's 7.2 robust σ is 1.2× alert_sigma (6); router's CUSUM 6.5 is
    1.3× cusum_alert (5): the router went further, though its number is smaller."""
    findings = {600: {0: [alert("delta2_entropy_norm", "attention", "trend", 7.2, 500)],
                      1: [alert("routing_entropy_norm", "router", "cusum", 6.5, 500)]}}
    s = summarize(run(findings))
    assert (s.primary_family, s.secondary_families) == ("router", ["attention"])
    assert s.primary_family_reason == (
        "router and attention alerted together at step 600: both departures began at step 500 and router's went "
        "further past its alert level (router 1.3× its alert level, attention 1.2× its alert level)")
    # Judged under alert_sigma 4, the same 7.2 σ is 1.8× its level: attention went further.
    s = summarize(run(findings), thresholds=Thresholds(warn_sigma=3.0, alert_sigma=4.0))
    assert (s.primary_family, s.secondary_families) == ("attention", ["router"])


def test_a_hard_floor_is_further_than_any_statistic():
    s = summarize(run({600: {0: [alert("delta2_entropy_norm", "attention", "cusum", 40.0, 600)],
                             1: [alert("routing_entropy_norm", "router", "floor", None, None)]}}))
    assert s.primary_family == "router"
    assert "(router past its hard floor, attention 8.0× its alert level)" in s.primary_family_reason


def test_same_onset_and_extent_the_more_specific_monitor_decides():
    """Router ε alerts only when routing entropy corroborates it; Δ2 entropy may alert alone."""
    s = summarize(run({600: {0: [alert("epsilon", "router", "cusum", 5.0, 600)],
                             1: [alert("delta2_entropy_norm", "attention", "cusum", 5.0, 600)]}}))
    assert (s.primary_family, s.secondary_families) == ("attention", ["router"])
    assert s.primary_family_reason.endswith(
        "both departures began at step 600, equally far past their alert levels; attention's delta2_entropy_norm "
        "may alert on its own, router's epsilon only when a specific monitor corroborates it")


def test_non_finite_values_are_the_plainest_evidence_unless_another_departure_began_earlier():
    nonfinite = alert("nonfinite", "numeric", "nonfinite", None, None)
    floor = alert("routing_entropy_norm", "router", "floor", None, None)
    s = summarize(run({600: {0: [floor], 1: [nonfinite]}}))
    assert (s.primary_family, s.secondary_families) == ("numeric", ["router"])
    assert s.primary_family_reason == ("numeric and router alerted together at step 600: both departures began at "
                                       "step 600, equally far past their alert levels; a non-finite value is the "
                                       "plainest evidence")
    s = summarize(run({600: {0: [floor], 1: [nonfinite, alert("qk_logit_bound", "attention", "cusum", 5.0, 300)]}}))
    assert (s.primary_family, s.secondary_families) == ("attention", ["numeric", "router"])
    assert s.primary_family_reason.startswith("attention, numeric and router alerted together at step 600: "
                                              "attention's departure began earlier, at step 300 (numeric's at step "
                                              "600); attention's departure began earlier, at step 300 (router's")


def test_a_full_tie_between_router_and_attention_names_the_router():
    """Both CUSUMs crossed with one capped departure (6 − 1 = 5.0): the mechanism's asymmetry decides."""
    s = summarize(run({600: {0: [alert("qk_logit_bound", "attention", "cusum", 5.0, 600)],
                             1: [alert("routing_entropy_norm", "router", "cusum", 5.0, 600)]}}))
    assert (s.primary_family, s.secondary_families) == ("router", ["attention"])
    assert "from equally specific monitors; router comes first because a router fault grows attention logits" \
        in s.primary_family_reason


def test_each_family_is_represented_by_its_strongest_alert_on_the_pair():
    """Router's late-starting epsilon does not hide its routing entropy, which began first."""
    s = summarize(run({600: {0: [alert("epsilon", "router", "cusum", 9.0, 500),
                                 alert("qk_logit_bound", "attention", "cusum", 9.0, 400)],
                             1: [alert("routing_entropy_norm", "router", "cusum", 5.0, 300)]}}))
    assert s.primary_family == "router" and s.first_alert_onset_step == 300


def test_one_family_alone_is_primary_and_the_reason_says_so():
    s = summarize(run({500: {1: [alert("delta2_entropy_norm", "attention", "cusum", 5.0, 400)]},
                       600: {1: [alert("delta2_entropy_norm", "attention", "cusum", 10.0, 400)]}}))
    assert (s.primary_family, s.first_family, s.secondary_families) == ("attention", "attention", [])
    assert s.primary_family_reason == "attention is the only family that alerted, its departure beginning at step 400"
    assert "primary: attention (attention is the only family that alerted" in s.message
    assert "also:" not in s.message


def test_a_family_alerting_on_a_later_pair_is_secondary():
    s = summarize(run({500: {1: [alert("delta2_entropy_norm", "attention", "cusum", 5.0, 400)]},
                       700: {0: [alert("routing_entropy_norm", "router", "cusum", 50.0, 200)],
                             1: [alert("nonfinite", "numeric", "nonfinite", None, None)]}}))
    assert (s.primary_family, s.secondary_families) == ("attention", ["router", "numeric"])
    assert s.primary_family_reason == ("attention alerted first, at step 500, its departure beginning at step 400; "
                                       "router alerted only at step 700, numeric alerted only at step 700")


def test_a_family_that_only_warns_is_no_candidate_however_early_it_began():
    s = summarize(run({600: {0: [alert("epsilon", "router", "cusum", 4.9, 100, severity="warn")],
                             1: [alert("delta2_entropy_norm", "attention", "cusum", 5.0, 600)]}}))
    assert (s.primary_family, s.secondary_families) == ("attention", [])


def test_without_an_alert_there_is_no_primary_family():
    for findings in ({}, {600: {0: [alert("epsilon", "router", "cusum", 4.9, 500, severity="warn")]}}):
        s = summarize(run(findings))
        assert (s.primary_family, s.primary_family_reason, s.secondary_families) == (None, None, [])


def test_a_pair_that_is_not_one_run_keeps_its_verdict_and_names_no_mechanism():
    unrelated = Finding(RULE_UNRELATED, "numeric", "alert", 1.4, "the update is as large as the weights",
                        threshold=1.0, rule=RULE_UNRELATED)
    s = summarize(run({600: {0: [unrelated], 1: [unrelated]},
                       700: {1: [alert("delta2_entropy_norm", "attention", "cusum", 5.0, 700)]}}))
    assert s.message == ("ALERT: step 500 → step 600 is not an update of one run: "
                         "the update is as large as the weights")
    assert s.first_family == "numeric" and s.rollback_candidate is None and s.interventions == []
    assert (s.primary_family, s.primary_family_reason, s.secondary_families) == (None, None, [])


def test_judged_runs_name_the_primary_family():
    """Through the rules: a routing collapse, and attention following later."""
    report = run_report(30, routing=lambda i, n: 0.8 if i < 12 else 0.4, d2n=lambda i, n: 0.55 if i < 20 else 0.25)
    assess_report(report, Thresholds())
    s = report.summary
    assert (s.first_family, s.primary_family, s.secondary_families) == ("router", "router", ["attention"])
    assert s.primary_family_reason.startswith("router alerted first, at step 1300")
    assert s.primary_family_reason.endswith("attention alerted only at step 2100")


def test_the_primary_family_goes_through_the_json_report_and_the_saved_state():
    report = run({600: {0: [alert("qk_logit_bound", "attention", "cusum", 5.0, 300)],
                        1: [alert("routing_entropy_norm", "router", "cusum", 30.0, 400)]}})
    report.summary = summarize(report)
    data = json.loads(report_json(report))
    assert {key: data["summary"][key] for key in ("primary_family", "primary_family_reason", "secondary_families")} \
        == {"primary_family": "attention", "primary_family_reason": report.summary.primary_family_reason,
            "secondary_families": ["router"]}
    assert report_from_dict(data).summary == report.summary

    state = SummaryState()
    for index, pair in enumerate(report.pairs[:6]):
        state.add(index, pair, lambda step, index=index: _onset(report.pairs, index, step))
    restored = SummaryState.from_dict(json.loads(json.dumps(state.to_dict())))
    for index, pair in enumerate(report.pairs[6:], start=6):
        restored.add(index, pair, lambda step, index=index: _onset(report.pairs, index, step))
    assert restored.summary(None, {}) == report.summary


def _onset(pairs, index, step):
    found = next((i for i in range(index, -1, -1) if pairs[i].to_step == step), index)
    return found, pairs[found].to_step, pairs[found].from_path, pairs[found].from_step


def test_the_verdict_line_lists_the_first_alert_of_every_registered_family():
    s = summarize(run({600: {0: [alert("qk_logit_bound", "attention", "cusum", 5.0, 600)]}}))
    listed = s.message.split("first alert per family: ")[1].split(";")[0]
    assert [item.split(" ")[0] for item in listed.split(", ")] == list(registry.finding_families())
    assert listed == "attention 600, " + ", ".join(f"{f} –" for f in registry.finding_families() if f != "attention")


def shifted(report, by):
    """The same run with every step later by `by`: a run whose first save is not the initialisation."""
    for pair in report.pairs:
        pair.from_step, pair.to_step = pair.from_step + by, pair.to_step + by
        pair.from_path, pair.to_path = f"run/checkpoint-{pair.from_step}", f"run/checkpoint-{pair.to_step}"
    return report


def test_a_run_saturated_from_its_first_save_proposes_no_checkpoint_and_says_why():
    """As an LR too high from the first step: the logit scale is past the ceiling at the second save, and
    the first save, whose own values no pair measures, is not proposed unchecked."""
    report = shifted(run_report(10, scale=lambda i, n: 5.0), 100)
    assess_report(report, Thresholds())
    s = report.summary
    assert s.first_alert_step["attention"] == 200 and s.rollback_candidate is None
    assert s.resume.checkpoint is None and s.resume.trainer is None
    assert s.resume.reason.startswith("no saved checkpoint before the departure holds: the first save, step 100, "
                                      "its own signals were not measured")
    assert ("at the first alert, step 200, attention logit scale 5 above the ceiling 2 for d_model 64 or less "
            "(healthy runs stay under it); restart from initialisation with the interventions below") \
        in s.resume.reason
    assert (s.resume.skip_first_step, s.resume.skip_last_step) == (1, 200)
    assert "QK-norm" in s.resume.interventions


def test_a_run_saturated_from_its_first_steps_resumes_from_the_initialisation_when_it_was_saved():
    report = run_report(10, scale=lambda i, n: 5.0)
    assess_report(report, Thresholds())
    s = report.summary
    assert s.rollback_candidate.step == 0 and s.resume.checkpoint.path == "run/checkpoint-0"
    assert s.resume.reason == "step 0 holds: the initialisation: no update before it"


def test_the_candidate_holds_on_its_own_when_the_departure_began_after_it():
    report = run_report(12, scale=lambda i, n: 1.0 if i < 8 else 2.5)
    assess_report(report, Thresholds())
    s = report.summary
    assert s.first_alert_step["attention"] == 900 and s.rollback_candidate.step == 800
    assert s.resume.reason == ("step 800 holds: attention logit scale 1 under the ceiling 2 for d_model 64, the "
                               "update into it (step 700 → 800) within the run's healthy history")
    assert s.resume.trainer["framework"] == "Hugging Face Trainer"


def test_a_candidate_whose_update_departed_is_passed_over_for_the_newest_that_holds():
    warned = alert("delta2_entropy_norm", "attention", "cusum", 4.9, 500, severity="warn")
    s = summarize(run({500: {0: [warned]}, 600: {1: [alert("qk_logit_bound", "attention", "cusum", 5.0, 600)]}}))
    assert s.first_alert_onset_step == 600 and s.rollback_candidate.step == 400
    assert s.resume.rejected == [{"path": "run/checkpoint-500", "step": 500, "why": (
        "the update into it (step 400 → 500) departed from the run's healthy history: delta2_entropy_norm cusum "
        "(layer 0)")}]
    assert s.resume.reason.startswith("step 400 holds: ")
    assert (s.resume.skip_first_step, s.resume.skip_last_step) == (401, 600)


def test_a_rise_of_the_learning_rate_resumes_before_it_at_the_rate_before_it():
    report = run({700: {1: [alert("qk_logit_bound", "attention", "cusum", 5.0, 700)]}})
    rise = report.pairs[6]
    rise.lr = 0.03
    rise.layers[0].findings.append(Finding("lr", "update", "info", 10.0, "the learning rate rose ×10 into the updates "
                                           "from step 600 to 700 (0.003 → 0.03): a resume", rule="lr_rise"))
    s = summarize(report)
    assert s.primary_family == "update" and s.rollback_candidate.step == 600
    lr = s.resume.lr
    assert (lr["current"], lr["rise_from_step"], lr["rise_to_step"]) == (0.03, 600, 700)
    assert abs(lr["resume_with"] - 0.003) < 1e-15


def test_a_state_saved_before_the_checks_is_refused_so_the_run_is_judged_again():
    state = SummaryState()
    report = run({})
    state.add(0, report.pairs[0], lambda step: _onset(report.pairs, 0, step))
    saved = state.to_dict()
    del saved["checks"]
    with pytest.raises(KeyError):
        SummaryState.from_dict(saved)


def test_a_candidate_further_back_than_the_checks_kept_is_never_proposed_unchecked():
    """The state keeps the first checkpoint's check, the newest CHECKS_KEPT and the newest holding before
    them: a departure that began 80 pairs before its alert resumes from a kept checkpoint that holds."""
    s = summarize(run({9000: {0: [alert("delta2_entropy_norm", "attention", "cusum", 5.0, 1000)]}}, num_pairs=95))
    assert s.first_alert_onset_step == 1000 and CHECKS_KEPT < 80
    assert s.resume.rejected == [{"path": "run/checkpoint-900", "step": 900, "why": (
        f"its own check was not kept: it is more than {CHECKS_KEPT} checkpoints before the first alert")}]
    assert s.rollback_candidate.step == 0 and s.resume.reason.startswith("step 0 holds: the initialisation")
