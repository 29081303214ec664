"""One process of the sharded live-mode test (tests/live/test_sharded.py):
the tiny Mixtral, FSDP2-sharded over the process group when there is one,
trained a few steps with the Monitor."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
import torch.distributed as dist

from ckptscan.detection.rules import Thresholds
from ckptscan.live import Monitor
from experiments.model import MixtralForCausalLM
from live.helpers import tiny_config


def train(rank: int, world: int, init_file: str, out: str, steps: int, every: int) -> None:
    torch.set_num_threads(1)
    if world > 1:
        dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = MixtralForCausalLM(tiny_config())
    if world > 1:
        from torch.distributed.fsdp import fully_shard

        for layer in model.model.layers:
            fully_shard(layer)
        fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    monitor = Monitor(model, every=every, out=out, config=model.cfg.to_hf("float32"), thresholds=Thresholds())
    gen = torch.Generator().manual_seed(0)
    for step in range(1, steps + 1):
        # Every rank trains on the same batch: the averaged gradient is the
        # single-process one, so the weights match the unsharded run.
        x = torch.randint(0, 256, (4, 32), generator=gen)
        logits, _, _ = model(x)
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 256), x[:, 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        monitor.step(step)
    monitor.close()  # the last scan (rank 0), on every rank alike
    record = {"rank": rank, "sharded": monitor.view.sharded, "has_report": monitor.report is not None,
              "snapshots": len(monitor.checkpoints)}
    (Path(out).parent / f"rank{rank}-{world}.json").write_text(json.dumps(record))
    if world > 1:
        # Both ranks are done with every collective before the group goes away,
        # and the process then ends without C++ static teardown: a rank whose
        # gloo threads were still being torn down at exit aborted ("terminate
        # called without an active exception") on a loaded machine.
        dist.barrier()
        dist.destroy_process_group()
        os._exit(0)
