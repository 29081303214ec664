"""A family registered at run time is seen everywhere: scanned (its
`compute` on every layer pair), judged (its series, and its own absolute
rule under its own thresholds section, set by `--set`), cached, drawn in the
terminal table, the HTML, the Markdown, JUnit and TensorBoard, written to the
JSON and read back, with its interventions and its words in the summary, and
gone again when unregistered. The toy family (tests/monitors/toy_family.py)
is one module registered here with one line and named by no ckptscan module."""

import dataclasses
import io
import json
import math

import pytest
import torch
from rich.console import Console
from safetensors.torch import load_file

from typer.testing import CliRunner

from ckptscan import scan_run
from ckptscan.cli import app
from ckptscan.detection.summary import summarize
from ckptscan.detection.thresholds import Thresholds
from ckptscan.errors import CkptScanError
from ckptscan.monitors import registry
from ckptscan.pipeline.config import load_config
from ckptscan.report.html_page import html_page
from ckptscan.document.plain import report_dict
from ckptscan.document.writing import write_json
from ckptscan.document.reading import load_report
from ckptscan.report.trend_table import print_trend
from ckptscan.schema.results import Finding
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.util import tensor_util

import toy_family
from detection.test_summary import run
from factories import llama_config, llama_tensors, write_hf_checkpoint
from toy_family import CEILING, INTERVENTION, MONITOR, NAME, TOY, WHY, ToyThresholds

COUNT, INTERVAL = 24, 100
GROWING_LAYER, GROWS_FROM = 1, 1600  # from this step, the layer's W_q grows 5 % a checkpoint
Q_PROJ = "model.layers.{}.self_attn.q_proj.weight"


def write_growing_run(directory):
    """Checkpoints with small random updates of q/k/router, as tests/run_factory.py
    writes them; from GROWS_FROM, layer GROWING_LAYER's W_q is also scaled by 1.05."""
    config = llama_config(layers=2, hidden=64, heads=4, kv_heads=2, experts=4)
    tensors = llama_tensors(config, 0)
    gen = torch.Generator().manual_seed(1)
    for k in range(COUNT):
        step = k * INTERVAL
        for name, weight in tensors.items():
            if k > 0 and name.endswith(("q_proj.weight", "k_proj.weight", "block_sparse_moe.gate.weight")):
                tensors[name] = weight + torch.randn(weight.shape, generator=gen, dtype=torch.float64) * 4e-5
        if step >= GROWS_FROM:
            tensors[Q_PROJ.format(GROWING_LAYER)] = tensors[Q_PROJ.format(GROWING_LAYER)] * 1.05
        write_hf_checkpoint(directory / f"checkpoint-{step}", tensors, config)
    return directory


@pytest.fixture(scope="module")
def toy_report(tmp_path_factory):
    run = write_growing_run(tmp_path_factory.mktemp("growing"))
    with registry.registered(TOY):
        return run, scan_run(run)


def test_the_toy_family_is_registered_only_inside_the_block():
    before = registry.family_names()
    with registry.registered(TOY):
        assert registry.family_names() == (*before, NAME)
        assert registry.finding_families() == (*before, NAME, "numeric")
        assert registry.spec(MONITOR) in registry.judged()
        with pytest.raises(ValueError):
            registry.register(TOY)
    assert registry.family_names() == before and registry.find(MONITOR) is None


def test_the_band_rules_judge_one_family_a_second_that_sets_banded_is_refused():
    """The band thresholds are the attention family's calibration: a family
    that also sets `banded` is refused, and the band judges attention's
    update monitors whatever else is registered."""
    from ckptscan.detection.layer_band import banded_family, layer_band

    assert banded_family() is not None and banded_family().name == "attention"
    with pytest.raises(ValueError, match="banded"):
        registry.register(dataclasses.replace(TOY, banded=True))
    assert NAME not in registry.family_names()
    with registry.registered(TOY):  # per-update and comparable across runs, but not banded
        assert {m.family for m in layer_band()} == {"attention"}


def test_its_value_is_the_float64_relative_change_of_the_q_norm(toy_report):
    run, report = toy_report
    for pair in report.pairs:
        for layer in pair.layers:
            older, newer = (load_file(run / f"checkpoint-{step}" / "model.safetensors")[Q_PROJ.format(layer.layer)]
                            for step in (pair.from_step, pair.to_step))
            a, b = (float(w.to(torch.float64).norm()) for w in (older, newer))
            assert layer.families[NAME][MONITOR] == pytest.approx((b - a) / a, rel=1e-9, abs=1e-12)


def test_a_departure_of_the_toy_monitor_is_judged_and_raises_a_finding(toy_report):
    _, report = toy_report
    found = [(pair.to_step, layer.layer, f) for pair in report.pairs for layer in pair.layers for f in layer.findings
             if f.monitor == MONITOR]
    assert found and {layer for _, layer, _ in found} == {GROWING_LAYER}
    first_step, _, first = min(found, key=lambda sf: sf[0])
    assert first.family == NAME and first.severity == "alert" and first_step >= GROWS_FROM
    assert report.summary.first_alert_step[NAME] == first_step
    assert all(MONITOR in layer.judgements for pair in report.pairs[-3:] for layer in pair.layers)


def test_it_heads_a_column_of_the_terminal_table_and_the_html(toy_report):
    _, report = toy_report
    with registry.registered(TOY):
        console = Console(file=io.StringIO(), width=200, color_system=None)
        print_trend(console, report)
        page = html_page(report, report_dict(report), [])
    assert "‖Wq‖ change" in console.file.getvalue()
    assert "‖Wq‖ change now" in page


def test_its_values_go_to_the_json_and_come_back(toy_report, tmp_path):
    _, report = toy_report
    write_json(report, tmp_path / "report.json")
    again = load_report(tmp_path / "report.json")
    values = [layer.families[NAME][MONITOR] for pair in again.pairs for layer in pair.layers]
    assert values == [layer.families[NAME][MONITOR] for pair in report.pairs for layer in pair.layers]
    assert all(isinstance(v, float) and math.isfinite(v) for v in values)
    assert report_dict(report)["pairs"][0]["layers"][0]["families"][NAME] == {MONITOR: values[0]}


def test_its_thresholds_section_is_read_and_set_by_its_flat_names_only_while_registered(tmp_path):
    with registry.registered(TOY):
        assert Thresholds().section(NAME) == ToyThresholds() and getattr(Thresholds(), CEILING) == 1.0
        assert Thresholds(**{CEILING: 0.04}).section(NAME) == ToyThresholds(0.04)
        assert Thresholds().as_dict()[CEILING] == 1.0 and CEILING in Thresholds.field_names()
        assert getattr(load_config(overrides=[f"{CEILING}=0.04"], search=False).thresholds, CEILING) == 0.04
        with pytest.raises(CkptScanError, match=f"need {CEILING} > 0"):
            Thresholds(**{CEILING: 0.0})
    assert CEILING not in Thresholds().as_dict()
    with pytest.raises(CkptScanError, match="unknown setting"):
        load_config(overrides=[f"{CEILING}=0.04"], search=False)


def test_its_words_decide_a_full_tie_with_a_family_ranked_after_it():
    """Both CUSUMs crossed on the same pair from the same onset, equally far, by monitors equally specific:
    the toy family ranks before the unranked output family, and the reason is in its own words."""
    def cusum(monitor, family):
        return Finding(monitor, family, "alert", 0.5, "", threshold=5.0, rule="cusum", score=5.0, onset_step=600)
    with registry.registered(TOY):
        s = summarize(run({600: {0: [cusum(MONITOR, NAME)], 1: [cusum("output_logit_rms", "output")]}}))
    assert (s.primary_family, s.secondary_families) == (NAME, ["output"])
    assert s.primary_family_reason.endswith(f"{NAME} comes first because {WHY}")
    assert s.interventions[0] == {"family": NAME, "short": INTERVENTION[0], "action": INTERVENTION[1],
                                  "source": INTERVENTION[2]}


@pytest.fixture(scope="module")
def ceiling_outputs(tmp_path_factory):
    """`ckptscan trend` of the growing run with the toy ceiling set below its 5 % growth, into every
    destination; run twice over one cache (the second judges nothing afresh)."""
    run = write_growing_run(tmp_path_factory.mktemp("growing-ceiling"))
    out = tmp_path_factory.mktemp("outputs")
    runs = []
    with registry.registered(TOY):
        for k in range(2):
            runs.append(CliRunner().invoke(app, [
                "trend", str(run), "--set", f"{CEILING}=0.04", "--cache-dir", str(out / "cache"),
                "--json", str(out / f"report{k}.json"), "--junit", str(out / "junit.xml"),
                "--markdown-summary", str(out / "summary.md"), "--html", str(out / "report.html"),
                "--tensorboard", str(out / "tb")]))
    return out, runs


def test_its_absolute_rule_alerts_under_its_own_ceiling_in_every_output(ceiling_outputs):
    out, (first, second) = ceiling_outputs
    assert first.exit_code == 1, first.output
    data = json.loads((out / "report0.json").read_text())
    found = [(pair["to_step"], layer["layer"], f) for pair in data["pairs"] for layer in pair["layers"]
             for f in layer["findings"] if f["family"] == NAME and f["rule"] == "ceiling"]
    assert found and {layer for _, layer, _ in found} == {GROWING_LAYER}
    assert min(step for step, _, _ in found) == GROWS_FROM  # from the pair the growth began: no baseline needed
    assert data["summary"]["first_alert_step"][NAME] == GROWS_FROM
    assert data["thresholds"][CEILING] == 0.04
    assert data["summary"]["interventions"][0]["action"] == INTERVENTION[1]
    assert f"{NAME}: {INTERVENTION[0]}" in first.stdout  # the terminal's line per family
    assert f"{NAME}: {INTERVENTION[1]}" in (out / "report.html").read_text()
    assert f"{NAME} {GROWS_FROM}" in (out / "summary.md").read_text()  # first alert per family
    junit = (out / "junit.xml").read_text()
    case = f'<testcase name="{NAME}" classname="ckptscan.layer_{GROWING_LAYER}"'
    assert case in junit and "<failure" in junit.split(case)[1].split("</testcase>")[0]
    events = EventAccumulator(str(out / "tb"), size_guidance={"tensors": 0}).Reload()
    severity = {e.step: float(tensor_util.make_ndarray(e.tensor_proto)) for e in events.Tensors(f"ckptscan/{NAME}_severity")}
    assert severity[GROWS_FROM] == 3.0 and severity[GROWS_FROM - INTERVAL] < 3.0  # alert from the growth's pair
    assert f"{MONITOR}/layer_{GROWING_LAYER}" in events.Tags()["tensors"]
    # The second run took every judged pair from the cache: the same report.
    assert second.exit_code == 1, second.output
    again = json.loads((out / "report1.json").read_text())
    assert again["pairs"] == data["pairs"] and again["summary"] == data["summary"]


def test_the_judge_cache_hashes_the_module_that_declares_it():
    from ckptscan.caches import judge_cache

    with registry.registered(TOY):
        code = judge_cache._code()
    assert list(code["family_sources"]) == [toy_family.__file__]
    assert "family_sources" not in judge_cache._code()
