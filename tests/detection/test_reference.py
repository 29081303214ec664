"""Reference runs: one widened run, or a band of several, aligned by step."""

import math
import random

import numpy as np
import pytest

from ckptscan.detection.catalog import judged_by_name
from ckptscan.detection.judge import judge
from ckptscan.detection.reference import Widening, reference_from_report, reference_from_reports
from ckptscan.detection.thresholds import Thresholds
from ckptscan.errors import CkptScanError
from ckptscan.layouts.base import ModelInfo
from ckptscan.pipeline.metrics import Metrics
from ckptscan.schema.results import PairResult, ScanReport, Summary
from detection.helpers import MODEL, layer_result, run_report

D2N = judged_by_name()["delta2_entropy_norm"]
LOGIT = judged_by_name()["qk_logit_bound"]


def report_at(steps, values, layers=1, name="ref"):
    """A run whose pairs end at `steps` (the first starts `steps[1] - steps[0]` earlier), Δ2 entropy `values`."""
    pairs, previous = [], 2 * steps[0] - steps[1]
    for step, value in zip(steps, values):
        pairs.append(PairResult(previous, step, [layer_result(n, d2n=value) for n in range(layers)],
                                f"{name}/checkpoint-{previous}", f"{name}/checkpoint-{step}"))
        previous = step
    return ScanReport("trend", MODEL, [], pairs, Summary("ok", [], {}), settings={"run": name})


def brute_force_band(runs, step, count, min_scale, factor):
    """The band written out in float64 numpy: interpolated values, their
    median; spread between runs pooled over the first run's `count` steps
    nearest to `step`; each run's jitter from successive differences of its
    `2 count` nearest values (MAD of differences / √2)."""
    xs = [np.array(s, dtype=np.float64) for s, _ in runs]
    ys = [np.array(v, dtype=np.float64) for _, v in runs]
    center = float(np.median([np.interp(step, x, y) for x, y in zip(xs, ys)]))
    grid = xs[0][np.argsort(np.abs(xs[0] - step), kind="stable")[:count]]
    squares, freedom = 0.0, 0
    for g in grid:
        here = np.array([np.interp(g, x, y) for x, y in zip(xs, ys) if x[0] <= g <= x[-1]])
        if len(here) >= 2:
            squares += float(((here - here.mean()) ** 2).sum())
            freedom += len(here) - 1
    between = math.sqrt(squares / freedom) if freedom else 0.0
    jitters = []
    for x, y in zip(xs, ys):
        near = np.sort(np.argsort(np.abs(x - step), kind="stable")[:2 * count])
        d = np.diff(y[near])
        mad = np.median(np.abs(d - np.median(d))) * 1.4826
        jitters.append(max(mad / math.sqrt(2), min_scale) ** 2)
    scale = max(math.sqrt(between ** 2 + float(np.mean(jitters))), min_scale)
    return center, scale * math.sqrt(1 + 1 / len(runs)) * factor


@pytest.mark.parametrize("seed", range(20))
def test_a_band_is_the_median_and_pooled_spread_of_the_references_at_the_step(seed):
    """Three references saved at different steps (one offset, one sparser)
    against the float64 brute force, at steps on and between their checkpoints."""
    rng = random.Random(seed)
    runs = []
    for offset, every in ((0, 100), (50, 100), (0, 130)):
        steps = [offset + every * (i + 1) for i in range(rng.randint(15, 25))]
        level = rng.uniform(0.4, 0.7)
        runs.append((steps, [level + 0.002 * i + rng.gauss(0, 0.02) for i in range(len(steps))]))
    reference = reference_from_reports([report_at(s, v) for s, v in runs], 0, 0, ["a", "b", "c"])
    last = min(s[-1] for s, _ in runs)
    for step in (rng.uniform(200, last - 100) for _ in range(5)):
        got = reference.expectation(0, D2N, step, Widening(5, 1.9, 1.3), None)
        want = brute_force_band(runs, step, 5, D2N.spec.min_scale, 1.3)
        assert got.center == pytest.approx(want[0], abs=1e-12)
        assert got.scale == pytest.approx(want[1], rel=1e-9)


def test_one_reference_is_the_widened_local_level_of_its_judged_pairs():
    """Median and MAD sigma of the 5 pairs nearest in step, after the reference's warm-up."""
    steps = [100 * (i + 1) for i in range(12)]
    values = [0.5 + 0.01 * ((i * 7) % 5) for i in range(12)]
    reference = reference_from_report(report_at(steps, values), 2, 0, "ref")
    got = reference.expectation(0, D2N, 640.0, Widening(5, 1.9))
    near = np.array(values)[np.argsort(np.abs(np.array(steps[2:]) - 640.0), kind="stable")[:5] + 2]
    mad = 1.4826 * np.median(np.abs(near - np.median(near)))
    assert got.center == pytest.approx(float(np.median(near)))
    assert got.scale == pytest.approx(max(mad, 0.01) * math.sqrt(1 + 1 / 5) * 1.9)


def test_beyond_a_reference_s_last_step_the_others_judge_and_the_report_says_so():
    long_a = report_at([100 * (i + 1) for i in range(30)], [0.55] * 30, name="a")
    long_b = report_at([100 * (i + 1) for i in range(30)], [0.56] * 30, name="b")
    short = report_at([100 * (i + 1) for i in range(10)], [0.57] * 10, name="short")
    reference = reference_from_reports([long_a, long_b, short], 0, 0, ["a", "b", "short"])
    inside = reference.expectation(0, D2N, 500.0, Widening(5, 1.9, 1.0))
    beyond = reference.expectation(0, D2N, 2500.0, Widening(5, 1.9, 1.0))
    assert inside.center == pytest.approx(0.56)
    assert beyond.center == pytest.approx(0.555)  # a and b only
    run = run_report(30)
    notes = reference.coverage_notes(run.pairs)
    assert notes == ["reference short ends at step 1000: later pairs are judged against the other references, "
                     "or only against the run's own history"]


def test_a_reference_saved_at_another_interval_is_not_compared_on_update_monitors():
    """Δ2 entropy of a 200-step update is not that of a 50-step one; the logit bound (a state) still compares."""
    dense = report_at([50 * (i + 1) for i in range(40)], [0.5] * 40, name="every50")
    sparse = report_at([200 * (i + 1) for i in range(10)], [0.7] * 10, name="every200")
    reference = reference_from_reports([dense, sparse], 0, 0, ["every50", "every200"])
    at50 = reference.expectation(0, D2N, 1000.0, Widening(5, 1.9, 1.0), interval=50)
    assert at50.center == pytest.approx(0.5)  # only the reference saved every 50 steps
    assert reference.expectation(0, LOGIT, 1000.0, Widening(5, 1.9, 1.0), interval=50).center == pytest.approx(math.log(3.0))
    run = run_report(30, interval=50)
    assert any("every200 was saved every 200 steps, this run every 50" in n for n in reference.coverage_notes(run.pairs))


def test_references_of_different_models_are_refused_in_one_line():
    other = report_at([100, 200, 300], [0.5] * 3)
    other.model = ModelInfo(family="mixtral", num_layers=2, hidden_size=128, num_heads=4, num_kv_heads=2,
                            head_dim=32, num_experts=4, top_k=2)
    with pytest.raises(CkptScanError, match="different models .*hidden_size: 128 vs 64"):
        reference_from_reports([report_at([100, 200, 300], [0.5] * 3), other], 0, 0, ["a", "b"])


def test_a_fault_from_the_first_pair_alerts_against_a_band_of_healthy_runs():
    """Every pair of the run is low from the start, so its own history learns
    it as normal; two healthy runs of other seeds place it far outside their band."""
    healthy = [run_report(20, seed=s, d2n=lambda i, n: 0.55) for s in (1, 2)]
    faulty = run_report(20, seed=3, d2n=lambda i, n: 0.40)
    metrics = Metrics("run", MODEL, [], faulty.pairs)
    alone = judge(metrics, Thresholds())
    banded = judge(metrics, Thresholds(), healthy, reference_path=["h1.json", "h2.json"])
    assert alone.summary.status != "alert"
    assert banded.summary.status == "alert"
    assert banded.summary.first_alert_step["attention"] <= 500
    assert banded.settings["reference_runs"] == ["h1.json", "h2.json"]


def test_a_band_judges_the_warm_up_pairs_and_one_reference_does_not():
    """The band's members went through the same warm-up at the same steps, so
    a fault from step 0 is judged from the first pair: its alert needs two
    pairs in a row, so it comes at the second (step 200), not after the
    two warm-up pairs (step 400). One reference is known by its pairs after
    its own warm-up only, so against it the warm-up stays unjudged."""
    healthy = [run_report(20, seed=s, d2n=lambda i, n: 0.55) for s in (1, 2)]
    faulty = run_report(20, seed=3, d2n=lambda i, n: 0.40)
    metrics = Metrics("run", MODEL, [], faulty.pairs)
    banded = judge(metrics, Thresholds(), healthy)
    assert banded.summary.first_alert_step["attention"] == 200
    assert banded.pairs[0].layers[0].judgements["delta2_entropy_norm"].rule == "reference"
    single = judge(metrics, Thresholds(), healthy[0])
    assert all(not layer.findings for pair in single.pairs[:2] for layer in pair.layers)
    assert (single.summary.first_alert_step.get("attention") or math.inf) >= 400
