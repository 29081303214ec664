"""A checkpoint is proposed to resume from only when it holds on its own: its
absolute signals under the ceilings the report applies (at the model's
width), and the update into it within the run's healthy history. Checked
against a float64 brute force on random checkpoints; the walk back lands on
the newest checkpoint that holds, or on none."""

import random
from dataclasses import replace

from ckptscan.detection.optimizer import DECAYED_SHARE
from ckptscan.detection.resume import (
    CheckpointCheck,
    check_checkpoint,
    first_checkpoint,
    newest_holding,
    resume_plan,
)
from ckptscan.detection.thresholds import Thresholds
from ckptscan.monitors import registry
from ckptscan.schema.results import Finding, LayerResult, PairResult

from detection.helpers import layer_result
from monitors.toy_family import CEILING, MONITOR, NAME, TOY


def checkpoint_pair(layers, from_step=100, to_step=200, findings=(), not_judged=None):
    return PairResult(from_step, to_step, layers, f"run/checkpoint-{from_step}", f"run/checkpoint-{to_step}",
                      not_judged_reason=not_judged)


def random_layer(rng, number, t):
    """A layer whose absolute signals are drawn around their ceilings (some missing)."""
    def around(ceiling):
        return None if rng.random() < 0.2 else rng.uniform(0.0, 1.3 * ceiling)
    layer = layer_result(number, scale=around(t.logit_scale_ceiling))
    layer.attention.qk_norm_logit_bound = around(t.qk_norm_logit_ceiling)
    layer.families = {"output": {"output_logit_rms": around(t.output_logit_scale_ceiling),
                                 "output_shift": around(t.output_shift_ceiling)}}
    if rng.random() < 0.5:
        layer.families["optimizer"] = {"v_below_eps2": rng.uniform(0.0, 1.3 * DECAYED_SHARE)}
    if rng.random() < 0.05:
        layer.nonfinite = {"W_q": rng.randint(1, 5)}
    return layer


def brute_force_holds(layers, t):
    """The check written out: every signal's every layer under its ceiling, in float64."""
    for layer in layers:
        a, out = layer.attention, layer.families.get("output", {})
        limits = [(a.logit_scale, t.logit_scale_ceiling), (a.qk_norm_logit_bound, t.qk_norm_logit_ceiling),
                  (out.get("output_logit_rms"), t.output_logit_scale_ceiling),
                  (out.get("output_shift"), t.output_shift_ceiling)]
        if any(value is not None and float(value) > float(limit) for value, limit in limits):
            return False
        share = layer.families.get("optimizer", {}).get("v_below_eps2")
        if share is not None and share >= DECAYED_SHARE:
            return False
        if any(count for count in layer.nonfinite.values()):
            return False
    return True


def test_a_checkpoint_holds_exactly_when_every_absolute_signal_is_under_its_ceiling_at_its_width():
    rng = random.Random(51)
    held = failed = 0
    for _ in range(400):
        t = Thresholds().at_width(rng.choice([32, 64, 128, 256, 1024, 4096]))
        layers = [random_layer(rng, n, t) for n in range(rng.randint(1, 4))]
        check = check_checkpoint(checkpoint_pair(layers), t)
        expected = brute_force_holds(layers, t)
        assert check.holds == expected, (check.problems, check.facts)
        held, failed = held + expected, failed + (not expected)
        scales = [layer.attention.logit_scale for layer in layers if layer.attention.logit_scale is not None]
        if scales and max(scales) > t.logit_scale_ceiling:
            # The largest scale over the layers is the one named, with the ceiling at this width.
            assert f"attention logit scale {max(scales):.3g}" in check.problems[0]
            assert f"above the ceiling {t.logit_scale_ceiling:.3g}" in check.problems[0]
    assert held > 20 and failed > 20  # both outcomes were exercised


def test_the_ceiling_is_the_one_at_the_models_width():
    """A scale of 3 is past the ceiling 2 at d_model 64, and under 2·√(256/64) = 4 at d_model 256."""
    pair = checkpoint_pair([layer_result(0, scale=3.0)])
    assert not check_checkpoint(pair, Thresholds().at_width(64)).holds
    wide = check_checkpoint(pair, Thresholds().at_width(256))
    assert wide.holds and "attention logit scale 3 under the ceiling 4 for d_model 256" in wide.facts


def test_an_update_that_departed_from_the_healthy_history_fails_the_check_an_info_or_precision_finding_does_not():
    layer = layer_result(0, scale=1.0)
    layer.findings = [Finding("lr", "update", "info", 10.0, "the learning rate rose", rule="lr_rise"),
                      Finding("changed_fraction", "numeric", "warn", 0.1, "below the dtype", rule="precision")]
    assert check_checkpoint(checkpoint_pair([layer]), Thresholds()).holds
    layer.findings.append(Finding("delta2_entropy_norm", "attention", "warn", 0.3,
                                  "Δ2 H/ln n 0.3: CUSUM of its departures is 4.9", rule="cusum", score=4.9))
    check = check_checkpoint(checkpoint_pair([layer]), Thresholds())
    assert check.problems == ["the update into it (step 100 → 200) departed from the run's healthy history: "
                              "Δ2 H/ln n 0.3 (layer 0)"]


def test_an_update_not_judged_is_said_so_and_the_checkpoint_rests_on_its_absolute_signals():
    check = check_checkpoint(checkpoint_pair([layer_result(0, scale=1.0)], not_judged="warm-up"), Thresholds())
    assert check.holds and check.facts[-1] == ("the update into it (step 100 → 200) not judged against the run's "
                                               "history: warm-up")


def test_the_first_checkpoint_is_not_measured_unless_it_is_the_initialisation():
    assert first_checkpoint(checkpoint_pair([], 0, 100)).holds
    first = first_checkpoint(checkpoint_pair([], 100, 200))
    assert not first.holds and "its own signals were not measured" in first.problems[0]


def test_when_the_initialisation_itself_fails_no_earlier_save_is_offered():
    checks = [CheckpointCheck("run/checkpoint-0", 0, ["non-finite values in W_q (layer 0)"])]
    assert resume_plan(checks, 0, 100, None, [], None).reason == (
        "no saved checkpoint before the departure holds: the first save, step 0, non-finite values in W_q (layer 0); "
        "restart from initialisation with the interventions below")


def test_the_walk_back_lands_on_the_newest_checkpoint_at_or_before_the_candidate_that_holds():
    rng = random.Random(7)
    for _ in range(300):
        holds = [rng.random() < 0.4 for _ in range(rng.randint(1, 12))]
        start = rng.randrange(len(holds))
        checks = [CheckpointCheck(f"c{i}", i * 100, [] if h else ["fails"]) for i, h in enumerate(holds)]
        expected = max((i for i in range(start + 1) if holds[i]), default=None)
        assert newest_holding(checks, start) == expected
        plan = resume_plan(checks, start, (start + 1) * 100, None, [], "evidence")
        if expected is None:
            assert plan.checkpoint is None and len(plan.rejected) == start + 1
            assert (plan.skip_first_step, plan.skip_last_step) == (1, (start + 1) * 100)
        else:
            assert plan.checkpoint.step == expected * 100 and len(plan.rejected) == start - expected
            assert (plan.skip_first_step, plan.skip_last_step) == (expected * 100 + 1, (start + 1) * 100)
        assert [r["step"] for r in plan.rejected] == sorted((r["step"] for r in plan.rejected), reverse=True)


def test_when_none_holds_the_plan_says_why_and_restarts_from_initialisation_or_an_earlier_save_that_holds():
    """The first checkpoint of the report, unmeasured, may have saves before it that this report does not hold."""
    checks = [first_checkpoint(checkpoint_pair([], 100, 200))]
    plan = resume_plan(checks, 0, 200, None, [{"short": "lower LR", "action": "lower it"}],
                       "attention logit scale 9.1 above the ceiling 2 for d_model 64 or less")
    assert plan.checkpoint is None and plan.trainer is None and plan.interventions == ["lower LR"]
    assert plan.reason == (
        "no saved checkpoint before the departure holds: the first save, step 100, its own signals were not "
        "measured: it is the older checkpoint of the first pair, and ckptscan measures a checkpoint as the newer "
        "one of a pair; at the first alert, step 200, attention logit scale 9.1 above the ceiling 2 for d_model 64 "
        "or less; restart from initialisation with the interventions below, or from an earlier save once ckptscan "
        "finds one that holds (a trend over the saves up to step 100)")


def test_a_layer_without_attention_or_output_values_is_judged_on_what_it_has():
    layer = LayerResult(0)
    check = check_checkpoint(checkpoint_pair([layer]), Thresholds())
    assert check.holds and check.facts == ["the update into it (step 100 → 200) within the run's healthy history"]


def toy_with_ceiling_and_own_check():
    """The toy family (tests/monitors/toy_family.py) with its monitor's
    ceiling declared, and an own check of the checkpoint that fails above
    0.5 and names the rule `toy_own` as the checkpoint's, not its update's."""
    def own_check(pair, section):
        worst = max((layer.families.get(NAME, {}).get(MONITOR) or 0.0 for layer in pair.layers), default=0.0)
        return ([f"toy share {worst:g} (≥ 0.5)"], []) if worst >= 0.5 else ([], [f"toy share {worst:g}"])

    monitor = replace(TOY.monitors[0], ceiling=CEILING, words="toy ‖Wq‖ change")
    return replace(TOY, monitors=(monitor,), own_check=own_check, own_rules=("toy_own",))


def test_a_registered_familys_ceilings_and_own_check_judge_the_candidate_after_the_built_in_ones():
    """A family judged by no ckptscan module by name: its monitor's ceiling
    (in its own thresholds section) and its own check are part of every
    checkpoint's check, in the registry's order (after the built-in
    families), and a finding of a rule it names as its own is not a departure
    of the update."""
    toy = toy_with_ceiling_and_own_check()
    rng = random.Random(53)
    with registry.registered(toy):
        for _ in range(200):
            t = Thresholds(**{"q_norm_change_ceiling": rng.choice([0.1, 1.0])})
            values = [None if rng.random() < 0.2 else rng.uniform(0.0, 1.3) for _ in range(rng.randint(1, 4))]
            layers = []
            for number, value in enumerate(values):
                layer = layer_result(number, scale=1.0)
                layer.families = {"toy": {"q_norm_change": value}}
                layer.findings = [Finding("q_norm_change", "toy", "warn", 0.0, "own", rule="toy_own")]
                layers.append(layer)
            check = check_checkpoint(checkpoint_pair(layers), t)
            known = [(v, n) for n, v in enumerate(values) if v is not None]
            toy_lines = [line for line in check.problems + check.facts if line.startswith("toy")]
            if not known:
                assert check.holds and toy_lines == ["toy share 0"]
                continue
            largest, layer_number = max(known)  # brute force: the largest value and its layer, in float64
            over = float(largest) > float(t.q_norm_change_ceiling)
            assert check.holds == (not over and largest < 0.5), (check.problems, check.facts)
            said = (f"toy ‖Wq‖ change {largest:.3g} (layer {layer_number}) above the ceiling "
                    f"{t.q_norm_change_ceiling:.3g}" if over else
                    f"toy ‖Wq‖ change {largest:.3g} under the ceiling {t.q_norm_change_ceiling:.3g}")
            own = f"toy share {largest:g} (≥ 0.5)" if largest >= 0.5 else f"toy share {largest:g}"
            assert sorted(toy_lines) == sorted([said, own])
            if not over:  # after the built-in families' facts: the registry's order
                assert check.facts.index(said) > check.facts.index(
                    "attention logit scale 1 under the ceiling 2 for d_model 64")
    assert check_checkpoint(checkpoint_pair([layer_result(0, scale=1.0)]), Thresholds()).facts[0] == \
        "attention logit scale 1 under the ceiling 2 for d_model 64"  # gone again once unregistered
