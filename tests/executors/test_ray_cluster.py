"""`--executor ray` on a two-node Ray cluster started here (one machine,
`ray.cluster_utils.Cluster`): a worker node killed while its task runs has
the task retried elsewhere and the report is the one a run without failures
gives; with no retries left, one error names the layers and checkpoints."""

import threading

import pytest

ray = pytest.importorskip("ray")

from ray.cluster_utils import Cluster  # noqa: E402

from ckptscan import scan_run  # noqa: E402
from ckptscan.pipeline.metrics import compute  # noqa: E402
from ckptscan.errors import CkptScanError  # noqa: E402
from ckptscan.pipeline.run import resolve_run  # noqa: E402
from ckptscan.scan import ScanOptions  # noqa: E402

from executors import gate  # noqa: E402
from executors.gate import GatedRayExecutor, first_started_node  # noqa: E402
from executors.reports import assert_reports_equal  # noqa: E402
from run_factory import write_run  # noqa: E402

STORE = 80 * 1024**2
ray.cloudpickle.register_pickle_by_value(gate)  # the workers need not import the test helpers


@pytest.fixture(scope="module")
def cluster():
    """A head that runs no tasks (the driver's node) and two 1-CPU worker nodes."""
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "object_store_memory": STORE,
                                                            "include_dashboard": False})
    try:
        for _ in range(2):
            cluster.add_node(num_cpus=1, object_store_memory=STORE)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False, logging_level="WARNING")
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return write_run(tmp_path_factory.mktemp("runs") / "run", count=6, layers=4, collapse_layer=1, collapse_from=300)


def kill_the_node_of_the_first_task(cluster, directory):
    """Once a task has started (it then waits for `release`), remove its node
    without a graceful stop, then let every task go."""
    node_id = first_started_node(directory)
    node = next(n for n in cluster.worker_nodes if n.node_id == node_id)
    cluster.remove_node(node, allow_graceful=False)
    (directory / "release").write_text("")


def run_with_a_node_killed(cluster, run, directory, **executor):
    killer = threading.Thread(target=kill_the_node_of_the_first_task, args=(cluster, directory))
    killer.start()
    try:
        return compute(resolve_run(run), ScanOptions(), executor=GatedRayExecutor(directory, **executor))
    finally:
        (directory / "release").write_text("")  # never leave a task waiting
        killer.join()
        cluster.add_node(num_cpus=1, object_store_memory=STORE)  # back to two workers for the next test
        cluster.wait_for_nodes()


def test_a_node_killed_mid_task_leaves_the_report_unchanged(cluster, run, tmp_path):
    from ckptscan.detection.judge import judge

    spec = resolve_run(run)
    metrics = run_with_a_node_killed(cluster, run, tmp_path)
    tasks = 4  # 4 layers, at most two tasks per CPU of the two workers
    assert len(list(tmp_path.glob("started-*"))) > tasks  # the killed node's task ran again
    report = judge(metrics, spec.config.thresholds)
    assert_reports_equal(report, scan_run(run))


def test_a_task_still_failing_after_its_retries_is_one_error_naming_layers_and_checkpoints(cluster, run, tmp_path):
    with pytest.raises(CkptScanError) as error:
        run_with_a_node_killed(cluster, run, tmp_path, max_retries=0)
    message = str(error.value)
    assert "\n" not in message and "after 0 retries" in message
    assert "layer" in message and "checkpoint-0" in message and "checkpoint-500" in message
    assert message.endswith("all 6 checkpoints open here: the worker or node was lost, not a checkpoint"), message
