"""The executor seam without Ray: the local executor, the picklable layer
task every executor runs, and per-layer caching so a run resumes."""

import pickle
import shutil
import sys
import threading

import pytest

from ckptscan import scan_run
from ckptscan.caches.pair_cache import PairCache
from ckptscan.pipeline.metrics import pair_settings
from ckptscan.errors import CkptScanError
from ckptscan.executors import make_executor
from ckptscan.executors.local import LocalExecutor
from ckptscan.pipeline.run import resolve_run
from ckptscan.scan import LayerTask, ScanOptions, scan_layers

from executors.reports import assert_reports_equal
from hostile.helpers import assert_one_line_error, run_cli
from run_factory import write_run


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return write_run(tmp_path_factory.mktemp("runs") / "run", count=6, layers=3, collapse_layer=1, collapse_from=300)


def test_local_executor_groups_layers_evenly_over_its_workers_at_most_eight_a_task():
    assert LocalExecutor(workers=2).group([3, 5, 8]) == [[3, 5], [8]]
    assert LocalExecutor(workers=1).group([0, 1, 2, 3]) == [[0, 1, 2, 3]]
    groups = LocalExecutor(workers=2).group(list(range(22)))
    assert [layer for group in groups for layer in group] == list(range(22))
    assert len(groups) % 2 == 0 and max(map(len, groups)) <= 8 and max(map(len, groups)) - min(map(len, groups)) <= 2
    assert LocalExecutor(workers=2).group([]) == []


def test_local_executor_yields_every_position():
    executor = LocalExecutor(workers=2)
    assert sorted(executor.map(lambda item, stop: item * 10, [1, 2, 3])) == [(0, 10), (1, 20), (2, 30)]


def test_a_layer_task_pickles_as_locations_and_computes_the_same_there(run):
    spec = resolve_run(run)
    options = ScanOptions(heads=[0, 3])
    task = LayerTask(spec.checkpoints, spec.pairs, options, spec.probe)
    data = pickle.dumps(task)
    # Paths, pairs and options only: far less than one layer's weights (64 x 64 float32 q_proj = 16 KB).
    assert len(data) < 4096
    assert b"checkpoint-500" in data
    copy = pickle.loads(data)
    assert copy([1], threading.Event()) == task([1], threading.Event())
    assert copy.describe([1]) == task.describe([1])
    assert pickle.loads(pickle.dumps(copy))([2], threading.Event()) == task([2], threading.Event())


def test_scan_layers_skips_known_layers_and_reports_each_computed_one(run):
    spec = resolve_run(run)
    options = ScanOptions()
    _, full = scan_layers(spec.checkpoints, spec.pairs, options)
    known = {1: [pair[1] for pair in full]}
    arrived = []
    _, resumed = scan_layers(spec.checkpoints, spec.pairs, options, known=known,
                             on_layer=lambda layer, results: arrived.append(layer))
    assert sorted(arrived) == [0, 2]
    assert [[r.layer for r in pair] for pair in resumed] == [[0, 1, 2]] * len(spec.pairs)
    assert all(resumed[k][1] is full[k][1] for k in range(len(spec.pairs)))


def test_an_interrupted_run_resumes_at_the_layers_it_had_not_cached(run, tmp_path):
    """Layers arrive one by one and are cached as they do: a run stopped after
    some layers computes only the others when started again."""
    work = shutil.copytree(run, tmp_path / "run")
    cache = PairCache(tmp_path / "cache")
    expected = scan_run(work, cache=None)
    spec = resolve_run(work)
    settings = pair_settings(ScanOptions(), spec)
    keys = [cache.key(spec.checkpoints[a], spec.checkpoints[b], settings) for a, b in spec.pairs]

    class Stop(Exception):
        pass

    def stop_after_first_layer(done, total):
        raise Stop

    with pytest.raises(Stop):
        scan_run(work, cache=cache, executor=LocalExecutor(workers=1), progress=stop_after_first_layer)
    partial = [cache.get_layers(key) for key in keys]
    assert [sorted(found) for found in partial] == [[0]] * len(keys)
    assert not (tmp_path / "cache" / "pairs").exists()
    # Mark the cached layer 0 of the first pair: the resumed report must carry it (served, not recomputed).
    served = partial[0][0].attention.delta2_entropy
    marked = partial[0][0]
    marked.attention.delta2_entropy = served + 1.0
    cache.put_layer(keys[0], marked)
    seen = []
    resumed = scan_run(work, cache=PairCache(tmp_path / "cache"), progress=lambda done, total: seen.append(total))
    assert set(seen) == {2}  # layers 1 and 2 only
    assert resumed.pairs[0].layers[0].attention.delta2_entropy == served + 1.0
    resumed.pairs[0].layers[0] = expected.pairs[0].layers[0]
    assert_reports_equal(resumed, expected, tol=0)
    # Complete pairs are cached whole and their layer files removed.
    assert len(list((tmp_path / "cache" / "pairs").iterdir())) == len(keys)
    assert not list((tmp_path / "cache" / "layers").rglob("*.json"))


def test_executor_names_and_a_missing_ray(monkeypatch, run, capsys):
    assert isinstance(make_executor("local"), LocalExecutor)
    with pytest.raises(CkptScanError, match="--ray-address needs --executor ray"):
        make_executor("local", "auto")
    monkeypatch.setitem(sys.modules, "ray", None)  # Ray not installed: `import ray` fails
    assert_one_line_error(run_cli(capsys, "trend", run, "--executor", "ray", "--no-cache"),
                          "pip install 'ckptscan[ray]'")
