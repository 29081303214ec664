"""When a Ray task is lost with its worker, which checkpoint it was reading
cannot come back with it: the driver opens the task's checkpoints again and
names the one that no longer opens, or says that none is at fault."""

import os
from pathlib import Path

from ckptscan.executors.ray import checkpoint_at_fault
from ckptscan.pipeline.run import resolve_run
from ckptscan.scan import LayerTask, ScanOptions
from run_factory import write_run


def _task(run: Path) -> LayerTask:
    spec = resolve_run(run, probe=None, loss_log=None, config=None)
    return LayerTask(spec.checkpoints, spec.pairs, ScanOptions())


def test_a_checkpoint_broken_since_the_task_started_is_named_with_its_reader_error(tmp_path: Path) -> None:
    run = write_run(tmp_path / "run", count=3)
    task = _task(run)
    broken = run / "checkpoint-100" / "model.safetensors"
    size = broken.stat().st_size
    os.truncate(broken, size - 10)
    assert checkpoint_at_fault(task) == (f"checkpoint at fault: {broken}: truncated: the header declares {size} "
                                         f"bytes, the file has {size - 10} (10 missing)")


def test_when_every_checkpoint_opens_the_worker_is_at_fault_not_a_checkpoint(tmp_path: Path) -> None:
    task = _task(write_run(tmp_path / "run", count=3))
    assert checkpoint_at_fault(task) == "all 3 checkpoints open here: the worker or node was lost, not a checkpoint"


def test_a_task_that_cannot_list_its_checkpoints_blames_the_worker() -> None:
    assert checkpoint_at_fault(lambda layers, stop: []) == "the worker or node was lost"
