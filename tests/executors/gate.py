"""Hold Ray tasks at their start until the test lets them go, so a test can
kill a node while a task is surely running there (no sleeps that can flake).

Pickled by value (`cloudpickle.register_pickle_by_value`): the workers need
not import this test helper."""

import threading
import time
import uuid
from pathlib import Path

from ckptscan.executors.ray import RayExecutor

# A bound, not a timing: only reached if the test is broken (Ray workers start in
# seconds, or minutes on a machine shared by many jobs)
WAIT_S = 900


class Gated:
    """`fn` that first writes `started-*` (holding its node's id) into
    `directory`, then waits for `directory/release`."""

    def __init__(self, fn, directory: Path):
        self.fn, self.directory = fn, Path(directory)

    def __call__(self, item, stop: threading.Event):
        import ray

        node = ray.get_runtime_context().get_node_id()
        (self.directory / f"started-{uuid.uuid4().hex}").write_text(node)
        deadline = time.monotonic() + WAIT_S
        while not (self.directory / "release").exists():
            if time.monotonic() > deadline:
                raise TimeoutError("the test never released the task")
            time.sleep(0.01)
        return self.fn(item, stop)

    def describe(self, item) -> str:
        return self.fn.describe(item)

    def locations(self) -> list[str]:
        return self.fn.locations()


class GatedRayExecutor(RayExecutor):
    def __init__(self, directory: Path, **kwargs):
        super().__init__(**kwargs)
        self.directory = directory

    def map(self, fn, items):
        return super().map(Gated(fn, self.directory), items)


def first_started_node(directory: Path) -> str:
    """The node id of the first task that started (waits for one)."""
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        for path in sorted(Path(directory).glob("started-*")):
            text = path.read_text()
            if text:
                return text
        time.sleep(0.01)
    raise TimeoutError("no task started")
