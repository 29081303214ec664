"""Small generated training runs (HF checkpoint-N/ directories) for trend tests.

Each checkpoint adds a random full-rank update to every q/k/router weight,
scaled by a learning-rate schedule. A planted fault makes the q_proj updates
of one layer rank-1 from a given step: the QK update collapses onto one
direction, the attention fault's signature, while the router keeps its
healthy random updates.
"""

import json
import math
from pathlib import Path

import torch

from factories import llama_config, llama_tensors, write_hf_checkpoint

UPDATE = 2e-3  # update size relative to the weight scale at learning-rate multiplier 1


def lr_schedule(k, count, warmup=4, floor=0.1):
    """Linear warm-up, then cosine decay to `floor`: update sizes vary ×10."""
    if k < warmup:
        return (k + 1) / warmup
    progress = (k - warmup) / max(1, count - warmup)
    return floor + 0.5 * (1 - floor) * (1 + math.cos(math.pi * progress))


def write_run(directory: Path, count=24, interval=100, layers=2, collapse_layer=None, collapse_from=None,
              collapse_rank=1, experts=4, seed=0, schedule=lr_schedule, loss=None, shards=1) -> Path:
    """Checkpoints at steps 0, interval, …; `collapse_from` is the first step
    whose checkpoint carries a collapsed (rank `collapse_rank`) q_proj update.
    `shards` > 1 writes each checkpoint as that many safetensors shards plus an index."""
    config = llama_config(layers=layers, hidden=64, heads=4, kv_heads=2, experts=experts)
    tensors = llama_tensors(config, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    for k in range(count):
        step = k * interval
        if k > 0:
            scale = 0.02 * UPDATE * schedule(k, count)
            for name, weight in tensors.items():
                if not name.endswith(("q_proj.weight", "k_proj.weight", "block_sparse_moe.gate.weight")):
                    continue
                update = torch.randn(weight.shape, generator=gen, dtype=torch.float64) * scale
                layer = int(name.split(".")[2])
                if (collapse_from is not None and step >= collapse_from and layer == collapse_layer
                        and name.endswith("q_proj.weight")):
                    u = torch.randn(weight.shape[0], collapse_rank, generator=gen, dtype=torch.float64)
                    v = torch.randn(collapse_rank, weight.shape[1], generator=gen, dtype=torch.float64)
                    update = u @ v * (update.norm() / (u @ v).norm()) * 3
                tensors[name] = weight + update
        write_hf_checkpoint(directory / f"checkpoint-{step}", tensors, config, shards=shards)
    if loss is not None:
        with (directory / "train_log.jsonl").open("w") as f:
            for step in range((count - 1) * interval):
                value = loss(step)
                f.write(json.dumps({"step": step, "loss": value, "lr": 1e-3 * schedule(step // interval, count)})
                        + "\n")
    return directory
