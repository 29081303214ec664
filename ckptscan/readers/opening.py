"""Opening checkpoints: the registered format that recognises a path opens
it (`formats.FORMATS`); then its step is settled and FP8 block-scaled
weights are exposed dequantised. Several paths are opened side by side when
they are URLs.
"""

from __future__ import annotations

import fnmatch
import threading
from pathlib import Path
from typing import Sequence

import torch

from ckptscan.errors import CkptScanError
from ckptscan.readers import bounded, formats, fp8, safetensors, torch_pickle
from ckptscan.readers.base import DCP_METADATA_FILE, Checkpoint
from ckptscan.readers.sidecars import read_config
from ckptscan.readers.steps import step_from_name
from ckptscan.readers.trainer_state import read_lr_history
from ckptscan.storage import RemotePath, as_path

# Remote checkpoints opened at once: each open is two round trips (listings,
# then index, headers and config side by side: `_read_early`), so a few in
# flight hide the latency; more only add threads and memory for downloaded pickles.
OPEN_CONCURRENCY = 8


def open_checkpoints(paths: Sequence[str | Path | RemotePath]) -> list[Checkpoint]:
    """`open_checkpoint` of each path, in order, URLs side by side
    (`open_each`). The first failure in the order given is raised, as when
    opened one after another."""
    checkpoints = []
    for outcome in _open_all(paths):
        if isinstance(outcome, BaseException):
            raise outcome
        checkpoints.append(outcome)
    return checkpoints


def open_each(paths: Sequence[str | Path | RemotePath]) -> list[Checkpoint | CkptScanError]:
    """`open_checkpoint` of each path, in order; a path that cannot be opened
    gives its `CkptScanError` in its place (a run skips it with the reason).
    Any other exception is raised, the first in order."""
    outcomes: list[Checkpoint | CkptScanError] = []
    for outcome in _open_all(paths):
        if isinstance(outcome, BaseException) and not isinstance(outcome, CkptScanError):
            raise outcome
        outcomes.append(outcome)
    return outcomes


def _open_all(paths: Sequence[str | Path | RemotePath]) -> list[Checkpoint | BaseException]:
    """Each path opened, or the exception that opening it raised.

    Local paths are opened one after another. URLs are opened
    `OPEN_CONCURRENCY` at a time: opening one is a chain of requests tens of
    ms each, which the next need not wait for. The workers are daemon
    threads, and joining them is interruptible: Ctrl-C during a long download
    (a torch pickle) reaches the caller at once; the opens still running only
    read, and end on their own."""
    located = [as_path(path) for path in paths]
    outcomes: list[Checkpoint | BaseException | None] = [None] * len(located)

    def open_one(k: int) -> None:
        try:
            outcomes[k] = open_checkpoint(located[k])
        except BaseException as e:  # handed to the caller's thread
            outcomes[k] = e

    if len(located) < 2 or not any(isinstance(path, RemotePath) for path in located):
        for k, path in enumerate(located):
            try:
                outcomes[k] = open_checkpoint(path)
            except Exception as e:  # Ctrl-C is not held back until the others are open
                outcomes[k] = e
        return _filled(outcomes)
    todo = iter(range(len(located)))
    lock = threading.Lock()

    def worker() -> None:
        while True:
            with lock:
                k = next(todo, None)
            if k is None:
                return
            open_one(k)

    threads = [threading.Thread(target=worker, daemon=True, name="ckptscan-open")
               for _ in range(min(OPEN_CONCURRENCY, len(located)))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return _filled(outcomes)


def _filled(outcomes: list[Checkpoint | BaseException | None]) -> list[Checkpoint | BaseException]:
    """The outcomes once every open has ended (each slot filled)."""
    filled = [outcome for outcome in outcomes if outcome is not None]
    if len(filled) != len(outcomes):
        raise RuntimeError("an open ended without an outcome")
    return filled


# Where frameworks record the step inside a checkpoint (Megatron `iteration`,
# litgpt `step_count` (optimizer steps; its `iter_num` counts micro-batches),
# nanoGPT `iter_num`, DeepSpeed `global_steps`, Lightning `global_step`,
# torchtitan `train_state.step`, a step in an accelerate registered object,
# the `step` of an Orbax train state).
# It wins over the step in the name: names can be custom, the record cannot.
META_STEPS = ("iteration", "step_count", "iter_num", "global_steps", "global_step", "train_state.step",
              "custom_step", "step")


def open_checkpoint(path: str | Path | RemotePath) -> Checkpoint:
    """Open a checkpoint directory or file. Reads headers, indexes and pickle
    structure (memory-mapped), never tensor data. `path` may be a URL
    (s3://, gs://, …): the same files are then read by byte range."""
    path = as_path(path)
    if isinstance(path, RemotePath):
        _read_early(path)
    if not path.exists():
        raise CkptScanError("no such file or directory", path=path)
    if path.is_file():
        checkpoint = _open_file(path)
    elif path.is_dir():
        checkpoint = _open_dir(path)
    else:
        raise CkptScanError("not a file or directory", path=path)
    if path.is_dir():
        step = _registered_step(path)
        if step is not None:
            checkpoint.meta["custom_step"] = step
        lr_history = read_lr_history(path)  # a Hugging Face Trainer's checkpoint-N/
        if lr_history is not None:
            checkpoint.meta["lr_history"] = lr_history
    recorded = next(((k, v) for k in META_STEPS if isinstance(v := checkpoint.meta.get(k), int)
                     and not isinstance(v, bool)), None)
    if recorded is not None:
        checkpoint.step = recorded[1]
        checkpoint.meta["step_source"] = recorded[0]
    # The checkpoint as the user named it (a folder, or the file they gave),
    # not the index or model file inside that the reader opened; a Megatron
    # rank file stands for its whole iteration folder, which is what is read.
    if path.is_dir() or checkpoint.path.parent == path.parent:
        checkpoint.path = path
    if fp8.has_block_scaled_fp8(checkpoint.tensors):
        checkpoint.tensors = fp8.BlockFp8Source(checkpoint.tensors, fp8.block_size(checkpoint.config, path), path)
    return checkpoint


# What opening a folder in object storage reads whole, when the folder has it:
# a sharded checkpoint's index (`formats`: the first one by name), the
# model's config, DCP's `.metadata`; and the header of every safetensors
# file, read by its first GET (`safetensors.REMOTE_HEADER_GUESS`).
EARLY_WHOLE = (("*.safetensors.index.json", bounded.MAX_INDEX_BYTES), ("config.json", bounded.MAX_CONFIG_BYTES),
               (DCP_METADATA_FILE, bounded.MAX_DCP_METADATA_BYTES))


def _read_early(path: RemotePath) -> None:
    """A remote open in two round trips instead of a chain of five (list
    the parent, list the folder, the index, the shard headers, the config,
    each waiting for the one before). First the parent's listing and the
    listing of everything under `path`, side by side (none when a run's
    discovery listed the run already); then every read the readers will
    make of what is there, started at once, each for exactly the range its
    reader asks (`RangedReader.read_early`), so no byte is fetched that the
    open would not read: the index, config.json, DCP's .metadata and each
    safetensors header. Only a header longer than the guess costs one more."""
    path.list_with_parent()
    if path.is_file():
        folder, names = path.parent, [path.name, "config.json"]
    elif path.is_dir():
        folder, names = path, [child.name for child in path.iterdir()]
    else:
        return
    listing = folder._listing()
    for pattern, limit in EARLY_WHOLE:
        first = min(fnmatch.filter(names, pattern), default=None)
        info = listing.files.get(first) if first is not None else None
        if first is not None and info is not None and 0 < info.size <= limit:
            path.store.read_early((folder / first).key, 0, info.size)
    for name in names:
        info = listing.files.get(name)
        if name.endswith(".safetensors") and info is not None and info.size >= 8:
            path.store.read_early((folder / name).key, 0, min(info.size, 8 + safetensors.REMOTE_HEADER_GUESS))


def _open_file(path: Path | RemotePath) -> Checkpoint:
    recognised = formats.recognise(path, folder=False)
    if recognised is None:
        raise CkptScanError(f"unsupported checkpoint file; expected {formats.EXPECTED}", path=path)
    known, target = recognised
    return known.open(target)


# OLMo-core `train/checkpoint.py`: stepN/model_and_optim/ (DCP), stepN/train/rankR.pt,
# and stepN/.metadata.json, written once everything else is saved.
OLMO_CORE_MODEL_DIR = "model_and_optim"
OLMO_CORE_DONE = ".metadata.json"


def _open_dir(path: Path | RemotePath) -> Checkpoint:
    recognised = formats.recognise(path, folder=True)
    if recognised is not None:
        known, target = recognised
        return known.open(target)
    # The checkpoint one level down: OLMo-core `stepN/model_and_optim/`, HF FSDP
    # `pytorch_model_fsdp_0/` (beside `optimizer_0/`), DeepSpeed `checkpoint-N/global_stepN/`.
    nesting = [known.in_folder for known in formats.FORMATS if known.nests and known.in_folder is not None]
    children: list[Path | RemotePath] = sorted(path.iterdir())
    inner = [d for d in children if d.is_dir() and not d.name.startswith("optim") and
             any(recogniser(d) is not None for recogniser in nesting)]
    if len(inner) == 1:
        if inner[0].name == OLMO_CORE_MODEL_DIR and not (path / OLMO_CORE_DONE).is_file():
            raise CkptScanError(f"OLMo-core checkpoint without {OLMO_CORE_DONE}, which is written last: still "
                                "being written, or incomplete", path=path)
        checkpoint = _open_dir(inner[0])
        step = step_from_name(path.name)
        checkpoint.path, checkpoint.step = path, step if step is not None else checkpoint.step
        if checkpoint.config is None:  # OLMo-core's ConfigSaverCallback writes stepN/config.json
            checkpoint.config = read_config(path / "config.json")
        return checkpoint
    if len(inner) > 1:
        raise CkptScanError(f"several checkpoints inside ({', '.join(d.name for d in inner)}); open one of them",
                            path=path)
    raise CkptScanError(f"no checkpoint recognised here; expected {formats.EXPECTED}", path=path)


# accelerate's `register_for_checkpointing` objects, saved by torch.save as
# custom_checkpoint_{i}.pkl; a step counter among them records the step.
ACCELERATE_CUSTOM = "custom_checkpoint_*.pkl"
CUSTOM_STEP_KEYS = ("step", "global_step", "step_count", "iteration")


def _registered_step(folder: Path | RemotePath) -> int | None:
    """The step an accelerate registered object records (its state dict's
    `step`, `global_step`, ...), if one does. An object that cannot be
    unpickled safely is not a step counter: it is ignored, never run."""
    files: list[Path | RemotePath] = sorted(folder.glob(ACCELERATE_CUSTOM))
    for file in files:
        try:
            state = torch_pickle.load_pickle(file)
        except CkptScanError:
            continue
        if isinstance(state, dict):
            for key in CUSTOM_STEP_KEYS:
                value = state.get(key)
                if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_floating_point():
                    value = int(value.item())
                if isinstance(value, int) and not isinstance(value, bool):
                    return value
    return None
