"""`--executor ray` on a real local Ray instance (started here, 2 CPUs):
the same reports as the local executor, cached pairs and layers never
scheduled, a task's input error reported as one line."""

import json
import os
import shutil
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from ckptscan import scan_run  # noqa: E402
from ckptscan.caches.pair_cache import PairCache  # noqa: E402
from ckptscan.pipeline.metrics import compute, pair_settings  # noqa: E402
from ckptscan.errors import CkptScanError  # noqa: E402
from ckptscan.executors.ray import RayExecutor  # noqa: E402
from ckptscan.pipeline.run import resolve_run  # noqa: E402
from ckptscan.scan import ScanOptions  # noqa: E402

from executors.reports import assert_reports_equal  # noqa: E402
from hostile.helpers import run_cli  # noqa: E402
from run_factory import write_run  # noqa: E402

SAMPLES = Path(__file__).resolve().parents[2] / "sample_checkpoints"
SAMPLE_RUNS = ["healthy", "attention_fault", "router_fault", "both_faults", "silent_fault"]


@pytest.fixture(scope="module")
def local_ray():
    """One Ray instance for the module (start-up takes seconds), always shut down."""
    # address="local": a fresh instance, even if a cluster started elsewhere on this machine is running.
    ray.init(address="local", num_cpus=2, object_store_memory=100 * 1024**2, include_dashboard=False,
             logging_level="WARNING")
    try:
        yield
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return write_run(tmp_path_factory.mktemp("runs") / "run", count=8, layers=5, collapse_layer=2, collapse_from=400)


@pytest.mark.skipif(not all((SAMPLES / r).is_dir() for r in SAMPLE_RUNS), reason="sample_checkpoints/ not present")
def test_sample_runs_give_the_local_executors_report(local_ray):
    executor = RayExecutor()
    for name in SAMPLE_RUNS:  # probe, loss log and routers: every monitor goes through the workers
        assert_reports_equal(scan_run(SAMPLES / name, executor=executor), scan_run(SAMPLES / name))


def test_layer_groups_cover_every_layer_once_in_order(local_ray):
    executor = RayExecutor()
    groups = executor.group(list(range(7)))
    assert len(groups) == 4  # two tasks per CPU of the 2-CPU instance
    assert [layer for group in groups for layer in group] == list(range(7))
    assert executor.group([4]) == [[4]]


def test_heads_and_float64_options_travel_to_the_workers(local_ray, run):
    options = ScanOptions(heads=[1, 2], compute_dtype=__import__("torch").float64, layers=[0, 3])
    assert_reports_equal(scan_run(run, options, executor=RayExecutor()), scan_run(run, options))


def test_cached_pairs_and_layers_are_not_scheduled(local_ray, run, tmp_path):
    """A pair in the cache is served from it and a cached layer of an
    unfinished pair too: marked values come back, nothing is recomputed."""
    work = shutil.copytree(run, tmp_path / "run")
    expected = scan_run(work)
    cache = PairCache(tmp_path / "cache")
    spec = resolve_run(work)
    keys = [cache.key(spec.checkpoints[a], spec.checkpoints[b], pair_settings(ScanOptions(), spec))
            for a, b in spec.pairs]
    # Pair 0 finished; pairs 1.. finished layers 0 and 4 only (a run stopped mid-way).
    whole = [layer for layer in expected.pairs[0].layers]
    whole[1].attention.delta2_entropy += 1.0
    cache.put(keys[0], whole)
    for k in range(1, len(keys)):
        for layer in (0, 4):
            result = expected.pairs[k].layers[layer]
            if k == 1 and layer == 4:
                result.attention.delta2_entropy += 2.0
            cache.put_layer(keys[k], result)
    totals = []
    report = scan_run(work, cache=cache, executor=RayExecutor(), progress=lambda done, total: totals.append(total))
    assert (cache.hits, cache.misses) == (1, len(keys) - 1)
    assert set(totals) == {3}  # layers 1, 2 and 3 were scheduled, for the unfinished pairs only
    fresh = scan_run(work)
    assert report.pairs[0].layers[1].attention.delta2_entropy == fresh.pairs[0].layers[1].attention.delta2_entropy + 1.0
    assert report.pairs[1].layers[4].attention.delta2_entropy == fresh.pairs[1].layers[4].attention.delta2_entropy + 2.0
    # And every layer of every pair is in the report: cached whole now, its layer files gone.
    assert [[layer.layer for layer in pair.layers] for pair in report.pairs] == [list(range(5))] * len(keys)
    assert len(list((tmp_path / "cache" / "pairs").iterdir())) == len(keys)
    assert not list((tmp_path / "cache" / "layers").rglob("*.json"))


def test_cli_executor_ray_writes_the_local_report(local_ray, run, tmp_path, capsys):
    results = {}
    for executor in ("local", "ray"):
        out = tmp_path / f"{executor}.json"
        result = run_cli(capsys, "trend", run, "--executor", executor, "--no-cache", "--json", out, "-q")
        assert result.code in (0, 1), result.stderr
        results[executor] = json.loads(out.read_text())
    assert_reports_equal(results["ray"], results["local"])


def test_a_checkpoint_broken_after_the_driver_opened_it_is_one_error_naming_it(local_ray, run, tmp_path):
    """The workers re-open the checkpoints: one truncated between the
    driver's check and the tasks fails the scan with the reader's own error
    (file named, and the truncation), not a retry loop or a Ray traceback."""
    work = shutil.copytree(run, tmp_path / "run")
    spec = resolve_run(work)
    weights = work / "checkpoint-300" / "model.safetensors"
    os.truncate(weights, weights.stat().st_size - 64)
    with pytest.raises(CkptScanError) as error:
        compute(spec, ScanOptions(), executor=RayExecutor())
    assert str(weights) in str(error.value) and "\n" not in str(error.value)
    assert ": truncated: the header declares" in str(error.value)
