"""experiments.sweeps: which runs make each recipe's sweep (never a faulty
run's healthy twin), and the lead it reports."""

from experiments.corpus import load_manifest
from experiments.evaluate import window_lead as lead
from experiments.sweeps import sweeps


def generated(corpus, names):
    for name in names:
        (corpus / name).mkdir(parents=True)
        (corpus / name / "metrics.json").write_text("{}")


def test_a_sweep_holds_the_faulty_runs_and_the_healthy_runs_of_other_seeds(tmp_path):
    generated(tmp_path, [f"mx2-fp32-const-s{s}-healthy" for s in (0, 1, 2, 3, 4)]
              + ["mx2-fp32-const-s0-attn0-b2", "mx2-fp32-const-s2-attn0-b2"])
    (tmp_path / "mx2-fp32-const-s2-router1000").mkdir()  # not finished: no metrics.json
    found = sweeps(load_manifest(), tmp_path)
    assert [(title, stride) for title, _, stride in found] == [("mx2-fp32-const", 1)]
    assert [run["name"] for run in found[0][1]] == [
        "mx2-fp32-const-s1-healthy", "mx2-fp32-const-s3-healthy", "mx2-fp32-const-s4-healthy",
        "mx2-fp32-const-s0-attn0-b2", "mx2-fp32-const-s2-attn0-b2"]


def test_generation_3_is_also_swept_every_fourth_checkpoint_and_a_sweep_needs_a_fault_and_three_runs(tmp_path):
    generated(tmp_path, [f"g3-ll6-bf16-cos-i50-s{s}-healthy" for s in (0, 1, 2)]
              + ["g3-ll6-bf16-cos-i50-s3-attn0-b2", "ll4-bf16-const-s0-healthy", "ll4-bf16-const-s1-healthy",
                 "ll4-bf16-const-s3-healthy", "ll2-fp32-wsd-s3-healthy", "ll2-fp32-wsd-s2-attn0-b3"])
    found = sweeps(load_manifest(), tmp_path)
    assert [(title, len(runs), stride) for title, runs, stride in found] == [
        ("g3-ll6-bf16-cos-i50", 4, 1), ("g3-ll6-bf16-cos-i50 seen every 200 steps", 4, 4)]


def test_lead_is_the_share_of_the_onset_to_divergence_window_and_zero_for_a_late_alarm():
    assert lead(0, 1000, 600) == 0.4
    assert lead(500, 1500, 1000) == 0.5
    assert lead(0, 1000, 1000) == 0.0 and lead(0, 1000, None) == 0.0
    assert lead(0, None, 600) is None and lead(None, 1000, 600) is None


def test_the_healthy_reference_sets_are_those_of_the_held_out_runs_once_each_when_generated(tmp_path):
    from experiments.sweeps import healthy_reference_sets

    generated(tmp_path, [f"g3-ll6-bf16-cos-i50-s{s}-healthy" for s in (0, 1, 2)]
              + [f"ll4-bf16-const-s{s}-healthy" for s in (0, 1, 3)])  # ll4's seed 4 not yet trained
    assert healthy_reference_sets(load_manifest(), tmp_path) == [
        [f"g3-ll6-bf16-cos-i50-s{s}-healthy" for s in (0, 1, 2)]]
