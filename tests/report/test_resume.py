"""The resume plan reads the same in the terminal's lines, the Markdown and
the HTML report: where to resume and why it holds (or that none does), the
steps to skip, the learning rate to go back to, the trainer's arguments."""

import html

from ckptscan.detection.rules import Thresholds, assess_report
from ckptscan.report.html_page import html_page
from ckptscan.document.plain import report_dict
from ckptscan.report.markdown import markdown_report
from ckptscan.report.resume import lr_text, resume_lines, rollback_why
from ckptscan.schema.results import CheckpointRef, Resume, Summary

from detection.helpers import run_report


def alerting_run(first_step=0):
    """A run whose attention logit scale passes the ceiling at step 900 (from step `first_step`)."""
    report = run_report(12, scale=lambda i, n: 1.0 if i < 8 else 2.5)
    for pair in report.pairs:
        pair.from_step, pair.to_step = pair.from_step + first_step, pair.to_step + first_step
        pair.from_path, pair.to_path = f"out/checkpoint-{pair.from_step}", f"out/checkpoint-{pair.to_step}"
    assess_report(report, Thresholds())
    return report


def test_the_lines_say_where_why_what_to_skip_and_the_trainers_words():
    lines = resume_lines(alerting_run().summary)
    assert lines == [
        "resume from: out/checkpoint-800: step 800 holds: attention logit scale 1 under the ceiling 2 for d_model "
        "64, the update into it (step 700 → 800) within the run's healthy history",
        "  skip: the updates of steps 801–900, within which the departure began (from the resume point to the first "
        "alert)",
        "  Hugging Face Trainer (its checkpoint-N folders are the Hugging Face Trainer's naming): "
        "--resume_from_checkpoint out/checkpoint-800, or trainer.train(resume_from_checkpoint=\"out/checkpoint-800\"); "
        "the Trainer takes no range of steps to skip (ignore_data_skip only decides whether the batches before "
        "the checkpoint are fast-forwarded)",
    ]


def test_without_an_alert_there_are_no_lines():
    assert resume_lines(Summary("ok", [], {})) == []


def test_when_none_holds_the_first_line_says_so_and_no_trainer_line_follows():
    summary = Summary("alert", [], {}, resume=Resume(None, "no saved checkpoint before the departure holds: …",
                                                     skip_first_step=1, skip_last_step=200))
    assert resume_lines(summary) == [
        "resume from: none: no saved checkpoint before the departure holds: …",
        "  skip: the updates of steps 1–200, within which the departure began (from the resume point to the first alert)"]


def test_the_learning_rate_line_goes_back_to_the_rate_before_the_rise_with_its_source():
    plan = Resume(CheckpointRef("run/x", 600), "step 600 holds", lr={
        "current": 0.03, "resume_with": 0.003, "rise_from_step": 600, "rise_to_step": 700, "source": "the loss log"})
    assert lr_text(plan) == ("learning rate: back to 0.003 from 0.03 (it rose into the updates from step 600 to 700; "
                             "the loss log)")
    assert resume_lines(Summary("alert", [], {}, resume=plan))[-1] == \
        "  no trainer named by the run's folder naming: the plan stays generic"


def test_markdown_and_html_carry_the_same_plan():
    report = alerting_run()
    lines = [line.strip() for line in resume_lines(report.summary)]
    text = markdown_report(report)
    for line in lines:
        assert f"- {line}" in text
    assert "- then: QK-norm · logit soft-capping" in text
    page = html.unescape(html_page(report, report_dict(report), []))
    assert "<dt>resume plan</dt>" in page
    for line in lines:
        assert f"<dd>{line}</dd>" in page


def test_the_rollback_line_says_when_newer_candidates_were_passed_over():
    summary = alerting_run().summary
    assert rollback_why(summary) == "the last checkpoint before the departure that raised the first alert began"
    summary.resume.rejected = [{"path": "out/checkpoint-900", "step": 900, "why": "…"}]
    assert rollback_why(summary) == ("the newest checkpoint before the departure that holds on its own (1 newer one "
                                     "fails its own check)")
