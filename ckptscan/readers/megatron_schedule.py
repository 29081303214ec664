"""The learning rate in effect at a Megatron checkpoint, from what it saved.

Megatron-LM saves its `OptimizerParamScheduler.state_dict()` as
`opt_param_scheduler` (in `common.pt` for torch_dist, in each
`model_optim_rng.pt` for the torch format): max_lr, min_lr, lr_warmup_steps,
lr_decay_steps, lr_decay_style and num_steps, all steps counted in samples.
After each update the scheduler is stepped and sets the optimizer's LR to
`get_lr()` at the new num_steps, so that value is the LR of the update that
follows the checkpoint. It is recomputed here as
`megatron/core/optimizer_param_scheduler.py` `get_lr` does (linear warmup
from args.lr_warmup_init, then constant, linear, cosine, inverse-square-root
or WSD decay down to min_lr); WSD's anneal length is not in the state dict
but in the args (lr_wsd_decay_samples, or lr_wsd_decay_iters x
global_batch_size, as Megatron-LM's `get_optimizer_param_scheduler` derives
it). Without scheduler state the args' `lr` is the peak LR, the only one stated.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TypeGuard

from ckptscan.errors import CkptScanError
from ckptscan.storage import RemotePath

SCHEDULER_KEY = "opt_param_scheduler"
DECAY_STYLES = ("constant", "linear", "cosine", "inverse-square-root", "WSD")
WSD_STYLES = ("linear", "cosine", "exponential", "minus_sqrt")


def learning_rate(common: Mapping[str, Any], args: Mapping[str, Any], where: str | Path | RemotePath,
                  held_in: str) -> tuple[float, str] | None:
    """(LR of the next update, where it came from) for a Megatron state dict
    `common` (read from `where`, named `held_in` for the user) with its plain
    `args`; None when neither states one, when the scheduler state is not
    `OptimizerParamScheduler`'s (a field missing), or when a WSD schedule's
    anneal length is not in the args."""
    state = common.get(SCHEDULER_KEY)
    if state is None:
        lr = args.get("lr")
        if _is_number(lr):
            return float(lr), "Megatron args.lr (peak; no scheduler state)"
        return None
    if not isinstance(state, Mapping):
        raise CkptScanError(f"'{SCHEDULER_KEY}' is a {type(state).__name__}, expected Megatron's scheduler state "
                            "(a dict)", path=where)
    lr = _scheduled(state, args, where)
    return None if lr is None else (lr, f"Megatron {SCHEDULER_KEY} in {held_in}")


def _is_number(value: Any) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _number(mapping: Mapping[str, Any], key: str, where: str | Path | RemotePath, what: str) -> float:
    value = mapping.get(key)
    if not _is_number(value) or value < 0:
        raise CkptScanError(f"{what}.{key} is {value!r}, expected a non-negative number", path=where)
    return float(value)


# What `OptimizerParamScheduler.state_dict()` has held since Megatron-LM
# renamed AnnealingLR's fields (2022); older saves state no LR we can compute.
SCHEDULE_FIELDS = ("max_lr", "min_lr", "lr_warmup_steps", "lr_decay_steps", "num_steps", "lr_decay_style")


def _scheduled(state: Mapping[str, Any], args: Mapping[str, Any], where: str | Path | RemotePath) -> float | None:
    """None when a field is missing; a field of the wrong type is refused."""
    what = SCHEDULER_KEY
    if any(state.get(field) is None for field in SCHEDULE_FIELDS):
        return None
    max_lr, min_lr = _number(state, "max_lr", where, what), _number(state, "min_lr", where, what)
    warmup, decay = _number(state, "lr_warmup_steps", where, what), _number(state, "lr_decay_steps", where, what)
    steps = _number(state, "num_steps", where, what)
    style = state.get("lr_decay_style")
    if style not in DECAY_STYLES:
        raise CkptScanError(f"{what}.lr_decay_style is {style!r}, expected one of {', '.join(DECAY_STYLES)}",
                            path=where)
    init_lr = _number(args, "lr_warmup_init", where, "args") if args.get("lr_warmup_init") is not None else 0.0
    if warmup > 0 and steps <= warmup:
        return init_lr + (max_lr - init_lr) * steps / warmup
    if style == "constant":
        return max_lr
    if steps > decay:
        return min_lr
    if style == "inverse-square-root":
        return max(min_lr, max_lr * max(warmup, 1) ** 0.5 / max(steps, 1) ** 0.5)
    if decay <= warmup:  # Megatron's scheduler asserts warmup < decay: no such state is saved by it
        raise CkptScanError(f"{what}.lr_decay_steps is {state['lr_decay_steps']!r}, not above lr_warmup_steps "
                            f"{state['lr_warmup_steps']!r}", path=where)
    ratio = (steps - warmup) / (decay - warmup)
    coeff: float | None
    if style == "linear":
        coeff = 1.0 - ratio
    elif style == "cosine":
        coeff = 0.5 * (math.cos(math.pi * ratio) + 1.0)
    else:
        coeff = _wsd_coefficient(steps, decay, args, where)
        if coeff is None:
            return None
    return min_lr + coeff * (max_lr - min_lr)


def _wsd_coefficient(steps: float, decay: float, args: Mapping[str, Any],
                     where: str | Path | RemotePath) -> float | None:
    """Warmup-stable-decay: 1 until the last `wsd_decay_steps` of the decay, then annealed."""
    if args.get("lr_wsd_decay_samples") is not None:
        anneal = _number(args, "lr_wsd_decay_samples", where, "args")
    elif args.get("lr_wsd_decay_iters") is not None:
        anneal = _number(args, "lr_wsd_decay_iters", where, "args") * _number(args, "global_batch_size", where,
                                                                              "args")
    else:
        return None
    start = decay - anneal
    if steps <= start:
        return 1.0
    ratio = (steps - start) / anneal
    style = args.get("lr_wsd_decay_style")
    if style == "linear":
        return 1.0 - ratio
    if style == "cosine":
        return 0.5 * (math.cos(math.pi * ratio) + 1.0)
    if style == "exponential":
        return 2.0 * 0.5 ** ratio - 1.0
    if style == "minus_sqrt":
        return 1.0 - math.sqrt(ratio)
    raise CkptScanError(f"args.lr_wsd_decay_style is {style!r}, expected one of {', '.join(WSD_STYLES)}", path=where)
