"""Shared by the live-mode tests: a tiny training loop and report comparison."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Callable

import torch
from safetensors.torch import save_file

from experiments.model import MixtralConfig, MixtralForCausalLM, hf_state_dict

# What differs between a live report and an offline one by construction:
# where the checkpoints are (a snapshot has no file) and the live settings; the resume plan's trainer
# arguments, which the saved checkpoints' folder naming names (a snapshot's "live:step-N" names none).
PLACES = {"path", "from_path", "to_path", "run", "probe", "loss_log", "live", "tool", "trainer"}


def tiny_config() -> MixtralConfig:
    return MixtralConfig(hidden_size=32, num_hidden_layers=2, head_dim=8, max_position_embeddings=32)


def save_checkpoint(model: MixtralForCausalLM, directory: Path) -> None:
    """What experiments/train.py saves, in float32 (a live model is float32)."""
    directory.mkdir(parents=True, exist_ok=True)
    save_file(hf_state_dict(model, torch.float32), str(directory / "model.safetensors"))
    (directory / "config.json").write_text(json.dumps(model.cfg.to_hf("float32")))


def train(steps: int, seed: int = 0, lr: float = 3e-3, after_step: Callable[[MixtralForCausalLM, int], None] | None = None,
          model_hook: Callable[[MixtralForCausalLM], None] | None = None) -> list[float]:
    """A plain loop on random bytes; `after_step(model, step)` after each
    optimizer step (step = updates done). Returns the losses."""
    torch.manual_seed(seed)
    model = MixtralForCausalLM(tiny_config())
    if model_hook is not None:
        model_hook(model)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed)
    losses = []
    for step in range(1, steps + 1):
        x = torch.randint(0, 256, (4, 32), generator=gen)
        logits, _, _ = model(x)
        # A draw from the global RNG in the loop: the monitor must leave it where it was.
        noise = torch.randn(()) * 1e-3
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 256), x[:, 1:].reshape(-1)) + noise
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if after_step is not None:
            after_step(model, step)
    return losses


def comparable(report: dict[str, Any]) -> dict[str, Any]:
    """A report without the fields that name places. Why the optimizer state
    was not read is kept only as "not read": a live snapshot holds no optimizer
    at all, a Trainer's saved optimizer.pt indexes parameters by position."""
    if isinstance(report, dict):
        return {k: _not_read(v) if k == "optimizer_state" else comparable(v)
                for k, v in report.items() if k not in PLACES}
    if isinstance(report, list):
        return [comparable(v) for v in report]
    return report


def _not_read(reason: Any) -> Any:
    return "not read" if isinstance(reason, str) and reason.startswith("not read: ") else reason


def assert_same(live: Any, offline: Any, where: str = "report", tol: float = 1e-6) -> None:
    """Equal structure and values; floats to `tol` (absolute and relative)."""
    if isinstance(offline, dict):
        assert isinstance(live, dict) and live.keys() == offline.keys(), (where, sorted(set(live) ^ set(offline)))
        for key in offline:
            assert_same(live[key], offline[key], f"{where}.{key}", tol)
    elif isinstance(offline, list):
        assert isinstance(live, list) and len(live) == len(offline), where
        for i, (a, b) in enumerate(zip(live, offline)):
            assert_same(a, b, f"{where}[{i}]", tol)
    elif isinstance(offline, float) and not isinstance(offline, bool):
        assert isinstance(live, (int, float)), (where, live, offline)
        assert math.isclose(live, offline, rel_tol=tol, abs_tol=tol), (where, live, offline)
    else:
        assert live == offline, (where, live, offline)


def number_of_floats(report: Any) -> int:
    if isinstance(report, dict):
        return sum(number_of_floats(v) for v in report.values())
    if isinstance(report, list):
        return sum(number_of_floats(v) for v in report)
    return int(isinstance(report, float))

