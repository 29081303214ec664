"""scan_run end to end on generated runs: a planted spectral collapse is
flagged at or right after its step in the attention family; a healthy run
whose update norms follow an LR schedule (×10) is not flagged."""

import json
import math

import pytest
from safetensors.torch import load_file

from ckptscan.errors import CkptScanError
from ckptscan.document.writing import write_json
from ckptscan import scan_run
from ckptscan.pipeline.run import plan_pairs

from factories import write_hf_checkpoint
from run_factory import write_run

COLLAPSE = 1200


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")

    def loss(step):
        # Improves, then (with the fault) climbs for good from step 1800.
        return 3.0 * math.exp(-step / 500) + 1.0 + (0.002 * (step - 1800) if step > 1800 else 0.0)

    return {
        "healthy": write_run(root / "healthy", count=24),
        "collapse": write_run(root / "collapse", count=24, collapse_layer=1, collapse_from=COLLAPSE, loss=loss),
        "from_start": write_run(root / "from_start", count=14, collapse_layer=1, collapse_from=100, collapse_rank=4),
        "healthy_short": write_run(root / "healthy_short", count=14),
    }


def test_healthy_run_with_an_lr_schedule_is_not_flagged(runs):
    report = scan_run(runs["healthy"])
    rel = [p.layers[0].attention.dwq_rel_norm for p in report.pairs]
    assert max(rel) / min(rel) > 5  # update norms do follow the schedule
    assert report.summary.status == "ok"
    assert not [f for p in report.pairs for layer in p.layers for f in layer.findings if f.severity != "info"]


def test_planted_collapse_is_flagged_at_or_right_after_its_step_in_the_attention_family(runs):
    report = scan_run(runs["collapse"])
    s = report.summary
    assert s.status == "alert" and s.first_family == "attention"
    assert COLLAPSE <= s.first_alert_step["attention"] <= COLLAPSE + 100
    assert s.first_alert_step["router"] is None and s.first_alert_step["numeric"] is None
    assert s.first_warn_step["attention"] == COLLAPSE  # visible at once as a warning
    assert s.rollback_candidate.step == COLLAPSE - 100
    assert s.rollback_candidate.path.endswith(f"checkpoint-{COLLAPSE - 100}")
    assert s.flagged_layers == [1]
    assert [(layer.layer, layer.status) for layer in s.layers] == [(0, "ok"), (1, "alert")]


def test_loss_log_gives_pair_losses_divergence_and_lead(runs):
    run = runs["collapse"]
    report = scan_run(run, loss_log=run / "train_log.jsonl")
    s = report.summary
    assert report.pairs[0].loss == pytest.approx(sum(3.0 * math.exp(-t / 500) + 1.0 for t in range(100)) / 100)
    assert s.loss_divergence_step is not None and s.loss_divergence_step > 1800
    assert s.lead_steps == s.loss_divergence_step - s.first_alert_step["attention"] > 0
    assert report.settings["lr_warmup_end_step"] == 300  # the LR peaks at the 4th checkpoint interval
    assert report.settings["loss_log"] == str(run / "train_log.jsonl")


def test_stride_and_fixed_base(runs):
    strided = scan_run(runs["collapse"], stride=2)
    assert [(p.from_step, p.to_step) for p in strided.pairs][:2] == [(0, 200), (200, 400)]
    assert strided.settings["pending_steps"] == [2300]
    assert strided.summary.first_family == "attention"
    based = scan_run(runs["collapse"], base="first", stride=4)
    assert [(p.from_step, p.to_step) for p in based.pairs] == [(0, 400), (0, 800), (0, 1200), (0, 1600), (0, 2000)]


def test_a_fault_from_the_start_needs_a_reference_run(runs, tmp_path):
    run = runs["from_start"]
    assert scan_run(run).summary.status == "ok"  # nothing to compare with within the run
    write_json(scan_run(runs["healthy_short"]), tmp_path / "healthy.json")
    report = scan_run(run, reference=tmp_path / "healthy.json")
    assert report.summary.status == "alert" and report.summary.first_family == "attention"
    assert report.summary.flagged_layers == [1]
    assert report.settings["reference"] == str(tmp_path / "healthy.json")
    finding = next(f for p in report.pairs for f in p.layers[1].findings if f.severity == "alert")
    assert finding.rule == "reference"


def test_reference_of_another_model_is_a_user_error(runs, tmp_path):
    path = tmp_path / "other.json"
    write_json(scan_run(runs["healthy_short"]), path)
    data = json.loads(path.read_text())
    data["model"]["hidden_size"] = 128
    path.write_text(json.dumps(data))
    with pytest.raises(CkptScanError, match="different model"):
        scan_run(runs["from_start"], reference=path)
    path.write_text("[1, 2]")
    with pytest.raises(CkptScanError, match="not a ckptscan JSON report"):
        scan_run(runs["from_start"], reference=path)


def test_plan_pairs():
    assert plan_pairs(5) == [(0, 1), (1, 2), (2, 3), (3, 4)]
    assert plan_pairs(6, stride=2) == [(0, 2), (2, 4)]
    assert plan_pairs(5, base="first") == [(0, 1), (0, 2), (0, 3), (0, 4)]
    with pytest.raises(CkptScanError, match="--stride"):
        plan_pairs(5, stride=0)
    with pytest.raises(CkptScanError, match="--base"):
        plan_pairs(5, base="last")


def test_too_few_checkpoints(tmp_path):
    write_run(tmp_path / "one", count=1)
    with pytest.raises(CkptScanError, match="at least two"):
        scan_run(tmp_path / "one")
    with pytest.raises(CkptScanError, match="leaves no pair"):
        scan_run(write_run(tmp_path / "three", count=3), stride=5)


def test_non_finite_weights_alert_in_the_numeric_family(runs, tmp_path):
    run = tmp_path / "nan"
    run.mkdir()
    for ckpt in sorted(runs["healthy_short"].iterdir(), key=lambda p: int(p.name.split("-")[1]))[:10]:
        (run / ckpt.name).symlink_to(ckpt)
    broken = load_file(runs["healthy_short"] / "checkpoint-900" / "model.safetensors")
    broken["model.layers.0.self_attn.q_proj.weight"][3, 5] = float("nan")
    (run / "checkpoint-900").unlink()
    config = json.loads((runs["healthy_short"] / "checkpoint-900" / "config.json").read_text())
    write_hf_checkpoint(run / "checkpoint-900", broken, config)
    report = scan_run(run)
    s = report.summary
    assert s.status == "alert" and s.first_family == "numeric"
    assert s.first_alert_step["numeric"] == 900
    assert s.rollback_candidate.step == 800
    finding = next(f for f in report.pairs[8].layers[0].findings if f.family == "numeric")
    assert finding.value == 1.0 and "W_q" in finding.message
