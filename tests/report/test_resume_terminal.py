"""The resume plan in the terminal (`diff`, `trend`): the rollback candidate,
then one short line a point — why it holds (each signal as "value ≤ ceiling")
or why none does, the steps to skip, the learning rate to go back to, the
trainer's arguments — within the 80 and 120 columns the tables fit."""

from pathlib import Path

import pytest
from rich.console import Console

from ckptscan import scan_run
from ckptscan.detection.rules import Thresholds, assess_report
from ckptscan.report.resume import shorter, terminal_lines
from ckptscan.report.trend_table import print_trend
from ckptscan.schema.results import CheckpointRef, Resume, Summary

from detection.helpers import run_report
from report.test_resume import alerting_run

SAMPLES = Path(__file__).resolve().parents[2] / "sample_checkpoints"


def test_a_candidate_that_holds_is_named_with_why_the_steps_to_skip_and_the_trainers_flag():
    assert terminal_lines(alerting_run().summary) == [
        "rollback candidate: out/checkpoint-800 (step 800), the last checkpoint before the departure that raised "
        "the first alert began",
        "  it holds on its own: attention logit scale 1 ≤ 2 (d_model 64), its update 700 → 800 within the run's "
        "healthy history",
        "  skip: the updates of steps 801–900, within which the departure began",
        "  Hugging Face Trainer: --resume_from_checkpoint out/checkpoint-800 (it takes no range of steps to skip)",
    ]


def test_when_none_holds_the_terminal_says_so_and_gives_each_reason_on_its_own_line():
    """A run whose first save is step 100 (not measured) and past the ceiling from the first pair: none holds."""
    report = run_report(6, scale=lambda i, n: 2.5)
    for pair in report.pairs:
        pair.from_step, pair.to_step = pair.from_step + 100, pair.to_step + 100
        pair.from_path, pair.to_path = f"out/checkpoint-{pair.from_step}", f"out/checkpoint-{pair.to_step}"
    assess_report(report, Thresholds())
    assert report.summary.rollback_candidate is None
    assert terminal_lines(report.summary) == [
        "rollback candidate: none: no saved checkpoint before the departure holds",
        "  the first save, step 100, not measured (ckptscan measures a checkpoint as the newer one of a pair)",
        "  at the first alert, step 200, attention logit scale 2.5 > 2 (d_model ≤ 64)",
        "  restart from initialisation with the interventions below, or from an earlier save that a trend over the "
        "saves up to step 100 finds to hold",
        "  skip: the updates of steps 1–200, within which the departure began",
    ]


def test_the_learning_rate_line_and_a_walk_back():
    plan = Resume(CheckpointRef("save/iter_0000600", 600), "step 600 holds: attention logit scale 1.2 under the "
                  "ceiling 2 for d_model 64; passed over: step 700, attention logit scale 2.4 above the ceiling 2 "
                  "for d_model 64", rejected=[{"path": "save/iter_0000700", "step": 700, "why": "…"}],
                  skip_first_step=601, skip_last_step=800,
                  lr={"current": 0.03, "resume_with": 0.003, "rise_from_step": 600, "rise_to_step": 700,
                      "source": "the loss log"},
                  trainer={"framework": "Megatron-LM", "evidence": "…", "skip": "…", "source": "…",
                           "arguments": ["--load save --ckpt-step 600 --iterations-to-skip $(seq 601 800)"]})
    assert terminal_lines(Summary("alert", [], {}, rollback_candidate=plan.checkpoint, resume=plan)) == [
        "rollback candidate: save/iter_0000600 (step 600), the newest checkpoint before the departure that holds on "
        "its own (1 newer one fails its own check)",
        "  it holds on its own: attention logit scale 1.2 ≤ 2 (d_model 64)",
        "  passed over: step 700, attention logit scale 2.4 > 2 (d_model 64)",
        "  skip: the updates of steps 601–800, within which the departure began",
        "  learning rate: back to 0.003 from 0.03 (it rose into the updates from step 600 to 700)",
        "  Megatron-LM: --load save --ckpt-step 600 --iterations-to-skip $(seq 601 800)",
    ]


def test_live_modes_snapshot_is_named_as_the_trainers_checkpoint_at_its_step():
    plan = Resume(CheckpointRef("live:step-400", 400), "step 400 holds: …")
    assert terminal_lines(Summary("alert", [], {}, resume=plan))[0].startswith(
        "rollback candidate: the trainer's checkpoint at step 400 (live mode's snapshot of that step)")


def test_without_an_alert_nothing_is_printed():
    assert terminal_lines(Summary("ok", [], {})) == []


def test_the_shorter_words_keep_every_number():
    text = ("the first save, step 1400, its own signals were not measured: it is the older checkpoint of the first "
            "pair, and ckptscan measures a checkpoint as the newer one of a pair; at the first alert, step 1500, "
            "attention logit scale 2.73 above the ceiling 2 for d_model 64 or less (healthy runs stay under it)")
    short = shorter(text)
    assert short == ("the first save, step 1400, not measured (ckptscan measures a checkpoint as the newer one of a "
                     "pair); at the first alert, step 1500, attention logit scale 2.73 > 2 (d_model ≤ 64)")


@pytest.mark.skipif(not (SAMPLES / "attention_fault").is_dir(), reason="sample_checkpoints/ not present")
@pytest.mark.parametrize("width", [80, 120])
def test_the_plan_on_the_attention_fault_sample_fits_and_stays_short(width):
    report = scan_run(SAMPLES / "attention_fault")
    console = Console(width=width, record=True, color_system=None)
    print_trend(console, report)
    lines = console.export_text().splitlines()
    start = next(k for k, line in enumerate(lines) if line.startswith("rollback candidate:"))
    end = next(k for k in range(start + 1, len(lines)) if "what to do" in lines[k])
    plan = lines[start:end]
    assert all(len(line) <= width for line in lines)
    assert len(plan) <= (7 if width == 120 else 10), plan  # its path here is absolute
    text = " ".join(" ".join(plan).split())
    assert "checkpoint-1300 (step 1300)" in text and "attention logit scale 1.9 ≤ 2 (d_model 64)" in text
    assert "skip: the updates of steps 1301–1400" in text
    assert "Hugging Face Trainer: --resume_from_checkpoint" in text
