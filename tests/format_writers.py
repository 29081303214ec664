"""Writers of small checkpoints in the on-disk layouts of training frameworks,
for tests: HF `.bin`, nanoGPT `ckpt.pt`, DeepSpeed `global_stepN/`, Megatron
legacy `iter_NNNNNNN/mp_rank_*` and `torch_dist`, and DCP directories with
several chunks per tensor (as sharded training writes them).

Each writer mirrors the producer's own save code (file names, nesting, the
non-tensor objects pickled next to the weights), cited per function.
"""

from __future__ import annotations

import argparse
import contextlib
import enum
import io
import itertools
import json
import random
import sys
import types
import warnings
from collections import OrderedDict
from pathlib import Path

import numpy
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


class AttnBackend(enum.Enum):
    """Stands for megatron.core.transformer.enums.AttnBackend when pickling."""

    flash = 1
    fused = 2
    unfused = 3
    local = 4
    auto = 5


@contextlib.contextmanager
def fake_module(name: str, **attributes):
    """Pickle records a class or function by module and name and checks it can
    import it back; register `attributes` under `name` (and empty parent
    packages) while saving, so the file names e.g. `megatron.core.transformer.
    enums.AttnBackend` exactly like a real checkpoint. Removed afterwards, so
    loading can never import it."""
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


def megatron_args(layers: int, hidden: int, heads: int, groups: int, experts: int | None, tp: int = 1, pp: int = 1,
                  vpp: int | None = None) -> argparse.Namespace:
    """The parts of Megatron's `args` readers and layouts look at, plus the
    kinds of values a real namespace pickles (dtype, enum, path, lists)."""
    return argparse.Namespace(
        num_layers=layers, hidden_size=hidden, num_attention_heads=heads, group_query_attention=groups != heads,
        num_query_groups=groups, kv_channels=hidden // heads, ffn_hidden_size=4 * hidden, num_experts=experts,
        moe_router_topk=2, tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=vpp, expert_model_parallel_size=1, params_dtype=torch.bfloat16,
        attention_backend=AttnBackend.auto, save="/checkpoints/run", data_path=["1.0", "/data/text_document"],
        ckpt_format="torch", seq_length=4096, iteration=0,
    )


def megatron_rng_state() -> list[dict]:
    """`get_rng_state` in megatron/training/checkpointing.py."""
    return [{
        "random_rng_state": random.getstate(),
        "np_rng_state": numpy.random.get_state(),
        "torch_rng_state": torch.get_rng_state(),
        "cuda_rng_state": torch.zeros(16, dtype=torch.uint8),
        "rng_tracker_states": {"model-parallel-rng": torch.zeros(16, dtype=torch.uint8)},
    }]


def write_megatron_legacy(save_dir: Path, iteration: int, shards: dict[tuple[int, int], dict[str, dict]],
                          args: argparse.Namespace) -> Path:
    """megatron/training/checkpointing.py: save_dir/iter_{N:07d}/mp_rank_{tp:02d}
    [_{pp:03d}]/model_optim_rng.pt = {args, checkpoint_version, iteration,
    model | model0.., optimizer, opt_param_scheduler, rng_state}, then
    latest_checkpointed_iteration.txt. `shards[(tp, pp)]` maps 'model' or
    'model{i}' to that rank's state dict."""
    directory = save_dir / f"iter_{iteration:07d}"
    args.iteration = iteration
    with fake_module("megatron.core.transformer.enums", AttnBackend=AttnBackend):
        for (t, p), models in shards.items():
            rank = f"mp_rank_{t:02d}" + (f"_{p:03d}" if args.pipeline_model_parallel_size > 1 else "")
            (directory / rank).mkdir(parents=True, exist_ok=True)
            state = {"args": args, "checkpoint_version": 3.0, "iteration": iteration, **models,
                     "optimizer": {"optimizer": {"state": {}, "param_groups": [{"lr": 1e-4, "params": []}]},
                                   "fp32_from_fp16_params": []},
                     "opt_param_scheduler": {"max_lr": 3e-4, "num_steps": iteration},
                     "rng_state": megatron_rng_state(), "num_floating_point_operations_so_far": 1.5e15}
            torch.save(state, directory / rank / "model_optim_rng.pt")
    (save_dir / "latest_checkpointed_iteration.txt").write_text(str(iteration))
    return directory


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
        # Like Megatron's MCoreSavePlanner: BytesIO values are already serialised.
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


def write_megatron_torch_dist(save_dir: Path, iteration: int, tensors: dict[str, torch.Tensor],
                              args: argparse.Namespace, chunks: dict[str, list[tuple[int, int]]]) -> Path:
    """Megatron `--ckpt-format torch_dist`: save_dir/iter_{N:07d}/ holds DCP files,
    metadata.json {"sharded_backend": "torch_dist"} and the common state as the
    `common_state/shard_0_1` byte entry (torch.save of [common_state_dict]),
    then latest_checkpointed_iteration.txt (dist_checkpointing/serialization.py,
    strategies/torch.py)."""
    directory = save_dir / f"iter_{iteration:07d}"
    args.ckpt_format = "torch_dist"
    args.iteration = iteration
    common = io.BytesIO()
    with fake_module("megatron.core.transformer.enums", AttnBackend=AttnBackend):
        torch.save([{"args": args, "checkpoint_version": 3.0, "iteration": iteration,
                     "num_floating_point_operations_so_far": 1.5e15}], common)
    common.seek(0)
    state = dict(tensors)
    state["common_state/shard_0_1"] = common
    write_dcp(directory, state, chunks)
    (directory / "metadata.json").write_text(json.dumps({"sharded_backend": "torch_dist",
                                                         "sharded_backend_version": 1}))
    (save_dir / "latest_checkpointed_iteration.txt").write_text(str(iteration))
    return directory
