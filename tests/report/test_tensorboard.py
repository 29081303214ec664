"""TensorBoard events, read back with TensorBoard's own reader: every
(layer, monitor) value of the JSON report at its pair's newer step, the
per-family summaries and findings; a re-run over a grown run appends only
the new steps; a training job's own event files are left alone."""

import copy
import dataclasses
import json
import shutil
import sys

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader
from tensorboard.compat.proto import event_pb2
from tensorboard.plugins.scalar.summary_v2 import scalar_pb
from tensorboard.summary.writer.event_file_writer import EventFileWriter
from tensorboard.util import tensor_util
from typer.testing import CliRunner

from ckptscan.cli import app
from ckptscan.report import tensorboard
from ckptscan.document.writing import write_json
from ckptscan.report.tensorboard import write_tensorboard

runner = CliRunner()
# Where each monitor lives in the JSON report (written out here, not taken from the catalog).
MONITOR_SECTIONS = {
    "delta2_entropy_norm": "attention", "delta2_entropy_norm_min": "attention", "dwq_entropy_norm": "attention",
    "dwk_entropy_norm": "attention", "qk_logit_bound": "attention", "routing_entropy_norm": "router",
    "load_cv": "router", "cosine_similarity": "router", "epsilon": "router", "logit_scale": "attention",
}
LEVEL = {"ok": 0, "unchanged": 0, "info": 1, "warn": 2, "alert": 3}
STATUS = {**LEVEL, "not_judged": -1}


def read_events(directory):
    """{tag: [(step, value)]} as TensorBoard loads the directory."""
    acc = EventAccumulator(str(directory), size_guidance={"tensors": 0})
    acc.Reload()
    return {tag: [(e.step, tensor_util.make_ndarray(e.tensor_proto)) for e in acc.Tensors(tag)]
            for tag in acc.Tags()["tensors"]}


def expected_scalars(data):
    """{tag: {step: float32 value}} from the JSON report alone."""
    expected = {}
    for pair in data["pairs"]:
        step = pair["to_step"]
        for layer in pair["layers"]:
            for monitor, section in MONITOR_SECTIONS.items():
                value = (layer[section] or {}).get(monitor)
                if value is not None:
                    expected.setdefault(f"{monitor}/layer_{layer['layer']}", {})[step] = np.float32(value)
            for values in layer.get("families", {}).values():  # a family's own values (output: the last layer)
                for monitor, value in values.items():
                    if value is not None:
                        expected.setdefault(f"{monitor}/layer_{layer['layer']}", {})[step] = np.float32(value)
            attention = layer["attention"] or {}
            if attention.get("dwq_rel_norm") is not None and attention.get("dwk_rel_norm") is not None:
                # The update family's one monitor: the larger relative update of W_q and W_k.
                expected.setdefault(f"update_size/layer_{layer['layer']}", {})[step] = \
                    np.float32(max(attention["dwq_rel_norm"], attention["dwk_rel_norm"]))
        for family in ("attention", "router", "update", "output", "optimizer", "numeric"):
            levels = [[LEVEL[f["severity"]] for f in layer["findings"] if f["family"] == family]
                      for layer in pair["layers"]]
            expected.setdefault(f"ckptscan/{family}_severity", {})[step] = np.float32(max(sum(levels, []), default=0))
            expected.setdefault(f"ckptscan/{family}_flagged_layers", {})[step] = \
                np.float32(sum(max(lv, default=0) >= 2 for lv in levels))
        expected.setdefault("ckptscan/status", {})[step] = np.float32(STATUS[pair["status"]])
        if pair["loss"] is not None:
            expected.setdefault("ckptscan/loss", {})[step] = np.float32(pair["loss"])
    return expected


def check_against_report(events, data):
    expected = expected_scalars(data)
    scalars = {tag: points for tag, points in events.items() if tag not in ("ckptscan/findings", "ckptscan/verdict")}
    assert set(scalars) == set(expected)
    for tag, points in scalars.items():
        steps = [step for step, _ in points]
        assert steps == sorted(set(steps)), f"{tag}: duplicate or out-of-order steps {steps}"
        assert {step: value.item() for step, value in points} == {s: v.item() for s, v in expected[tag].items()}, tag
    texts = {step: value.item().decode() for step, value in events["ckptscan/findings"]}
    assert sorted(texts) == [pair["to_step"] for pair in data["pairs"]]
    for pair in data["pairs"]:
        messages = [f["message"] for layer in pair["layers"] for f in layer["findings"]]
        assert all(message in texts[pair["to_step"]] for message in messages)
        if not messages:
            assert texts[pair["to_step"]] == "no findings"
    # One verdict per scan that had new steps, at its newest step.
    verdicts = events["ckptscan/verdict"]
    assert [step for step, _ in verdicts] == sorted({step for step, _ in verdicts})
    verdict_step, verdict = verdicts[-1]
    assert verdict_step == data["pairs"][-1]["to_step"] and data["summary"]["message"] in verdict.item().decode()


def test_events_hold_every_monitor_summary_and_finding_of_the_report(reports, tmp_path):
    write_json(reports["loss"], tmp_path / "report.json")
    result = runner.invoke(app, ["report", str(tmp_path / "report.json"), "--tensorboard", str(tmp_path / "tb")])
    assert result.exit_code == 0, result.output
    data = json.loads((tmp_path / "report.json").read_text())
    assert any(layer["router"] for pair in data["pairs"] for layer in pair["layers"])  # router monitors covered
    assert any(layer["findings"] for pair in data["pairs"] for layer in pair["layers"])
    check_against_report(read_events(tmp_path / "tb"), data)


def test_rerun_over_a_grown_run_appends_only_the_new_steps(runs, tmp_path):
    source, run, tb = runs["collapse"], tmp_path / "run", tmp_path / "tb"
    checkpoints = sorted(source.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    # A training job writing its own events into the same directory: never read nor touched by ckptscan.
    foreign = EventFileWriter(str(tb))
    foreign.add_event(event_pb2.Event(step=5000, wall_time=1.0, summary=scalar_pb("train/loss", 2.5)))
    foreign.close()
    foreign_bytes = {p.name: p.read_bytes() for p in tb.iterdir()}

    def trend(json_name):
        result = runner.invoke(app, ["trend", str(run), "--tensorboard", str(tb), "--json", str(tmp_path / json_name),
                                     "--no-cache"])
        assert result.exit_code in (0, 1), result.output
        return result

    for checkpoint in checkpoints[:9]:
        shutil.copytree(checkpoint, run / checkpoint.name)
    first = trend("first.json")
    assert "tensorboard: 8 new step(s)" in first.stderr
    check_against_report({t: p for t, p in read_events(tb).items() if t != "train/loss"},
                         json.loads((tmp_path / "first.json").read_text()))

    for checkpoint in checkpoints[9:]:
        shutil.copytree(checkpoint, run / checkpoint.name)
    grown = trend("grown.json")
    assert f"tensorboard: {len(checkpoints) - 9} new step(s)" in grown.stderr and "8 already there" in grown.stderr
    events = read_events(tb)
    assert events.pop("train/loss")[0][0] == 5000
    # The whole grown run, each point once: the old steps were not written again.
    check_against_report(events, json.loads((tmp_path / "grown.json").read_text()))

    files = sorted(tb.iterdir())
    again = trend("again.json")
    assert "tensorboard: 0 new step(s)" in again.stderr
    assert sorted(tb.iterdir()) == files  # nothing new: no new file
    assert all(foreign_bytes[name] == (tb / name).read_bytes() for name in foreign_bytes)


def test_without_tensorboard_exit_2_with_the_fix_before_scanning(runs, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorboard", None)  # `import tensorboard` now raises ImportError
    result = runner.invoke(app, ["trend", str(runs["collapse"]), "--tensorboard", str(tmp_path / "tb"),
                                 "--json", str(tmp_path / "r.json")])
    assert result.exit_code == 2
    assert "pip install 'ckptscan[tensorboard]'" in result.stderr
    assert not (tmp_path / "tb").exists() and not (tmp_path / "r.json").exists()


@pytest.mark.parametrize("command", ["diff", "report"])
def test_diff_and_report_take_tensorboard_too(runs, reports, tmp_path, command):
    if command == "diff":
        a, b = sorted(runs["collapse"].glob("checkpoint-1[23]00"))
        args = ["diff", str(a), str(b), "--json", str(tmp_path / "r.json")]
    else:
        write_json(reports["healthy"], tmp_path / "r.json")
        args = ["report", str(tmp_path / "r.json")]
    result = runner.invoke(app, [*args, "--tensorboard", str(tmp_path / "tb")])
    assert result.exit_code in (0, 1), result.output
    check_against_report(read_events(tmp_path / "tb"), json.loads((tmp_path / "r.json").read_text()))


def test_a_pair_without_steps_is_written_at_its_position(reports, tmp_path):
    """Two loose files given to diff carry no step: the pair goes to step 0, once."""
    report = copy.deepcopy(reports["healthy"])
    report.pairs = report.pairs[:1]
    report.pairs[0].from_step = report.pairs[0].to_step = None
    assert write_tensorboard(report, tmp_path / "tb") == (1, 0)
    assert write_tensorboard(report, tmp_path / "tb") == (0, 1)
    events = read_events(tmp_path / "tb")
    assert {tag: [step for step, _ in points] for tag, points in events.items()} == {tag: [0] for tag in events}
    value = report.pairs[0].layers[0].attention.delta2_entropy_norm
    assert events["delta2_entropy_norm/layer_0"][0][1].item() == np.float32(value).item()


def test_a_rerun_reads_the_index_of_newest_steps_only_while_it_describes_the_event_files(reports, tmp_path):
    report = reports["loss"]
    shorter = dataclasses.replace(report, pairs=report.pairs[:-1])
    write_tensorboard(shorter, tmp_path)
    index = json.loads((tmp_path / tensorboard.INDEX).read_text())
    read_back = {}
    for path in tmp_path.glob("*tfevents*"):
        for event in EventFileLoader(str(path)).Load():
            for value in event.summary.value:
                read_back[value.tag] = max(read_back.get(value.tag, event.step), event.step)
    assert index["newest"] == read_back and set(index["files"]) == {p.name for p in tmp_path.glob("*tfevents*")}
    assert tensorboard.newest_steps(tmp_path) == read_back
    # An index that no longer describes the files (one removed) is not believed: they are read back.
    (tmp_path / tensorboard.INDEX).write_text(json.dumps({**index, "newest": {tag: 0 for tag in index["newest"]}}))
    assert tensorboard.newest_steps(tmp_path) == {tag: 0 for tag in read_back}  # believed: it matches the files
    (tmp_path / tensorboard.INDEX).write_text(json.dumps({**index, "files": {}}))
    assert tensorboard.newest_steps(tmp_path) == read_back
    assert write_tensorboard(report, tmp_path) == (1, len(shorter.pairs))
