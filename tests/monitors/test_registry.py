"""A family registered at run time is seen everywhere: scanned (its
`compute` on every layer pair), judged, drawn in the terminal table and the
HTML, written to the JSON and read back, and gone again when unregistered.
The toy family (tests/monitors/toy_family.py) is registered here and named
by no ckptscan module."""

import io
import math

import pytest
import torch
from rich.console import Console
from safetensors.torch import load_file

from ckptscan import scan_run
from ckptscan.monitors import registry
from ckptscan.report.html import html_page
from ckptscan.document.plain import report_dict
from ckptscan.document.writing import write_json
from ckptscan.document.reading import load_report
from ckptscan.report.trend_table import print_trend
from factories import llama_config, llama_tensors, write_hf_checkpoint
from toy_family import MONITOR, NAME, TOY

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
