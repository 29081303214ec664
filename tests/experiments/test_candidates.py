"""experiments.candidates (the table "Candidates before and after" in
docs/guides/resume.md): the logged inside view's readers, the ceiling check
of a candidate against the ceilings its report applies, and the judgement of
another checkout of the code in a subprocess."""

import math
from pathlib import Path

from factories import llama_config, llama_tensors, next_checkpoint, write_hf_checkpoint

from ckptscan import scan_run
from ckptscan.document.writing import write_json
from experiments.candidates import ceiling_check, first_past, holds_now, judge_before, judged, logit_at

ROOT = Path(__file__).resolve().parents[2]


def test_the_logged_logit_passes_its_bound_at_the_first_step_above_it_or_not_finite(tmp_path):
    steps = [0, 1, 2, 3, 4]
    assert first_past(steps, [1.0, 5.0, 5.5, 9.0, 2.0], 5.0) == 2  # strictly above
    assert first_past(steps, [1.0, None, 9.0, 9.0, 9.0], 5.0) == 1  # a non-finite logit is logged null
    assert first_past(steps, [1.0, 2.0, math.inf, 9.0, 9.0], 5.0) == 2
    assert first_past(steps, [1.0, 2.0, 3.0, 4.0, 5.0], 5.0) is None
    assert logit_at(steps, [1.0, 2.0, 3.0, 4.0, 5.0], 3) == 4.0
    assert logit_at(steps, [1.0, 2.0, 3.0, 4.0, 5.0], 100) is None


def blowing_up_run(tmp_path: Path) -> Path:
    """Checkpoints 0-1000 every 100 of one run whose W_q and W_k grow ×10 each at step 800 (its logit scale
    ×100, past the ceiling)."""
    config = llama_config(layers=2, hidden=64, heads=4, kv_heads=2)
    tensors = llama_tensors(config, 3)
    run = tmp_path / "run"
    for k in range(11):
        if k:
            tensors = next_checkpoint(tensors, 100 + k)
        if k == 8:
            tensors = {n: t * 10 if "q_proj" in n or "k_proj" in n else t for n, t in tensors.items()}
        write_hf_checkpoint(run / f"checkpoint-{100 * k}", tensors, config)
    write_json(scan_run(run), run / "metrics.json")
    return run


def test_a_candidate_is_checked_against_the_ceilings_its_report_applies(tmp_path):
    run = blowing_up_run(tmp_path)
    report, t = judged(run, False, None)
    resume = report.summary.resume
    assert resume is not None and resume.checkpoint is not None
    step = resume.checkpoint.step
    assert 0 < step < 800
    verdict, problems, ratio, signal = ceiling_check(report, step)
    pair = next(p for p in report.pairs if p.to_step == step)
    scale = max(layer.attention.logit_scale for layer in pair.layers)
    assert verdict == "yes" and problems == []
    applied = report.thresholds
    ratios = {"attention logit scale": scale / applied["logit_scale_ceiling"]}
    for name, key, ceiling in (("output logit scale", "output_logit_rms", "output_logit_scale_ceiling"),
                               ("log Z shift scale", "output_shift", "output_shift_ceiling")):
        values = [layer.families["output"][key] for layer in pair.layers
                  if layer.families.get("output", {}).get(key) is not None]
        if values:
            ratios[name] = max(values) / applied[ceiling]
    assert len(ratios) == 3 and (signal, ratio) == max(ratios.items(), key=lambda item: item[1])
    # The checkpoint after the jump is past the ceiling the report applies; so is the candidate once the
    # report's ceiling is lowered under its own scale.
    assert ceiling_check(report, 800)[0] == "NO"
    report.thresholds["logit_scale_ceiling"] = scale * 0.999
    verdict, problems, _, _ = ceiling_check(report, step)
    assert verdict == "NO" and problems[0].startswith("attention logit scale")
    assert ceiling_check(report, 0)[0] == "initialisation"
    assert holds_now(report, t, 800, pair.to_path.replace(f"checkpoint-{step}", "checkpoint-800")) is False


def test_without_checkpoint_0_the_first_save_is_never_measured(tmp_path):
    run = blowing_up_run(tmp_path)
    report, t = judged(run, True, None)
    assert report.pairs[0].from_step == 100
    assert holds_now(report, t, 100, report.pairs[0].from_path) is False
    assert ceiling_check(report, 100)[0] == "NO"


def test_another_checkout_judges_the_same_metrics_in_a_subprocess(tmp_path):
    # This checkout as the "before" one: its rollback candidate is the one judged in process.
    run = blowing_up_run(tmp_path)
    for drop in (False, True):
        report, _ = judged(run, drop, None)
        s = report.summary
        alerts = [step for step in s.first_alert_step.values() if step is not None]
        expected = [s.rollback_candidate.step, s.rollback_candidate.path] if s.rollback_candidate else [None, None]
        assert judge_before(ROOT, [(run, drop, None)]) == [[*expected, min(alerts)]]
