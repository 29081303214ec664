"""Readers: bytes on disk -> named tensors, read lazily one tensor at a time.

Every format is exposed through the same tiny surface (`TensorSource`):
`keys()`, `shape(name)`, `dtype(name)`, `get(name, rows=None)`. A
`Checkpoint` bundles that with the checkpoint's path, step and config.
Readers never write, and never execute code from a checkpoint.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch

from ckptscan.errors import CkptScanError
from ckptscan.readers.safetensors import TensorEntry, read_header, read_tensor


class TensorSource(Protocol):
    def keys(self) -> list[str]: ...

    def shape(self, name: str) -> tuple[int, ...]: ...

    def dtype(self, name: str) -> str: ...

    def get(self, name: str, rows: tuple[int, int] | None = None) -> torch.Tensor: ...


class SafetensorsSource:
    """One or more safetensors files (a sharded checkpoint) as one tensor map."""

    def __init__(self, files: list[Path], weight_map: dict[str, str] | None = None, index_path: Path | None = None):
        self.files = files
        self.metadata: dict[str, str] = {}
        self._entries: dict[str, TensorEntry] = {}
        for file in files:
            entries, metadata = read_header(file)
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
        return read_tensor(self.entry(name), name, rows)


@dataclass
class Checkpoint:
    """A checkpoint on disk: where it is, which step, its config, its tensors."""

    path: Path
    format: str
    step: int | None
    tensors: TensorSource
    config: dict[str, Any] | None = None
    files: list[Path] = field(default_factory=list)


# Step numbers from the directory names training frameworks write
# (checkpoint-layouts.md §7). Accelerate's checkpoint_{k} is a save counter,
# not a step, and is deliberately absent.
STEP_PATTERNS = [
    re.compile(r"^checkpoint-(\d+)$"),  # HF Trainer
    re.compile(r"^global_step(\d+)$"),  # DeepSpeed
    re.compile(r"^iter_(\d+)$"),  # Megatron
    re.compile(r"^step-?(\d+)$"),  # torchtitan (step-N), OLMo-core (stepN)
]


def step_from_name(name: str) -> int | None:
    for pattern in STEP_PATTERNS:
        match = pattern.match(name)
        if match:
            return int(match.group(1))
    return None


def open_checkpoint(path: str | Path) -> Checkpoint:
    """Open a checkpoint directory or file without reading any tensor data."""
    path = Path(path)
    if not path.exists():
        raise CkptScanError("no such file or directory", path=path)
    if path.is_file():
        if path.suffix == ".safetensors":
            config = _read_config(path.parent / "config.json")
            return Checkpoint(path, "safetensors", step_from_name(path.parent.name), SafetensorsSource([path]),
                              config, [path])
        raise CkptScanError("unsupported checkpoint file (expected .safetensors)", path=path)
    if not path.is_dir():
        raise CkptScanError("not a file or directory", path=path)

    config = _read_config(path / "config.json")
    step = step_from_name(path.name)
    indexes = sorted(path.glob("*.safetensors.index.json"))
    if indexes:
        source = _sharded_safetensors(indexes[0])
        return Checkpoint(path, "safetensors-sharded", step, source, config, [indexes[0], *source.files])
    files = sorted(path.glob("*.safetensors"))
    if files:
        return Checkpoint(path, "safetensors", step, SafetensorsSource(files), config, files)
    raise CkptScanError("no checkpoint found here (no *.safetensors files or index)", path=path)


def _sharded_safetensors(index_path: Path) -> SafetensorsSource:
    index = _read_json(index_path)
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or not weight_map:
        raise CkptScanError("index has no 'weight_map'", path=index_path)
    shards = sorted({str(s) for s in weight_map.values()})
    files = []
    for shard in shards:
        file = index_path.parent / shard
        if not file.is_file():
            raise CkptScanError(f"the index names shard '{shard}', which does not exist (incomplete checkpoint?)",
                                path=index_path)
        files.append(file)
    return SafetensorsSource(files, {str(k): str(v) for k, v in weight_map.items()}, index_path)


def _read_config(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    config = _read_json(path)
    if not isinstance(config, dict):
        raise CkptScanError("config is not a JSON object", path=path)
    return config


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise CkptScanError(f"cannot read: {e.strerror or e}", path=path) from None
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CkptScanError(f"invalid JSON ({e})", path=path) from None
