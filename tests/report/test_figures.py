"""The figures of a report: what they mark, what they fold, and that they are
drawn for runs with and without a loss log."""

import io
import math
import shutil

import numpy as np
import pytest

pytest.importorskip("matplotlib")

from matplotlib.collections import PathCollection, QuadMesh  # noqa: E402
from PIL import Image  # noqa: E402

from ckptscan.detection.rules import Thresholds, assess_report  # noqa: E402
from ckptscan.report import figures  # noqa: E402
from ckptscan.report import sparkline  # noqa: E402
from ckptscan.report.figures import envelope, heatmap  # noqa: E402
from ckptscan.report.figures import DPI, Grid, draw_heatmap, draw_timeline, run_figures  # noqa: E402

from report.runs import COLLAPSE  # noqa: E402
from detection.helpers import run_report  # noqa: E402

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def vertical_lines(ax):
    """{label: x} of the axvline()s of an axes."""
    return {line.get_label(): line.get_xdata()[0] for line in ax.get_lines()
            if len(set(line.get_xdata())) == 1 and not line.get_label().startswith("_")}


def line(ax, label_start):
    return next(ln for ln in ax.get_lines() if ln.get_label().startswith(label_start))


def test_timeline_marks_first_alert_and_loss_divergence_with_the_lead(reports):
    report = reports["loss"]
    s = report.summary
    first, divergence = s.first_alert_step["attention"], s.loss_divergence_step
    assert first is not None and divergence is not None and s.lead_steps == divergence - first > 0
    fig, caption = draw_timeline(report, Grid.of(report))
    flagged, loss = fig.axes[:2]
    assert len([ax for ax in fig.axes if ax.get_title(loc="left")]) == 2  # one flagged layer and the loss
    assert flagged.get_title(loc="left").startswith("layer 1: Δ2 H/ln n")
    assert "loss" in loss.get_title(loc="left")
    for ax in (flagged, loss):
        lines = vertical_lines(ax)
        assert lines[f"first alert (step {first}, attention)"] == first
        assert lines[f"loss divergence (step {divergence})"] == divergence
        assert lines[f"rollback candidate (step {s.rollback_candidate.step})"] == s.rollback_candidate.step
    assert [t.get_text() for t in loss.texts if t.get_text()] == [f"lead {s.lead_steps} steps"]
    assert line(flagged, "hard floor").get_ydata()[0] == report.thresholds["delta2_entropy_norm_floor"]
    assert "mean training loss" in caption


def test_loss_panel_draws_each_pairs_mean_loss_over_its_steps(reports):
    report = reports["loss"]
    fig, _ = draw_timeline(report, Grid.of(report))
    (stairs,) = [p for p in fig.axes[1].patches if p.get_label() == "mean loss over each pair"]
    data = stairs.get_data()
    assert list(data.values) == pytest.approx([p.loss for p in report.pairs])
    assert list(data.edges) == [report.pairs[0].from_step] + [p.to_step for p in report.pairs]


def test_band_agrees_with_the_findings_in_the_report(reports):
    """Recomputed bands must be what the detector judged: alerted points lie
    beyond the alert level, points without a finding inside it."""
    report = reports["loss"]
    fig, _ = draw_timeline(report, Grid.of(report))
    ax = fig.axes[0]
    values = line(ax, "flagged layer").get_ydata()
    alert_level = line(ax, "alert level").get_ydata()
    steps = [p.to_step for p in report.pairs]
    checked = {"alert": 0, "quiet": 0}
    for k, pair in enumerate(report.pairs):
        if math.isnan(alert_level[k]):
            continue
        findings = [f for f in pair.layers[1].findings if f.monitor == "delta2_entropy_norm" and f.rule != "floor"]
        if any(f.severity == "alert" for f in findings):
            assert values[k] < alert_level[k]
            checked["alert"] += 1
        elif not findings:
            assert values[k] > alert_level[k]
            checked["quiet"] += 1
    assert checked["alert"] >= 2 and checked["quiet"] >= 1
    assert all(math.isnan(a) for a, s in zip(alert_level, steps) if s <= report.settings["warmup_end_step"])


def test_without_a_loss_log_the_timeline_has_no_loss_panel(reports):
    report = reports["no_loss"]
    fig, caption = draw_timeline(report, Grid.of(report))
    titled = [ax for ax in fig.axes if ax.get_title(loc="left")]
    assert [ax.get_title(loc="left").split(":")[0] for ax in titled] == ["layer 1"]
    assert not any(label.startswith("loss divergence") for label in vertical_lines(titled[0]))
    assert "No loss in the report" in caption
    assert report.summary.first_alert_step["attention"] in vertical_lines(titled[0]).values()


def test_healthy_run_shows_all_layers_and_no_marker(reports):
    report = reports["healthy"]
    assert report.summary.status == "ok"
    grid = Grid.of(report)
    fig, caption = draw_timeline(report, grid)
    titles = [ax.get_title(loc="left") for ax in fig.axes if ax.get_title(loc="left")]
    assert titles[0].startswith("all 2 layers: Δ2 H/ln n")
    assert "No layer flagged" in caption
    heat, heat_caption = draw_heatmap(grid, "delta2_entropy_norm")
    assert not [c for c in heat.axes[0].collections if isinstance(c, PathCollection)]
    assert "No finding of this monitor" in heat_caption
    assert draw_heatmap(grid, "routing_entropy_norm") is None  # no probe, no routing entropy


def test_heatmap_cells_are_the_report_values_and_markers_sit_on_the_alarmed_cells(reports):
    report = reports["loss"]
    grid = Grid.of(report)
    fig, _ = draw_heatmap(grid, "delta2_entropy_norm")
    ax = fig.axes[0]
    (mesh,) = [c for c in ax.collections if isinstance(c, QuadMesh)]
    cells = mesh.get_array().reshape(3, len(report.pairs))
    for j, pair in enumerate(report.pairs):
        for layer in pair.layers:
            assert cells[layer.layer, j] == pytest.approx(layer.attention.delta2_entropy_norm)
    marked = set()
    for collection in ax.collections:
        if isinstance(collection, PathCollection):
            for x, y in collection.get_offsets():
                assert y == 1  # only layer 1 was flagged
                marked.add(next(p.to_step for p in report.pairs if p.from_step < x < p.to_step))
    expected = {p.to_step for p in report.pairs
                for f in p.layers[1].findings
                if f.monitor.startswith("delta2_entropy_norm") and f.severity in ("warn", "alert")}
    assert marked == expected and min(marked) == COLLAPSE


def test_every_heatmap_and_the_timeline_become_pngs(reports):
    drawn = run_figures(reports["loss"])
    assert [f.name for f in drawn] == ["timeline", "heatmap_delta2_entropy_norm", "heatmap_dwq_entropy_norm",
                                       "heatmap_epsilon", "heatmap_routing_entropy_norm"]
    for f in drawn:
        assert f.png.startswith(PNG_SIGNATURE)
        with Image.open(io.BytesIO(f.png)) as image:
            image.verify()
        with Image.open(io.BytesIO(f.png)) as image:
            assert image.size[0] == pytest.approx(figures.WIDTH * DPI, abs=2)
        assert f.caption and f.title


def test_folded_columns_and_rows_keep_the_alarm_side_extreme(reports, monkeypatch):
    report = reports["loss"]
    monkeypatch.setattr(heatmap, "MAX_COLUMNS", 4)
    monkeypatch.setattr(heatmap, "MAX_ROWS", 2)
    fig, caption = draw_heatmap(Grid.of(report), "delta2_entropy_norm")
    ax = fig.axes[0]
    (mesh,) = [c for c in ax.collections if isinstance(c, QuadMesh)]
    cells = mesh.get_array()
    assert cells.shape == (2, 4)
    x_edges = mesh.get_coordinates()[0, :, 0]
    labels = [t.get_text() for t in ax.get_yticklabels()]  # "0", "1–2": the layers of each row
    assert len(labels) == 2
    for r, label in enumerate(labels):
        first, _, last = label.partition("–")
        layers = range(int(first), int(last or first) + 1)
        for c in range(4):
            pairs = [p for p in report.pairs if x_edges[c] < p.to_step <= x_edges[c + 1]]
            lowest = min(layer.attention.delta2_entropy_norm for p in pairs for layer in p.layers
                         if layer.layer in layers)
            assert cells[r, c] == pytest.approx(lowest)
    assert f"{len(report.pairs)} pairs folded into 4 columns" in caption
    assert "3 layers folded into 2 rows" in caption and "lowest value" in caption


def test_figures_stay_legible_for_96_plus_layers_and_300_plus_checkpoints():
    report = run_report(320, layers=100, d2n=lambda i, n: 0.2 if n == 37 and i >= 250 else 0.55)
    report.thresholds = Thresholds().as_dict()
    grid = Grid.of(report)
    fig, caption = draw_heatmap(grid, "delta2_entropy_norm")
    width, height = fig.get_size_inches() * DPI
    assert width <= 1100 and height <= 1100
    (mesh,) = [c for c in fig.axes[0].collections if isinstance(c, QuadMesh)]
    assert mesh.get_array().shape == (heatmap.MAX_ROWS, heatmap.MAX_COLUMNS)
    assert "320 pairs folded into 200 columns" in caption and "100 layers folded into 96 rows" in caption
    assert len(fig.axes[0].get_yticks()) <= 24
    # The collapsed layer's row stays dark after folding (the alarm side is kept), and only that row.
    cells = mesh.get_array()
    dark_late = [r for r in range(cells.shape[0]) if cells[r, -20:].max() < 0.3]
    assert len(dark_late) == 1 and cells[dark_late[0], :100].min() > 0.4


def test_timeline_panels_are_capped_for_many_flagged_layers():
    flagged = range(0, 12, 2)  # six layers collapse, at different steps
    report = run_report(40, layers=12, d2n=lambda i, n: 0.25 if n in flagged and i >= 20 + n else 0.55)
    assess_report(report, Thresholds())
    assert len(report.summary.flagged_layers) == 6
    fig, caption = draw_timeline(report, Grid.of(report))
    titles = [ax.get_title(loc="left") for ax in fig.axes if ax.get_title(loc="left")]
    assert [t.split(":")[0] for t in titles] == ["layer 0", "layer 2", "layer 4", "layer 6"]  # the earliest
    assert "4 of 6, the earliest to fire" in caption


def test_non_finite_weights_are_shaded_on_the_timeline_and_marked_on_the_heatmap(runs, tmp_path):
    from safetensors.torch import load_file, save_file

    from ckptscan import scan_run

    run = shutil.copytree(runs["healthy"], tmp_path / "nan-run")
    (shard,) = (run / "checkpoint-600").glob("*.safetensors")
    tensors = load_file(shard)
    tensors["model.layers.1.self_attn.q_proj.weight"][0, :3] = float("nan")
    save_file(tensors, shard)
    report = scan_run(run)
    assert report.summary.first_alert_step["numeric"] == 600
    grid = Grid.of(report)
    fig, _ = draw_timeline(report, grid)
    ax = fig.axes[0]
    assert ax.get_title(loc="left") == "layer 1: Δ2 H/ln n (attention); non-finite weights from step 600"
    shaded = [p.get_x() for p in ax.patches if p.get_label().startswith("non-finite")]
    shaded += [p.get_x() + p.get_width() for p in ax.patches if p.get_label().startswith("non-finite")]
    assert (min(shaded), max(shaded)) == (500, 700)  # the two pairs that read checkpoint-600
    heat, _ = draw_heatmap(grid, "delta2_entropy_norm")
    (mesh,) = [c for c in heat.axes[0].collections if isinstance(c, QuadMesh)]
    masked = [report.pairs[j].to_step for j in range(len(report.pairs)) if mesh.get_array().mask[1, j]]
    assert masked == [600, 700]
    (markers,) = [c for c in heat.axes[0].collections if isinstance(c, PathCollection)]
    assert sorted(x for x, _ in markers.get_offsets()) == [550, 650]


def test_a_short_series_is_drawn_whole():
    assert envelope.envelope(list(range(envelope.MAX_POINTS)), np.zeros(envelope.MAX_POINTS)) is None


def test_a_long_series_folds_into_buckets_keeping_each_ones_lowest_and_highest_value():
    rng = np.random.default_rng(0)
    values = rng.normal(0.55, 0.01, 2_000)
    values[1_234] = 0.05  # a one-pair excursion
    values[700:720] = np.nan  # a gap of two buckets
    steps = [100.0 * (i + 1) for i in range(2_000)]
    folded = envelope.envelope(steps, values)
    assert len(folded.x) == envelope.BUCKETS and folded.pairs_per_bucket == 10
    for k, group in enumerate(sparkline.cells(len(values), envelope.BUCKETS)):
        block = values[group.start: group.stop]
        if np.isnan(block).all():
            assert np.isnan([folded.low[k], folded.high[k], folded.median[k]]).all()
            continue
        assert (folded.low[k], folded.high[k]) == (np.nanmin(block), np.nanmax(block))
        assert folded.median[k] == np.nanmedian(block)
        assert steps[group.start] <= folded.x[k] <= steps[group.stop - 1]
    assert np.nanmin(folded.low) == 0.05 and np.isnan(folded.low).sum() == 2


def test_a_timeline_of_2000_pairs_is_folded_but_keeps_every_finding():
    report = run_report(2_000, layers=3, d2n=lambda i, n: 0.25 if n == 1 and i >= 1_500 else 0.55)
    assess_report(report, Thresholds())
    fig, caption = draw_timeline(report, Grid.of(report))
    ax = fig.axes[0]
    assert ax.get_title(loc="left").startswith("layer 1: Δ2 H/ln n")
    median = line(ax, "flagged layer: median of every 10 pairs")
    assert len(median.get_xdata()) == envelope.BUCKETS and median.get_marker() in ("", "None")
    (band,) = [c for c in ax.collections if c.get_label() == "flagged layer: range of every 10 pairs"]
    lowest = min(p.layers[1].attention.delta2_entropy_norm for p in report.pairs)
    assert band.get_paths()[0].vertices[:, 1].min() == pytest.approx(lowest)
    flagged = {(p.to_step, f.value) for p in report.pairs for f in p.layers[1].findings
               if f.monitor == "delta2_entropy_norm" and f.severity in ("warn", "alert") and f.value is not None}
    marked = {(x, y) for c in ax.collections if isinstance(c, PathCollection) for x, y in c.get_offsets()}
    assert flagged and flagged <= marked  # every finding a point at its own step and value
    assert "2000 pairs: each line is folded into buckets of up to 10 consecutive pairs" in caption


def test_the_band_of_a_long_run_is_folded_to_its_widest_extent_per_bucket():
    report = run_report(2_000, layers=3, d2n=lambda i, n: 0.25 if n == 1 and i >= 1_500 else 0.55)
    assess_report(report, Thresholds())
    fig, _ = draw_timeline(report, Grid.of(report))
    ax = fig.axes[0]
    assert len(line(ax, "baseline").get_xdata()) == envelope.BUCKETS
    (band,) = [c for c in ax.collections if c.get_label().startswith("baseline ±")]
    lowest = min(p.layers[1].judgements["delta2_entropy_norm"].warn_at for p in report.pairs
                 if "delta2_entropy_norm" in p.layers[1].judgements
                 and p.layers[1].judgements["delta2_entropy_norm"].warn_at is not None)
    assert band.get_paths()[0].vertices[:, 1].min() == pytest.approx(lowest)
