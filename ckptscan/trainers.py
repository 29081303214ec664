"""A resume plan in the trainer's own words: the arguments that resume a run
from a checkpoint, and those that skip a range of steps where the trainer
has them (`summary.resume.trainer`, detection/resume.py).

The trainer is named by the run's folder naming, each framework's own
(checkpoint-layouts: run-directory layouts): `checkpoint-N` (Hugging Face
Trainer), `iter_NNNNNNN` (Megatron-LM), `step-N` (torchtitan), `stepN`
(OLMo-core), a bare step number (MaxText's Orbax checkpoints). Elsewhere
(a single file, another naming) no trainer is named and the plan stays
generic. Every argument below exists in the framework's source at the
version cited in `SOURCES` (docs/guides/resume.md gives the file and line);
none is a guess. Skipping: `first`..`last` are the updates to leave out,
both included; the update that made checkpoint s+1 from checkpoint s is
step s+1 in every trainer below.
"""

from __future__ import annotations

import re
from pathlib import PurePath
from typing import Any, Callable

# What each framework's arguments were checked against (docs/guides/resume.md).
SOURCES = {
    "hf_trainer": "transformers 5.25.0: training_args.py (TrainingArguments.resume_from_checkpoint), "
                  "trainer.py (Trainer.train(resume_from_checkpoint=...))",
    "megatron": "NVIDIA/Megatron-LM d98e8a6: megatron/training/config/training_config.py (load, ckpt_step, "
                "iterations_to_skip, use_checkpoint_opt_param_scheduler), megatron/training/argument_utils.py (field "
                "name → --flag-name)",
    "torchtitan": "pytorch/torchtitan b5bcd76: torchtitan/components/checkpointer/base.py (CheckpointManager.Config "
                  "enable, folder, load_step), tests/unit_tests/test_no_new_cli_options.py (the CLI names)",
    "olmo_core": "allenai/OLMo-core fa6c501: src/olmo_core/train/config.py (TrainerConfig.load_path, steps_to_skip), "
                 "src/olmo_core/train/common.py (StepSkipRange)",
    "maxtext": "AI-Hypercomputer/maxtext e591f30: src/maxtext/configs/base.yml (load_full_state_path, run_name, "
               "skip_step_on_spikes)",
}

# Folder name -> framework: each framework's own naming of a save (the first that matches wins).
NAMINGS: tuple[tuple[str, re.Pattern[str], str], ...] = (
    ("hf_trainer", re.compile(r"checkpoint-(\d+)"), "its checkpoint-N folders are the Hugging Face Trainer's naming"),
    ("megatron", re.compile(r"iter_(\d{7})"), "its iter_NNNNNNN folders are Megatron-LM's naming"),
    ("torchtitan", re.compile(r"step-(0|[1-9]\d*)"), "its step-N folders are torchtitan's naming"),
    ("olmo_core", re.compile(r"step(0|[1-9]\d*)"), "its stepN folders are OLMo-core's naming"),
    ("maxtext", re.compile(r"(\d+)"), "its checkpoints named by their step alone are MaxText's (Orbax) naming"),
)
FRAMEWORK_NAMES = {"hf_trainer": "Hugging Face Trainer", "megatron": "Megatron-LM", "torchtitan": "torchtitan",
                   "olmo_core": "OLMo-core", "maxtext": "MaxText"}
# The frameworks whose resume arguments skip the plan's range of steps themselves.
TAKES_A_RANGE = frozenset({FRAMEWORK_NAMES["megatron"], FRAMEWORK_NAMES["olmo_core"]})


def framework_of(path: str) -> tuple[str, str] | None:
    """(framework, why) named by a checkpoint's folder name; None when no
    framework's naming matches (the plan then stays generic)."""
    name = PurePath(path).name
    for framework, pattern, why in NAMINGS:
        if pattern.fullmatch(name):
            return framework, why
    return None


def trainer_plan(path: str, step: int | None, skip: tuple[int, int] | None,
                 lr_rose: bool = False) -> dict[str, Any] | None:
    """The trainer's arguments to resume from the checkpoint at `path` (step
    `step`), skipping the updates `skip` = (first, last) where the trainer
    takes a range; `lr_rose`: the LR rose after the checkpoint (a resume with
    other flags), so the rate to keep is the one its saved scheduler state
    holds, where the trainer can be told to prefer it. {"framework",
    "evidence", "arguments", "skip", "source"}: each of `arguments` is one
    complete way to resume (the Trainer's flag, or its Python call); None
    where no framework is named.
    A new learning rate is never given as a flag: the trainers below take a
    schedule's peak, not the rate at one step (the plan's own line says it)."""
    named = framework_of(path)
    if named is None or step is None:
        return None
    framework, why = named
    arguments, skip_text = _BUILDERS[framework](PurePath(path), step, skip, lr_rose)
    return {"framework": FRAMEWORK_NAMES[framework], "evidence": why, "arguments": arguments, "skip": skip_text,
            "source": SOURCES[framework]}


def _hf_trainer(path: PurePath, step: int, skip: tuple[int, int] | None, lr_rose: bool
                ) -> tuple[list[str], str]:
    # The Trainer restores the checkpoint's learning-rate scheduler state (scheduler.pt) with it.
    return ([f"--resume_from_checkpoint {path}", f'trainer.train(resume_from_checkpoint="{path}")'],
            "the Trainer takes no range of steps to skip (ignore_data_skip only decides whether the batches "
            "before the checkpoint are fast-forwarded)")


def _megatron(path: PurePath, step: int, skip: tuple[int, int] | None, lr_rose: bool
              ) -> tuple[list[str], str]:
    flags = [f"--load {path.parent} --ckpt-step {step}"]
    text = "no steps to skip"
    if skip is not None:
        # iterations_to_skip: 1-indexed iterations; iteration s+1 is the update after checkpoint s.
        flags.append(f"--iterations-to-skip $(seq {skip[0]} {skip[1]})")
        text = f"--iterations-to-skip takes the iterations {skip[0]}–{skip[1]} one by one (1-indexed)"
    if lr_rose:
        # The checkpoint's saved scheduler state (the LR before the rise) over the flags the job was resumed with.
        flags.append("--use-checkpoint-opt_param-scheduler")
    return [" ".join(flags)], text


def _torchtitan(path: PurePath, step: int, skip: tuple[int, int] | None, lr_rose: bool
                ) -> tuple[list[str], str]:
    return ([f"--dump_folder {path.parent.parent} --checkpoint.enable --checkpoint.folder {path.parent.name} "
             f"--checkpoint.load_step {step}"],
            "torchtitan takes no range of steps to skip")


def _olmo_core(path: PurePath, step: int, skip: tuple[int, int] | None, lr_rose: bool
               ) -> tuple[list[str], str]:
    if skip is None:
        return [f'TrainerConfig(load_path="{path}", ...)'], "no steps to skip"
    # StepSkipRange: start is the first step skipped (steps start at 1), stop is exclusive.
    return ([f'TrainerConfig(load_path="{path}", steps_to_skip=[StepSkipRange(start={skip[0]}, '
             f'stop={skip[1] + 1})], ...)'],
            f"StepSkipRange(start={skip[0]}, stop={skip[1] + 1}) skips the steps {skip[0]}–{skip[1]}")


def _maxtext(path: PurePath, step: int, skip: tuple[int, int] | None, lr_rose: bool
             ) -> tuple[list[str], str]:
    # A run_name that already has checkpoints resumes from its latest one, before load_full_state_path.
    return ([f"run_name=<a new run name> load_full_state_path={path}/items"],
            "MaxText takes no range of steps to skip; skip_step_on_spikes=true skips the steps whose loss or "
            "gradient norm spikes")


_BUILDERS: dict[str, Callable[[PurePath, int, tuple[int, int] | None, bool], tuple[list[str], str]]] = {
    "hf_trainer": _hf_trainer, "megatron": _megatron, "torchtitan": _torchtitan, "olmo_core": _olmo_core,
    "maxtext": _maxtext,
}
