"""Live mode under FSDP2: two CPU processes (gloo), the monitored tensors
gathered to rank 0, the same report as the unsharded run."""

from __future__ import annotations

import json

import torch.multiprocessing as mp

from live.helpers import assert_same, comparable, number_of_floats
from live.sharded_worker import train

STEPS, EVERY = 12, 3


def test_fsdp2_live_report_equals_the_unsharded_one(tmp_path):
    mp.spawn(train, args=(2, str(tmp_path / "init"), str(tmp_path / "sharded" / "live"), STEPS, EVERY), nprocs=2)
    train(0, 1, "", str(tmp_path / "plain" / "live"), STEPS, EVERY)

    ranks = [json.loads((tmp_path / "sharded" / f"rank{r}-2.json").read_text()) for r in range(2)]
    assert all(r["sharded"] for r in ranks)  # the parameters really were DTensors
    # Rank 0 computes and writes; rank 1 only took part in the gathers.
    assert [(r["has_report"], r["snapshots"]) for r in ranks] == [(True, STEPS // EVERY), (False, 0)]
    sharded = json.loads((tmp_path / "sharded" / "live" / "report.json").read_text())
    plain = json.loads((tmp_path / "plain" / "live" / "report.json").read_text())
    assert len(sharded["pairs"]) == STEPS // EVERY - 1
    assert_same(comparable(sharded), comparable(plain))
    assert number_of_floats(comparable(plain)) > 100
