"""Small generated runs for the report tests (see conftest.py for the scans)."""

import math

import torch
from safetensors.torch import save_file

from run_factory import write_run

COLLAPSE = 1000
LOSS_RISE = 1100
HIDDEN = 64  # run_factory's hidden size


def rising_loss(step):
    return 3.0 * math.exp(-step / 500) + 1.0 + (0.004 * (step - LOSS_RISE) if step > LOSS_RISE else 0.0)


def write_collapse_run(directory):
    """3 layers, layer 1's q_proj updates rank-1 from COLLAPSE, a loss that
    climbs for good from LOSS_RISE, and a router probe."""
    run = write_run(directory, count=16, layers=3, collapse_layer=1, collapse_from=COLLAPSE, loss=rising_loss)
    gen = torch.Generator().manual_seed(7)
    save_file({f"layers.{i}.router_input": torch.randn(48, HIDDEN, generator=gen) for i in range(3)},
              str(run / "probe.safetensors"))
    return run


def write_healthy_run(directory):
    return write_run(directory, count=12, layers=2, seed=3)
