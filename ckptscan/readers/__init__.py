"""Readers: bytes on disk -> named tensors, read lazily one tensor at a time.

Every format is exposed through the same tiny surface (`TensorSource`):
`keys()`, `shape(name)`, `dtype(name)`, `get(name, rows=None)`. A
`Checkpoint` bundles that with the checkpoint's path, step, config and the
training framework's metadata. `open_checkpoint` recognises safetensors
(single, sharded), torch pickles (HF `.bin` and its index, nanoGPT,
DeepSpeed, plain `.pt`/`.pth`), Megatron (legacy shards and `torch_dist`) and
torch.distributed.checkpoint directories. Readers never write, and never
execute code from a checkpoint.
"""

from __future__ import annotations

import re
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import torch

from ckptscan.errors import CkptScanError
from ckptscan.readers import fp8, megatron, orbax, torch_pickle
from ckptscan.readers.base import DCP_METADATA_FILE, Checkpoint, TensorSource
from ckptscan.readers.bounded import MAX_CONFIG_BYTES, MAX_INDEX_BYTES, check_depth, load_json, read_limited
from ckptscan.readers.safetensors import TensorEntry, byte_span, read_header, read_tensor
from ckptscan.storage import RemotePath, as_path
from ckptscan.storage.ranged import Fetch

__all__ = ["Checkpoint", "SafetensorsSource", "TensorSource", "open_checkpoint", "open_checkpoints", "open_each",
           "step_from_name"]


class SafetensorsSource:
    """One or more safetensors files (a sharded checkpoint) as one tensor map."""

    def __init__(self, files: list[Path], weight_map: dict[str, str] | None = None, index_path: Path | None = None):
        self.files = files
        self.metadata: dict[str, str] = {}
        # Remote shards: (fetch, position) of each read `prefetch` started, taken by the `get` that asked for it.
        self._prefetched: dict[tuple[str, tuple[int, int] | None], tuple[Fetch, int]] = {}
        self._lock = threading.Lock()
        self._entries: dict[str, TensorEntry] = {}
        for entries, metadata in _read_headers(files):
            self._entries.update(entries)
            self.metadata.update(metadata)
        if weight_map is not None:
            for name, shard in weight_map.items():
                entry = self._entries.get(name)
                if entry is None or entry.file.name != Path(shard).name:
                    raise CkptScanError(f"the index names this tensor in '{shard}' but that shard lacks it",
                                        path=index_path, tensor=name)

    def keys(self) -> list[str]:
        return list(self._entries)

    def entry(self, name: str) -> TensorEntry:
        try:
            return self._entries[name]
        except KeyError:
            raise CkptScanError("no such tensor in this checkpoint", path=self.files[0].parent, tensor=name) from None

    def shape(self, name: str) -> tuple[int, ...]:
        return self.entry(name).shape

    def dtype(self, name: str) -> str:
        return self.entry(name).dtype

    def get(self, name: str, rows: tuple[int, int] | None = None) -> torch.Tensor:
        with self._lock:
            pending = self._prefetched.pop((name, rows), None)
        # Waits for a prefetch still in flight; its error (URL, tensor) is raised here.
        data = None if pending is None else pending[0].result()[pending[1]]
        return read_tensor(self.entry(name), name, rows, data)

    def prefetch(self, wanted: list[tuple[str, tuple[int, int] | None]]) -> Callable[[], None]:
        """Remote shards: start fetching the byte ranges of these (tensor, rows)
        reads, one concurrent batch per shard, adjacent ranges coalesced, for
        the `get` calls that follow (which wait for them). Does not wait; a
        read already prefetched and not yet taken is not fetched again. Local
        files are read by `get` itself. Returns a function that abandons what
        no `get` has taken yet (cancelling the requests not yet sent)."""
        by_file: dict[RemotePath, list[tuple[tuple[str, tuple[int, int] | None], tuple[int, int]]]] = {}
        with self._lock:
            for name, rows in dict.fromkeys(wanted):
                entry = self.entry(name)
                if isinstance(entry.file, RemotePath) and (name, rows) not in self._prefetched:
                    by_file.setdefault(entry.file, []).append(((name, rows), byte_span(entry, name, rows)))
            started = []
            for file, reads in by_file.items():
                fetch = file.fetch_ranges([span for _, span in reads], [name for (name, _), _ in reads])
                started.append((fetch, [key for key, _ in reads]))
                self._prefetched.update((key, (fetch, k)) for k, (key, _) in enumerate(reads))

        def abandon() -> None:
            with self._lock:
                for fetch, keys in started:
                    fetch.cancel()
                    for key in keys:
                        if self._prefetched.get(key, (None,))[0] is fetch:
                            del self._prefetched[key]

        return abandon


def _read_headers(files: list[Path]) -> list[tuple[dict[str, TensorEntry], dict[str, str]]]:
    """Each file's header; a sharded checkpoint's remote shards all at once
    (each header is a GET, tens of ms to first byte), local ones in turn."""
    if len(files) < 2 or not isinstance(files[0], RemotePath):
        return [read_header(file) for file in files]
    with ThreadPoolExecutor(min(len(files), 16), thread_name_prefix="ckptscan-header") as pool:
        return list(pool.map(read_header, files))


# Step numbers from the directory names training frameworks write
# (checkpoint-layouts.md §7). Accelerate's checkpoint_{k} is a save counter,
# not a step, and is deliberately absent.
STEP_PATTERNS = [
    re.compile(r"^checkpoint-(\d+)$"),  # HF Trainer
    re.compile(r"^global_step(\d+)$"),  # DeepSpeed
    re.compile(r"^iter_(\d+)$"),  # Megatron
    re.compile(r"^step[-_]?(\d+)$"),  # torchtitan and litgpt (step-N), OLMo-core (stepN), accelerate examples (step_N)
]

# A shard of a sharded safetensors checkpoint: model-00001-of-00004.safetensors.
SHARD_NAME = re.compile(r"^(.*)-(\d+)-of-(\d+)\.safetensors$")

# Model files of a torch-pickle checkpoint directory, by producer.
TORCH_MODEL_FILES = ("pytorch_model.bin", "ckpt.pt", "model.pt", "model.pth", "consolidated.00.pth", "lit_model.pth")
# litgpt writes its model config beside lit_model.pth (`save_config`).
LITGPT_CONFIG = "model_config.yaml"
DEEPSPEED_MODEL_FILE = "mp_rank_00_model_states.pt"
# OLMo-core `train/checkpoint.py`: stepN/model_and_optim/ (DCP), stepN/train/rankR.pt,
# and stepN/.metadata.json, written once everything else is saved.
OLMO_CORE_MODEL_DIR = "model_and_optim"
OLMO_CORE_DONE = ".metadata.json"
# Where frameworks record the step inside a checkpoint (Megatron `iteration`,
# litgpt `step_count` (optimizer steps; its `iter_num` counts micro-batches),
# nanoGPT `iter_num`, DeepSpeed `global_steps`, Lightning `global_step`,
# torchtitan `train_state.step`, a step in an accelerate registered object,
# the `step` of an Orbax train state).
# It wins over the step in the name: names can be custom, the record cannot.
META_STEPS = ("iteration", "step_count", "iter_num", "global_steps", "global_step", "train_state.step",
              "custom_step", "step")

EXPECTED = ("*.safetensors (+ *.safetensors.index.json), pytorch_model.bin (+ index), a .pt/.pth file "
            "(nanoGPT ckpt.pt, ...), a DCP directory (.metadata + *.distcp), a Megatron iter_NNNNNNN directory "
            "(mp_rank_XX/model_optim_rng.pt), a DeepSpeed global_stepN directory (mp_rank_00_model_states.pt) or an "
            "Orbax step directory (_CHECKPOINT_METADATA + an item with _METADATA)")


def step_from_name(name: str) -> int | None:
    for pattern in STEP_PATTERNS:
        match = pattern.match(name)
        if match:
            return int(match.group(1))
    return None


# Remote checkpoints opened at once: each open is a chain of small requests
# (listings, index, headers, config), so a few in flight hide the latency;
# more only add threads and memory for downloaded pickles.
OPEN_CONCURRENCY = 8


def open_checkpoints(paths: list[str | Path]) -> list[Checkpoint]:
    """`open_checkpoint` of each path, in order, URLs side by side
    (`open_each`). The first failure in the order given is raised, as when
    opened one after another."""
    outcomes = _open_all(paths)
    for outcome in outcomes:
        if isinstance(outcome, BaseException):
            raise outcome
    return outcomes  # type: ignore[return-value]


def open_each(paths: list[str | Path]) -> list[Checkpoint | CkptScanError]:
    """`open_checkpoint` of each path, in order; a path that cannot be opened
    gives its `CkptScanError` in its place (a run skips it with the reason).
    Any other exception is raised, the first in order."""
    outcomes = _open_all(paths)
    for outcome in outcomes:
        if isinstance(outcome, BaseException) and not isinstance(outcome, CkptScanError):
            raise outcome
    return outcomes  # type: ignore[return-value]


def _open_all(paths: list[str | Path]) -> list[Checkpoint | BaseException]:
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
        return outcomes  # type: ignore[return-value]
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
    return outcomes  # type: ignore[return-value]


def open_checkpoint(path: str | Path) -> Checkpoint:
    """Open a checkpoint directory or file. Reads headers, indexes and pickle
    structure (memory-mapped), never tensor data. `path` may be a URL
    (s3://, gs://, …): the same files are then read by byte range."""
    path = as_path(path)
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


def _open_file(path: Path) -> Checkpoint:
    name, folder = path.name, path.parent
    if name.endswith(".safetensors.index.json"):
        source = _sharded_safetensors(path)
        return Checkpoint(path, "safetensors-sharded", _step(folder), source, _read_config(folder / "config.json"),
                          [path, *source.files])
    if name.endswith(".bin.index.json"):
        return _torch_index(path)
    if name.endswith(".safetensors"):
        return Checkpoint(path, "safetensors", _step(folder), SafetensorsSource([path]),
                          _read_config(folder / "config.json"), [path])
    if name == megatron.RANK_FILE and megatron.RANK_DIR.match(folder.name):
        return _megatron_legacy(folder.parent)
    if name == DCP_METADATA_FILE:
        return _dcp(folder)
    if path.suffix in (".bin", ".pt", ".pth", ".ckpt"):
        return _torch_file(path)
    raise CkptScanError(f"unsupported checkpoint file; expected {EXPECTED}", path=path)


def _open_dir(path: Path) -> Checkpoint:
    indexes = sorted(path.glob("*.safetensors.index.json"))
    if indexes:
        return _open_file(indexes[0])
    files = sorted(path.glob("*.safetensors"))
    if files:
        _require_every_shard(path, files)
        return Checkpoint(path, "safetensors", _step(path), SafetensorsSource(files),
                          _read_config(path / "config.json"), files)
    bin_indexes = sorted(path.glob("*.bin.index.json"))
    if bin_indexes:
        return _torch_index(bin_indexes[0])
    if (path / DCP_METADATA_FILE).is_file():
        return _dcp(path)
    if megatron.is_legacy_dir(path):
        return _megatron_legacy(path)
    if (path / DEEPSPEED_MODEL_FILE).is_file():
        if (path / "mp_rank_01_model_states.pt").exists():
            raise CkptScanError("DeepSpeed model-parallel checkpoint (mp_rank_01_model_states.pt): merging its "
                                "shards is not supported", path=path)
        return _torch_file(path / DEEPSPEED_MODEL_FILE)
    for name in TORCH_MODEL_FILES:
        if (path / name).is_file():
            return _torch_file(path / name)
    if orbax.is_item_dir(path):
        return _orbax(path)
    if (path / orbax.CHECKPOINT_METADATA).is_file() and (item := orbax.item_dir(path)) is not None:
        return _orbax(item)
    # The checkpoint one level down: OLMo-core `stepN/model_and_optim/`, HF FSDP
    # `pytorch_model_fsdp_0/` (beside `optimizer_0/`), DeepSpeed `checkpoint-N/global_stepN/`.
    inner = [d for d in sorted(path.iterdir()) if d.is_dir() and not d.name.startswith("optim") and
             ((d / DCP_METADATA_FILE).is_file() or (d / DEEPSPEED_MODEL_FILE).is_file())]
    if len(inner) == 1:
        if inner[0].name == OLMO_CORE_MODEL_DIR and not (path / OLMO_CORE_DONE).is_file():
            raise CkptScanError(f"OLMo-core checkpoint without {OLMO_CORE_DONE}, which is written last: still "
                                "being written, or incomplete", path=path)
        checkpoint = _open_dir(inner[0])
        checkpoint.path, checkpoint.step = path, _step(path) if _step(path) is not None else checkpoint.step
        if checkpoint.config is None:  # OLMo-core's ConfigSaverCallback writes stepN/config.json
            checkpoint.config = _read_config(path / "config.json")
        return checkpoint
    if len(inner) > 1:
        raise CkptScanError(f"several checkpoints inside ({', '.join(d.name for d in inner)}); open one of them",
                            path=path)
    raise CkptScanError(f"no checkpoint recognised here; expected {EXPECTED}", path=path)


# accelerate's `register_for_checkpointing` objects, saved by torch.save as
# custom_checkpoint_{i}.pkl; a step counter among them records the step.
ACCELERATE_CUSTOM = "custom_checkpoint_*.pkl"
CUSTOM_STEP_KEYS = ("step", "global_step", "step_count", "iteration")


def _registered_step(folder: Path) -> int | None:
    """The step an accelerate registered object records (its state dict's
    `step`, `global_step`, ...), if one does. An object that cannot be
    unpickled safely is not a step counter: it is ignored, never run."""
    for file in sorted(folder.glob(ACCELERATE_CUSTOM)):
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


def _require_every_shard(folder: Path, files: list[Path]) -> None:
    """Shards `name-0000i-of-0000n.safetensors` found without their index:
    all n must be there, else this is a save in progress (the index is
    written last), not a checkpoint with fewer tensors."""
    present = {f.name for f in files}
    for file in files:
        match = SHARD_NAME.match(file.name)
        if match:
            prefix, index, total = match.groups()
            missing = [n for i in range(1, int(total) + 1)
                       if (n := f"{prefix}-{i:0{len(index)}d}-of-{total}.safetensors") not in present]
            if missing:
                raise CkptScanError(f"shard '{missing[0]}' and the index are missing (checkpoint still being "
                                    "written, or incomplete)", path=folder)


def _step(folder: Path) -> int | None:
    return step_from_name(folder.name)


def _torch_file(path: Path) -> Checkpoint:
    source, meta, kind = torch_pickle.open_torch_file(path)
    litgpt_config = path.parent / LITGPT_CONFIG
    files = [path]
    if litgpt_config.is_file():
        meta["litgpt_config"] = _read_yaml(litgpt_config)
        kind = "litgpt"
        files.append(litgpt_config)
    step = _step(path.parent)
    if step is None and path.parent.name.startswith("mp_rank_"):
        step = _step(path.parent.parent)
    return Checkpoint(path, kind, step, source, _read_config(path.parent / "config.json"), files, meta)


def _torch_index(index_path: Path) -> Checkpoint:
    source = torch_pickle.open_torch_index(index_path, _weight_map(index_path))
    folder = index_path.parent
    return Checkpoint(folder, "torch-sharded", _step(folder), source, _read_config(folder / "config.json"),
                      [index_path, *sorted(set(source.shards.values()))])


def _dcp(directory: Path) -> Checkpoint:
    from ckptscan.readers import dcp  # imports torch.distributed.checkpoint (~1 s): only for DCP

    source, meta, files = dcp.open_dcp(directory)
    step = _step(directory) if _step(directory) is not None else _step(directory.parent)
    config = _read_config(directory / "config.json")
    if megatron.is_torch_dist(directory):
        stacked, megatron_meta = megatron.open_torch_dist(source)
        return Checkpoint(directory, "megatron-torch_dist", step, stacked, config, files, {**meta, **megatron_meta})
    return Checkpoint(directory, "dcp", step, source, config, files, meta)


def _orbax(item: Path) -> Checkpoint:
    """An Orbax item folder; its step folder (`<step>/`) is the checkpoint."""
    source = orbax.OrbaxSource(item)
    step_dir = item.parent if (item.parent / orbax.CHECKPOINT_METADATA).is_file() else item
    step = int(step_dir.name) if step_dir.name.isdigit() else None
    meta: dict[str, Any] = {}
    if "step" in source.keys() and source.shape("step") == ():  # MaxText's train state records it
        value = source.get("step")
        if not value.is_floating_point():
            meta["step"] = int(value.item())
    return Checkpoint(step_dir, "orbax", step, source, _read_config(step_dir / "config.json"),
                      sorted(f for f in item.rglob("*") if f.is_file()), meta)


def _megatron_legacy(directory: Path) -> Checkpoint:
    source, meta, files = megatron.open_legacy(directory)
    return Checkpoint(directory, "megatron", _step(directory), source, None, files, meta)


def _sharded_safetensors(index_path: Path) -> SafetensorsSource:
    weight_map = _weight_map(index_path)
    files = []
    for shard in sorted(set(weight_map.values())):
        file = index_path.parent / shard
        if not file.is_file():
            raise CkptScanError(f"the index names shard '{shard}', which does not exist (incomplete checkpoint?)",
                                path=index_path)
        files.append(file)
    return SafetensorsSource(files, weight_map, index_path)


def _weight_map(index_path: Path) -> dict[str, str]:
    """The tensor -> shard map of a sharded checkpoint's index (safetensors or
    .bin). An index names shards inside its own directory: an absolute path or
    '..' would read another checkpoint's (or any file's) data as this one's."""
    index = load_json(index_path, MAX_INDEX_BYTES, "shard index")
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise CkptScanError("index has no 'weight_map'", path=index_path)
    for name, shard in weight_map.items():
        parts = Path(str(shard)).parts
        if not isinstance(shard, str) or not parts or Path(shard).is_absolute() or ".." in parts:
            raise CkptScanError(f"the index names shard {shard!r}, which is not a file in the index's directory",
                                path=index_path, tensor=str(name))
    return {str(k): v for k, v in weight_map.items()}


def _read_config(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    config = load_json(path, MAX_CONFIG_BYTES, "config")
    if not isinstance(config, dict):
        raise CkptScanError("config is not a JSON object", path=path)
    return config


def _read_yaml(path: Path) -> dict[str, Any]:
    import yaml

    raw = read_limited(path, MAX_CONFIG_BYTES, "model config")
    try:
        value = yaml.safe_load(raw.decode("utf-8"))
    except (UnicodeDecodeError, yaml.YAMLError, RecursionError) as e:
        raise CkptScanError(f"invalid YAML ({type(e).__name__})", path=path) from None
    if not isinstance(value, dict):
        raise CkptScanError("expected a YAML mapping", path=path)
    check_depth(value, path, "model config")
    return value
