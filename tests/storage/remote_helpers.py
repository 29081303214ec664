"""Checkpoints written locally and uploaded, and report comparison."""

from __future__ import annotations

import json
import math
from typing import Any

import torch
from factories import llama_config, llama_tensors, updated, write_hf_checkpoint


def hf_run(root, steps=(100, 200), shards=2, dtype=torch.bfloat16, layers=2, seed=1):
    """checkpoint-N/ folders of a small GQA Llama, each an update of the last."""
    config = llama_config(layers=layers, hidden=64, heads=4, kv_heads=2)
    tensors = llama_tensors(config, seed)
    generator = torch.Generator().manual_seed(seed)
    folders = []
    for step in steps:
        folders.append(write_hf_checkpoint(root / f"checkpoint-{step}", tensors, config, shards=shards, dtype=dtype))
        tensors = updated(tensors, 0.003, generator)
    return folders


def same_numbers(local: Any, remote: Any, where: str = "report") -> None:
    """Equal reports: every number to 1e-12 (relative), every other value
    exactly, except paths, which name the local file or the URL."""
    if isinstance(local, dict):
        assert local.keys() == remote.keys(), where
        for key in local:
            same_numbers(local[key], remote[key], f"{where}.{key}")
    elif isinstance(local, list):
        assert len(local) == len(remote), where
        for i, (a, b) in enumerate(zip(local, remote)):
            same_numbers(a, b, f"{where}[{i}]")
    elif isinstance(local, float) and isinstance(remote, float):
        assert math.isclose(local, remote, rel_tol=1e-12, abs_tol=1e-12), (where, local, remote)
    elif isinstance(local, str) and (local.startswith("/") or "://" in remote):
        assert local.rsplit("/", 1)[-1] == remote.rsplit("/", 1)[-1], (where, local, remote)
    else:
        assert local == remote, (where, local, remote)


def report_of(output: str) -> dict:
    return json.loads(output)
