"""torch pickles (`pytorch_model.bin`, sharded `.bin` index, `.pt`, `.pth`),
loaded without ever running code from the file.

A pickle can name any Python callable and have the unpickler call it, so a
checkpoint is only ever read with torch's weights-only unpickler. Training
frameworks also pickle a few plain objects next to the weights (Megatron's
`args` is an `argparse.Namespace`, its RNG state holds numpy arrays, TE
keeps `BytesIO` extra state), so a short allow-list of harmless types is
added (the same types Megatron-LM registers in `megatron/core/safe_globals.py`).
Classes from the training frameworks themselves (Megatron enums and configs,
Transformer Engine recipes, DeepSpeed objects) are not imported: each is
replaced by an inert stand-in that only records its arguments. Any other
global is refused, naming the file and the global.

Zip files (every `torch.save` since torch 1.6) are memory-mapped, so a tensor's
bytes are read only when it is used. Legacy (pre-1.6, non-zip) files cannot be
mapped and are loaded whole.
"""

from __future__ import annotations

import argparse
import importlib
import io
import pathlib
import pickle
import re
import signal
import types
from collections.abc import Mapping
from pathlib import Path
from typing import Any, BinaryIO

import numpy
import torch

from ckptscan.errors import CkptScanError
from ckptscan.storage import RemotePath
from ckptscan.storage.download import local_copy
from ckptscan.readers.base import Checkpoint, Format, dtype_name
from ckptscan.readers import sidecars
from ckptscan.readers.steps import step_from_name

# Classes from these packages become inert stand-ins instead of being imported.
# Lightning checkpoints pickle whatever `save_hyperparameters()` kept, often a
# transformers config object; accelerate, litgpt and torchtitan objects can
# ride along in user state the same way.
FRAMEWORK_PACKAGES = ("megatron", "transformer_engine", "deepspeed", "transformers", "lightning",
                      "pytorch_lightning", "lightning_fabric", "litgpt", "torchtitan", "accelerate")

# Top-level entries of training checkpoints that are not model weights.
NOT_MODEL = {"optimizer", "optimizer_states", "optim", "lr_scheduler", "scheduler", "opt_param_scheduler",
             "rng_state", "rng_tracker_states", "rerun_state_machine", "data_sampler", "dataloader"}

# Metadata training frameworks store next to the weights (see Checkpoint.meta).
META_KEYS = ("args", "model_args", "iteration", "iter_num", "step_count", "global_steps", "global_step", "epoch",
             "checkpoint_version", "ds_version", "hyper_parameters")

# Module-wrapper name segments that are not part of the model's own names:
# torch.compile, activation checkpointing, FSDP (torch's `_get_fqns` strips them too).
WRAPPER_SEGMENT = re.compile(r"(^|\.)(_orig_mod|_checkpoint_wrapped_module|_fsdp_wrapped_module)\.")


class StandIn:
    """Takes the place of a training-framework class; runs nothing, keeps its arguments."""

    qualified_name = ""
    args: tuple[Any, ...]
    state: Any

    def __new__(cls, *args: Any, **kwargs: Any) -> StandIn:
        obj = super().__new__(cls)
        obj.args = args
        obj.state = None
        return obj

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __setstate__(self, state: Any) -> None:
        self.state = state

    def __repr__(self) -> str:
        inner = ", ".join(map(repr, self.args)) if self.args else repr(self.state) if self.state is not None else ""
        return f"{self.qualified_name}({inner})"


_stand_ins: dict[str, type[StandIn]] = {}


def _stand_in(name: str) -> type[StandIn]:
    if name not in _stand_ins:
        _stand_ins[name] = type(name.rsplit(".", 1)[-1], (StandIn,), {"qualified_name": name})
    return _stand_ins[name]


def _harmless_globals() -> list[Any]:
    """Plain data holders that appear in training checkpoints; constructing
    them touches nothing outside the object."""
    # numpy 2 moved it under numpy._core (its stubs do not list the submodule: imported by name)
    multiarray = importlib.import_module("numpy._core.multiarray" if hasattr(numpy, "_core")
                                         else "numpy.core.multiarray")
    found = [
        argparse.Namespace,
        types.SimpleNamespace,
        pathlib.PosixPath,
        (pathlib.PosixPath, "pathlib._local.PosixPath"),  # written by Python 3.13+
        io.BytesIO,
        signal.Signals,
        torch._C.Generator,
        numpy.ndarray,
        numpy.dtype,
    ]
    for module in ("numpy.core.multiarray", "numpy._core.multiarray"):  # numpy 1.x and 2.x names
        found += [(multiarray._reconstruct, f"{module}._reconstruct"), (multiarray.scalar, f"{module}.scalar")]
    found += [(cls, f"numpy.dtypes.{name}") for name, cls in vars(numpy.dtypes).items() if name.endswith("DType")]
    return found


def _global_named_in(error: Exception) -> str | None:
    match = re.search(r"GLOBAL (\S+)", str(error))
    return match.group(1) if match else None


def _allow(names: list[str], stand_ins: dict[str, type[StandIn]], where: str) -> None:
    """Give framework classes stand-ins; refuse if anything else is named."""
    refused = sorted(n for n in names if n.split(".", 1)[0] not in FRAMEWORK_PACKAGES)
    if refused:
        raise CkptScanError(
            f"refusing to unpickle: the file references {', '.join(repr(n) for n in refused)}, which "
            f"{'is' if len(refused) == 1 else 'are'} not on ckptscan's allow-list of harmless types (unpickling "
            "could run code from the file); convert the checkpoint to safetensors in an environment you trust",
            path=where)
    stand_ins.update((n, _stand_in(n)) for n in names)


def load_pickle(file: Path | RemotePath | BinaryIO, where: str | Path | RemotePath | None = None) -> Any:
    """`torch.load` with the weights-only unpickler, the harmless allow-list and
    framework stand-ins; memory-mapped when `file` is a zip file on disk."""
    where = str(where if where is not None else file)
    if not hasattr(torch.serialization, "safe_globals"):
        raise CkptScanError("reading torch pickles safely needs torch >= 2.6", path=where)
    if isinstance(file, RemotePath):
        file = local_copy(file)  # a pickle cannot be read by byte range
    try:
        obj = _load(file, where)
        _check_structure(obj, where)
        return obj
    except CkptScanError:
        raise
    except OSError as e:
        raise CkptScanError(f"cannot read: {e.strerror or e}", path=where) from None
    except Exception as e:  # torch raises RuntimeError, EOFError, ValueError, zipfile errors on corrupt files
        raise CkptScanError(f"not a readable torch checkpoint ({type(e).__name__}: {e})", path=where) from None


# Limits on the container graph a pickle may build (the walkers below recurse
# through it): real checkpoints nest < 10 deep and hold < 1M entries.
MAX_DEPTH = 100
MAX_ENTRIES = 10_000_000


def _check_structure(obj: Any, where: str) -> None:
    """Refuse a loaded object the tree walkers (`flat_tensors`, `plain`) cannot
    finish: a cycle (a dict containing itself), nesting past MAX_DEPTH, or
    shared containers that expand past MAX_ENTRIES when walked as a tree (40
    levels of {"a": d, "b": d} is 2^40 entries in a few hundred bytes).
    Linear in the distinct containers: each one's expanded size is memoised."""
    sizes: dict[int, int] = {}
    path: set[int] = set()

    def size(node: Any, depth: int) -> int:
        if isinstance(node, (argparse.Namespace, types.SimpleNamespace)):
            children = list(vars(node).values())
        elif isinstance(node, StandIn):
            children = [*node.args, node.state]
        elif isinstance(node, Mapping):
            children = list(node.values())
        elif isinstance(node, (list, tuple)):
            children = list(node)
        else:
            return 1
        key = id(node)
        if key in path:
            raise CkptScanError("refusing a pickle whose containers contain themselves", path=where)
        if depth > MAX_DEPTH:
            raise CkptScanError(f"refusing a pickle nested more than {MAX_DEPTH} containers deep", path=where)
        if key not in sizes:
            path.add(key)
            sizes[key] = 1 + sum(size(child, depth + 1) for child in children)
            path.discard(key)
            if sizes[key] > MAX_ENTRIES:
                raise CkptScanError(f"refusing a pickle whose shared containers expand to more than {MAX_ENTRIES} "
                                    "entries", path=where)
        return sizes[key]

    size(obj, 0)


def _load(file: Path | BinaryIO, where: str) -> Any:
    is_zip = _is_zip(file)
    harmless = _harmless_globals()
    stand_ins: dict[str, type[StandIn]] = {}
    if is_zip:  # every global the pickle names, read without unpickling
        with torch.serialization.safe_globals(harmless):
            _allow(torch.serialization.get_unsafe_globals_in_checkpoint(file), stand_ins, where)
    # Legacy files cannot be scanned up front, and a zip's scan misses globals
    # built at run time: the weights-only unpickler stops at each one, and we
    # either add a stand-in and retry or refuse.
    for _ in range(64):
        if not isinstance(file, Path):
            file.seek(0)
        try:
            with torch.serialization.safe_globals(harmless + [(cls, n) for n, cls in stand_ins.items()]):
                return torch.load(file, map_location="cpu", weights_only=True,
                                  mmap=is_zip and isinstance(file, Path))
        except pickle.UnpicklingError as e:
            name = _global_named_in(e)
            if name is None or name in stand_ins:
                raise CkptScanError(f"cannot be unpickled safely: {_unpickler_reason(e)}", path=where) from None
            _allow([name], stand_ins, where)
    raise CkptScanError("cannot be unpickled safely: too many framework classes", path=where)


def _unpickler_reason(error: Exception) -> str:
    """The weights-only unpickler's own complaint, without torch's generic advice."""
    advice = ("weights_only", "Check the documentation", "trust", "add_safe_globals")
    lines = [line.strip() for line in str(error).splitlines()]
    return " ".join(line for line in lines if line and not any(a in line for a in advice)) or lines[-1]


def _is_zip(file: Path | RemotePath | BinaryIO) -> bool:
    if isinstance(file, RemotePath):
        file = local_copy(file)  # downloaded once; this finds that copy
    if isinstance(file, Path):
        with open(file, "rb") as f:
            return f.read(4) == b"PK\x03\x04"
    file.seek(0)
    magic = file.read(4)
    file.seek(0)
    return magic == b"PK\x03\x04"


def plain(value: Any, open_stand_ins: bool = False) -> Any:
    """Checkpoint metadata as JSON-like data (namespaces become dicts). With
    `open_stand_ins`, a stand-in whose pickled state is a dict (a transformers
    config object in Lightning's hyper_parameters) becomes that dict, with the
    class it stands for under "__class__"."""
    if open_stand_ins and isinstance(value, StandIn) and isinstance(value.state, Mapping):
        value = {"__class__": value.qualified_name, **value.state}
    if isinstance(value, (argparse.Namespace, types.SimpleNamespace)):
        value = vars(value)
    if isinstance(value, Mapping):
        return {str(k): plain(v, open_stand_ins) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v, open_stand_ins) for v in value]
    if isinstance(value, torch.Tensor):
        return value.item() if value.numel() == 1 else f"tensor{list(value.shape)}"
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value) if isinstance(value, StandIn) else str(value)


def clean_key(key: str) -> str:
    return WRAPPER_SEGMENT.sub(r"\1", key)


def flat_tensors(tree: Any, where: str | Path | RemotePath, prefix: str = "") -> dict[str, torch.Tensor]:
    """Tensor leaves of nested dicts, named by their dotted path; TE `_extra_state`
    blobs and non-tensors are left out."""
    found: dict[str, torch.Tensor] = {}
    if not isinstance(tree, Mapping):
        return found
    for key, value in tree.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            found.update(flat_tensors(value, where, name + "."))
        elif isinstance(value, torch.Tensor) and not name.endswith("_extra_state"):
            clean = clean_key(name)
            if clean in found:
                raise CkptScanError("two tensors have this name once wrapper prefixes are removed",
                                    path=where, tensor=clean)
            found[clean] = value.detach()
    return found


def split_state(obj: Any, where: Path | RemotePath) -> tuple[Any, dict[str, Any], str]:
    """(model state dict, metadata, wrapper kind) of a loaded checkpoint object."""
    if not isinstance(obj, Mapping):
        raise CkptScanError(f"expected a dict of tensors, found a {type(obj).__name__}", path=where)
    meta = {k: plain(obj[k], open_stand_ins=k == "hyper_parameters") for k in META_KEYS if k in obj}
    if "module" in obj and ("ds_version" in obj or "global_steps" in obj):
        ds_config = obj.get("ds_config")
        stage = ds_config.get("zero_optimization", {}).get("stage") if isinstance(ds_config, Mapping) else None
        if stage == 3:
            raise CkptScanError("DeepSpeed ZeRO-3 checkpoint: the weights are partitioned across the "
                                "zero_pp_rank_* files; consolidate them with DeepSpeed's zero_to_fp32.py first",
                                path=where)
        return obj["module"], meta, "deepspeed"
    if "args" in obj and "checkpoint_version" in obj:
        args = meta["args"] if isinstance(meta.get("args"), dict) else {}
        sharded = [k for k in ("tensor_model_parallel_size", "pipeline_model_parallel_size")
                   if (args.get(k) or 1) != 1]
        if "model" not in obj and where.name == "common.pt":
            raise CkptScanError("the common state of a Megatron torch_dist checkpoint (args, iteration; no "
                                "weights): open the folder that holds it", path=where)
        if sharded or "model" not in obj:
            raise CkptScanError("one shard of a model-parallel Megatron checkpoint; open its iter_NNNNNNN "
                                "directory so the shards are merged", path=where)
        return obj["model"], meta, "megatron"
    if "model" in obj and "model_args" in obj:
        if isinstance(obj.get("config"), Mapping):
            meta["config"] = plain(obj["config"])
        return obj["model"], meta, "nanogpt"
    if "pytorch-lightning_version" in obj and isinstance(obj.get("state_dict"), Mapping):
        return obj["state_dict"], meta, "lightning"
    for key in ("state_dict", "model_state_dict", "model", "module"):
        if isinstance(obj.get(key), Mapping):
            return obj[key], meta, "torch"
    return {k: v for k, v in obj.items() if k not in NOT_MODEL}, meta, "torch"


class TorchSource:
    """Tensors of one or more loaded torch pickles. `shards` maps each name to
    the file holding it; files are loaded on first use. Memory-mapped files stay
    open (cheap); a legacy file is loaded whole, so only the latest is kept."""

    def __init__(self, shards: dict[str, Path | RemotePath], where: Path | RemotePath,
                 loaded: dict[Path | RemotePath, dict[str, torch.Tensor]] | None = None):
        self.shards = shards
        self.where = where
        self._loaded = dict(loaded or {})

    def keys(self) -> list[str]:
        return list(self.shards)

    def tensor(self, name: str) -> torch.Tensor:
        file = self.shards.get(name)
        if file is None:
            raise CkptScanError("no such tensor in this checkpoint", path=self.where, tensor=name)
        if file not in self._loaded:
            obj = load_pickle(file)
            tensors = flat_tensors(split_state(obj, file)[0], file)
            if not _is_zip(file):
                self._loaded.clear()
            self._loaded[file] = tensors
        tensors = self._loaded[file]
        if name not in tensors:
            raise CkptScanError("the index names this tensor in this shard but the shard lacks it",
                                path=file, tensor=name)
        return tensors[name]

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.tensor(name).shape)

    def dtype(self, name: str) -> str:
        return dtype_name(self.tensor(name).dtype)

    def get(self, name: str, rows: tuple[int, int] | None = None) -> torch.Tensor:
        tensor = self.tensor(name)
        if rows is not None:
            lo, hi = rows
            if tensor.dim() == 0 or not 0 <= lo <= hi <= tensor.shape[0]:
                raise CkptScanError(f"rows {lo}:{hi} out of range for shape {list(tensor.shape)}",
                                    path=self.shards[name], tensor=name)
            tensor = tensor[lo:hi]
        return tensor.clone()


def open_torch_file(path: Path | RemotePath) -> tuple[TorchSource, dict[str, Any], str]:
    """A single torch pickle: (tensors, metadata, wrapper kind)."""
    state, meta, kind = split_state(load_pickle(path), path)
    tensors = flat_tensors(state, path)
    if not tensors:
        hint = (" (DeepSpeed pipeline checkpoints keep weights in layer_XX-model_YY-model_states.pt files, "
                "which are not supported)" if kind == "deepspeed" else "")
        raise CkptScanError(f"no tensors found in this torch checkpoint{hint}", path=path)
    return TorchSource(dict.fromkeys(tensors, path), path, {path: tensors}), meta, kind


def open_torch_index(index_path: Path | RemotePath, weight_map: dict[str, str]) -> TorchSource:
    """A sharded `pytorch_model.bin.index.json`; shards are loaded on first use."""
    shards = {}
    for name, shard in weight_map.items():
        file = index_path.parent / shard
        if not file.is_file():
            raise CkptScanError(f"the index names shard '{shard}', which does not exist (incomplete checkpoint?)",
                                path=index_path)
        shards[clean_key(name)] = file
    return TorchSource(shards, index_path)


# Model files of a torch-pickle checkpoint directory, by producer.
TORCH_MODEL_FILES = ("pytorch_model.bin", "ckpt.pt", "model.pt", "model.pth", "consolidated.00.pth", "lit_model.pth")
TORCH_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt")
# litgpt writes its model config beside lit_model.pth (`save_config`).
LITGPT_CONFIG = "model_config.yaml"
DEEPSPEED_MODEL_FILE = "mp_rank_00_model_states.pt"


def _pickle_file(path: Path | RemotePath) -> Path | RemotePath | None:
    return path if path.suffix in TORCH_SUFFIXES else None


def _model_file_in(folder: Path | RemotePath) -> Path | RemotePath | None:
    return next((folder / name for name in TORCH_MODEL_FILES if (folder / name).is_file()), None)


def _open_pickle(path: Path | RemotePath) -> Checkpoint:
    source, meta, kind = open_torch_file(path)
    litgpt_config = path.parent / LITGPT_CONFIG
    files = [path]
    if litgpt_config.is_file():
        meta["litgpt_config"] = sidecars.read_yaml(litgpt_config)
        kind = "litgpt"
        files.append(litgpt_config)
    step = step_from_name(path.parent.name)
    if step is None and path.parent.name.startswith("mp_rank_"):
        step = step_from_name(path.parent.parent.name)
    return Checkpoint(path, kind, step, source, sidecars.read_config(path.parent / "config.json"), files, meta)


def _index_file(path: Path | RemotePath) -> Path | RemotePath | None:
    return path if path.name.endswith(".bin.index.json") else None


def _index_in(folder: Path | RemotePath) -> Path | RemotePath | None:
    return min(folder.glob("*.bin.index.json"), default=None)


def _open_indexed(index_path: Path | RemotePath) -> Checkpoint:
    source = open_torch_index(index_path, sidecars.weight_map(index_path))
    folder = index_path.parent
    return Checkpoint(folder, "torch-sharded", step_from_name(folder.name), source,
                      sidecars.read_config(folder / "config.json"), [index_path, *sorted(set(source.shards.values()))])


def _deepspeed_in(folder: Path | RemotePath) -> Path | RemotePath | None:
    return folder if (folder / DEEPSPEED_MODEL_FILE).is_file() else None


def _open_deepspeed(folder: Path | RemotePath) -> Checkpoint:
    if (folder / "mp_rank_01_model_states.pt").exists():
        raise CkptScanError("DeepSpeed model-parallel checkpoint (mp_rank_01_model_states.pt): merging its "
                            "shards is not supported", path=folder)
    return _open_pickle(folder / DEEPSPEED_MODEL_FILE)


INDEXED = Format("torch-index", _open_indexed, in_file=_index_file, in_folder=_index_in)
# A file named by the user is opened as a pickle by its suffix alone, a
# DeepSpeed rank file included; in a folder, DeepSpeed's is looked for first.
DEEPSPEED = Format("deepspeed", _open_deepspeed, in_folder=_deepspeed_in, nests=True)
PICKLE = Format("torch-pickle", _open_pickle, in_file=_pickle_file, in_folder=_model_file_in)
