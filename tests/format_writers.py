"""Writers of small checkpoints in the on-disk layouts of training frameworks,
for tests: HF `.bin`, nanoGPT `ckpt.pt`, DeepSpeed `global_stepN/`, and DCP
directories with several chunks per tensor (as sharded training writes them).

Each writer mirrors the producer's own save code (file names, nesting, the
non-tensor objects pickled next to the weights), cited per function.
Megatron-LM's saves are not imitated here: real megatron-core writes them
(`megatron_saves`, tests/golden/megatron/).
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import os
import shutil
import subprocess
import sys
import types
import warnings
from collections import OrderedDict
from pathlib import Path

import filelock
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex, TensorProperties
from torch.distributed.checkpoint.planner import SavePlan, TensorWriteData, WriteItem, WriteItemType


def write_torch_bin(directory: Path, tensors: dict[str, torch.Tensor], config: dict | None, shards: int = 1,
                    legacy: bool = False) -> Path:
    """HF `save_pretrained(safe_serialization=False)`: pytorch_model.bin, or
    pytorch_model-0000i-of-0000n.bin with pytorch_model.bin.index.json."""
    directory.mkdir(parents=True, exist_ok=True)
    if config is not None:
        (directory / "config.json").write_text(json.dumps(config))
    save = {"_use_new_zipfile_serialization": not legacy}
    if shards == 1:
        torch.save(OrderedDict(tensors), directory / "pytorch_model.bin", **save)
        return directory
    names = sorted(tensors)
    weight_map = {}
    for i in range(shards):
        shard = f"pytorch_model-{i + 1:05d}-of-{shards:05d}.bin"
        part = OrderedDict((n, tensors[n]) for n in names[i::shards])
        torch.save(part, directory / shard, **save)
        weight_map.update(dict.fromkeys(part, shard))
    index = {"metadata": {"total_size": sum(t.numel() * t.element_size() for t in tensors.values())},
             "weight_map": weight_map}
    (directory / "pytorch_model.bin.index.json").write_text(json.dumps(index))
    return directory


def _adam_state(tensors: dict[str, torch.Tensor]) -> dict:
    params = [torch.nn.Parameter(t.float().clone()) for t in tensors.values()]
    optimizer = torch.optim.AdamW(params, lr=1e-3)
    sum(p.sum() for p in params).backward()
    optimizer.step()
    return optimizer.state_dict()


def write_nanogpt(out_dir: Path, tensors: dict[str, torch.Tensor], model_args: dict, iter_num: int,
                  compiled: bool = True) -> Path:
    """nanoGPT `train.py`: out_dir/ckpt.pt = {model, optimizer, model_args,
    iter_num, best_val_loss, config}; with torch.compile the state dict keys
    start with `_orig_mod.`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    prefix = "_orig_mod." if compiled else ""
    checkpoint = {
        "model": OrderedDict((prefix + k, v) for k, v in tensors.items()),
        "optimizer": _adam_state(tensors),
        "model_args": model_args,
        "iter_num": iter_num,
        "best_val_loss": torch.tensor(2.5),
        "config": {"batch_size": 12, "learning_rate": 6e-4, "compile": compiled, "dataset": "openwebtext"},
    }
    torch.save(checkpoint, out_dir / "ckpt.pt")
    return out_dir / "ckpt.pt"


def write_deepspeed(save_dir: Path, step: int, tensors: dict[str, torch.Tensor], zero_stage: int = 2,
                    client_state: dict | None = None) -> Path:
    """DeepSpeed `engine.save_checkpoint`: save_dir/global_stepN/
    mp_rank_00_model_states.pt (`module` + engine state), the ZeRO optimizer
    shard, and the `latest` tag file."""
    directory = save_dir / f"global_step{step}"
    directory.mkdir(parents=True, exist_ok=True)
    state = {
        "module": OrderedDict(tensors),
        "buffer_names": [],
        "optimizer": None,
        "param_shapes": [OrderedDict((k, v.shape) for k, v in tensors.items())],
        "frozen_param_shapes": None,
        "shared_params": {},
        "frozen_param_fragments": None,
        "lr_scheduler": None,
        "data_sampler": None,
        "random_ltd": None,
        "sparse_tensor_module_names": set(),
        "skipped_steps": 0,
        "global_steps": step,
        "global_samples": step * 8,
        "dp_world_size": 1,
        "mp_world_size": 1,
        "ds_config": {"train_batch_size": 8, "bf16": {"enabled": True}, "zero_optimization": {"stage": zero_stage}},
        "ds_version": "0.16.4",
        **(client_state or {}),
    }
    torch.save(state, directory / "mp_rank_00_model_states.pt")
    torch.save({"optimizer_state_dict": {"zero_stage": zero_stage}, "ds_version": "0.16.4"},
               directory / "zero_pp_rank_0_mp_rank_00_optim_states.pt")
    (save_dir / "latest").write_text(f"global_step{step}")
    return directory


@contextlib.contextmanager
def fake_module(name: str, **attributes):
    """Pickle records a class or function by module and name and checks it can
    import it back; register `attributes` under `name` (and empty parent
    packages) while saving, so the file names a class of that module exactly
    as a real checkpoint would (for the hostile tests: one the allow-list
    refuses). Removed afterwards, so loading can never import it."""
    parts = name.split(".")
    added = [".".join(parts[:i]) for i in range(1, len(parts) + 1) if ".".join(parts[:i]) not in sys.modules]
    for package in added:
        sys.modules[package] = types.ModuleType(package)
    for attribute, value in attributes.items():
        setattr(sys.modules[name], attribute, value)
        value.__module__, value.__qualname__ = name, attribute
    try:
        yield
    finally:
        for package in added:
            del sys.modules[package]


class ChunkedSavePlanner(DefaultSavePlanner):
    """Saves chosen tensors as a grid of chunks, the way sharded training
    writes them (one per layer, per tensor-parallel rank, ...):
    `chunks[key] = [(dim, parts), ...]`."""

    def __init__(self, chunks: dict[str, list[tuple[int, int]]]):
        super().__init__()
        self.chunks = chunks

    def create_local_plan(self) -> SavePlan:
        plan = super().create_local_plan()
        items = []
        for item in plan.items:
            key = item.index.fqn
            if key not in self.chunks:
                items.append(item)
                continue
            tensor = self.state_dict[key]
            ranges = [[(0, n)] for n in tensor.shape]
            for dim, parts in self.chunks[key]:
                bounds = torch.linspace(0, tensor.shape[dim], parts + 1).round().long().tolist()
                ranges[dim] = list(zip(bounds[:-1], bounds[1:]))
            for box in itertools.product(*ranges):
                chunk = ChunkStorageMetadata(offsets=torch.Size(lo for lo, _ in box),
                                             sizes=torch.Size(hi - lo for lo, hi in box))
                items.append(WriteItem(index=MetadataIndex(key, chunk.offsets), type=WriteItemType.SHARD,
                                       tensor_data=TensorWriteData(
                                           chunk=chunk, properties=TensorProperties.create_from_tensor(tensor),
                                           size=tensor.shape)))
        self.plan = SavePlan(items, planner_data=plan.planner_data)
        return self.plan

    def transform_object(self, write_item: WriteItem, object):
        # A BytesIO value is already serialised (Megatron's and torchtitan's planners agree): its bytes as they are.
        if isinstance(object, io.BytesIO):
            return object
        return super().transform_object(write_item, object)

    def resolve_data(self, write_item: WriteItem):
        if write_item.type != WriteItemType.SHARD:
            return super().resolve_data(write_item)
        view = self.state_dict[write_item.index.fqn]
        chunk = write_item.tensor_data.chunk
        for dim, (offset, size) in enumerate(zip(chunk.offsets, chunk.sizes)):
            view = view.narrow(dim, offset, size)
        return view.contiguous()


def write_dcp(directory: Path, state_dict: dict, chunks: dict[str, list[tuple[int, int]]] | None = None) -> Path:
    """`torch.distributed.checkpoint.save` in one process (no process group)."""
    directory.mkdir(parents=True, exist_ok=True)
    with warnings.catch_warnings():  # "assuming the intent is to save in a single process": it is
        warnings.simplefilter("ignore", UserWarning)
        dcp.save(state_dict, storage_writer=dcp.FileSystemWriter(directory),
                 planner=ChunkedSavePlanner(chunks or {}), no_dist=True)
    return directory


GOLDEN_MEGATRON = Path(__file__).parent / "golden" / "megatron"
MAKE_MEGATRON = Path(__file__).parent / "golden" / "make_megatron.py"
MEGATRON_TWO_RANK_RUNS = ("tp2", "pp2", "vpp", "uneven")


def megatron_saves(tmp_path_factory) -> Path:
    """A folder holding the committed single-rank dense run and the two-rank
    saves real megatron-core writes under tests/golden/make_megatron.py: tp2,
    pp2 (the dense weights resharded), vpp (virtual pipeline chunks), uneven
    (2 layers, then 1; MoE), each as torch_dist and in the torch format
    (`legacy_` + name). Written once a session, the xdist workers waiting on
    one lock in their common temporary folder; tests copy what they change."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    root = tmp_path_factory.getbasetemp().parent if worker else tmp_path_factory.getbasetemp()
    out = root / "megatron-saves"
    with filelock.FileLock(str(root / "megatron-saves.lock")):
        if not (out / "written").exists():
            shutil.rmtree(out, ignore_errors=True)
            shutil.copytree(GOLDEN_MEGATRON / "dense", out / "dense")
            subprocess.run([sys.executable, "-W", "ignore", str(MAKE_MEGATRON), str(out), *MEGATRON_TWO_RANK_RUNS],
                           check=True, timeout=300)
            (out / "written").touch()
    return out
