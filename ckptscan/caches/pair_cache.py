"""Incremental cache of per-pair metrics, so a nightly job over a growing run
computes only the pairs it has not seen.

One JSON file per pair under `<cache dir>/pairs/`, named by the SHA-256 of
its key. The key holds:
- each checkpoint's identity: resolved path, and for every file (weights,
  index, config.json) its size, modification time (ns) and a hash of its
  header bytes (the safetensors JSON header; small files whole); for a
  checkpoint in object storage, its URL and every object's size and
  ETag/generation, known from the listing without reading anything;
- the tool: its version and a hash of the source of the modules that compute
  metrics (so a changed monitor never serves stale numbers);
- the monitor settings: `ScanOptions.cache_key()` (every option that can
  change a number: precision, layers, heads, head overrides, device …) and
  the probe file's identity (`ckptscan.pipeline.metrics.pair_settings`).
A pair still being computed is kept layer by layer under
`<cache dir>/layers/<its hash>/`, written as each layer arrives, so an
interrupted run (a long cluster run, most of all) resumes at the layers it
had not finished; the files are removed once the whole pair is written.
A run's pairs are also kept together, in one file under `<cache dir>/packs/`
named by the run's folder and settings (`caches/packs.py`,
`caches/tables.py`): reading 2,000 pairs from their own files was most of a
cached re-run. The pack is only a faster copy; a pair not in it (the new one
of a re-run) is read from its own file, and the pack is written again, in
place, once enough pairs are not in it (`pack_due`).
Beside the metrics, `ckptscan.caches.judge_cache.JudgeCache` keeps each judged
pair and the judge state after the newest (a re-run after one new checkpoint
computes one pair and judges one pair).

The default location is the user cache directory (`$XDG_CACHE_HOME/ckptscan`,
else `~/.cache/ckptscan`), never a checkpoint directory. Writes are atomic
(temp file + rename); an unreadable or mismatched entry is recomputed.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import shutil
from pathlib import Path
from typing import Any, Sequence

import torch

import ckptscan
from ckptscan.caches import tables
from ckptscan.caches.packs import PackError, pack_due, read_pack, write_pack
from ckptscan.monitors import registry
from ckptscan.system.output import write_output
from ckptscan.system.paths import expand_path
from ckptscan.readers import Checkpoint
from ckptscan.schema.results import LayerResult, from_dict
from ckptscan.storage import RemotePath

CACHE_FORMAT = 2
# Modules whose code decides the numbers a pair's metrics hold.
_METRIC_SOURCES = ("scan", "pipeline/metrics.py", "inputs/probe.py", "schema/results.py", "monitors", "layouts",
                   "readers")
# Files up to this size are hashed whole (config.json, shard index); larger
# non-safetensors files hash their first this-many bytes.
_WHOLE_FILE_BYTES = 1 << 20


class PairCache:
    """Per-pair LayerResults on disk; counts hits and misses."""

    def __init__(self, directory: str | Path) -> None:
        self.directory = expand_path(directory)
        self.hits = 0
        self.misses = 0
        self.write_error: str | None = None  # the cache is an optimisation: a failed write is reported, not fatal
        self._names: dict[int, tuple[dict[str, Any], str]] = {}  # `_name`'s
        # The pairs each pack read or written here holds (a watch reads its run's pack once,
        # then looks for its new pairs only).
        self._packs: dict[Path, set[str]] = {}

    def key(self, older: Checkpoint, newer: Checkpoint, settings: dict[str, str]) -> dict[str, Any]:
        """`settings`: what else decides the pair's numbers (`compute.pair_settings`)."""
        return _key(checkpoint_identity(older), checkpoint_identity(newer), settings)

    def keys(self, checkpoints: Sequence[Checkpoint], pairs: Sequence[tuple[int, int]], settings: dict[str, str]
             ) -> list[dict[str, Any]]:
        """`key` of each pair (indices into `checkpoints`), each checkpoint's
        identity worked out once: a run's checkpoints are each in two pairs,
        and at 2,000 checkpoints their stats were half a re-run's listing."""
        identities: dict[int, dict[str, Any]] = {}

        def identity(i: int) -> dict[str, Any]:
            if i not in identities:
                identities[i] = checkpoint_identity(checkpoints[i])
            return identities[i]
        return [_key(identity(a), identity(b), settings) for a, b in pairs]

    def identity(self, key: dict[str, Any]) -> str:
        """The name of a pair's entry (its key's digest)."""
        return self._name(key)

    def get(self, key: dict[str, Any]) -> list[LayerResult] | None:
        return self._get(key, self._name(key))

    def get_many(self, keys: list[dict[str, Any]]) -> list[list[LayerResult] | None]:
        """`get` of each of a run's pairs, in order: those in the run's pack from one read."""
        names = [digest(key) for key in keys]
        self._names = {id(key): (key, name) for key, name in zip(keys, names)}  # this run's only: see `_name`
        packed = self._read_pack(keys[0], names) if keys else {}
        self.hits += len(packed)
        return [packed[name] if name in packed else self._get(key, name) for key, name in zip(keys, names)]

    def pack(self, keys: list[dict[str, Any]], layers: list[list[LayerResult]]) -> None:
        """Keep a run's pairs (`keys`, in order, all computed) as its pack when
        enough of them are not in the pack `get_many` read (`pack_due`)."""
        if not keys:
            return
        names, path = [self._name(key) for key in keys], self._pack_path(keys[0])
        packed = self._packs.get(path, set())
        if not pack_due(sum(name in packed for name in names), len(names)):
            return
        try:
            write_pack(path, names, tables.encode(list[LayerResult], layers))
        except OSError as e:
            self.write_error = f"{self.directory}: {e.strerror or e}"
            return
        self._packs[path] = set(names)

    def _name(self, key: dict[str, Any]) -> str:
        """`digest(key)`, worked out once for each key of the run `get_many` was
        last given: compute names each of a run's pairs three times (to read
        it, to pack it, for the judge cache), ~0.1 s at 2,000 pairs. A key
        is not changed once made (`key`, `keys`), so its name holds."""
        known = self._names.get(id(key))
        if known is not None and known[0] is key:  # the very dict (it is kept, so its id is not reused)
            return known[1]
        return digest(key)

    def _get(self, key: dict[str, Any], name: str) -> list[LayerResult] | None:
        path = self.directory / "pairs" / f"{name}.json"
        try:
            entry = json.loads(path.read_text(encoding="utf-8"))
            if entry.get("key") != key:
                raise ValueError("key mismatch")
            layers = [from_dict(LayerResult, layer) for layer in entry["layers"]]
        except (OSError, ValueError, KeyError, TypeError):
            self.misses += 1
            return None
        self.hits += 1
        return layers

    def _read_pack(self, first: dict[str, Any], names: list[str]) -> dict[str, list[LayerResult]]:
        """Those of `names` the pack of `first`'s run holds (none when there is
        no pack or it cannot be read), by name."""
        path, wanted = self._pack_path(first), set(names)
        if path in self._packs and not wanted & self._packs[path]:
            return {}  # a watch's look at its new pairs only: not in the pack it read
        try:
            packed, rows = read_pack(path)
            self._packs[path] = set(packed)
            if not wanted & self._packs[path]:
                return {}
            pairs = tables.decode(list[LayerResult], rows)
            if len(pairs) != len(packed):
                raise PackError(f"{path}: {len(pairs)} pairs for {len(packed)} names")
            return {name: pair for name, pair in zip(packed, pairs) if name in wanted}
        except (OSError, PackError, ValueError, KeyError, TypeError, IndexError, StopIteration):
            return {}

    def put(self, key: dict[str, Any], layers: list[LayerResult]) -> None:
        # allow_nan: the cache must give back exactly what was computed.
        text = json.dumps({"key": key, "layers": [metrics_dict(layer) for layer in layers]}, allow_nan=True)
        try:
            write_output(self._path(key), text)
        except OSError as e:
            self.write_error = f"{self.directory}: {e.strerror or e}"
            return
        shutil.rmtree(self._layer_dir(key), ignore_errors=True)

    def get_layers(self, key: dict[str, Any]) -> dict[int, LayerResult]:
        """The layers of an unfinished pair that `put_layer` wrote, by layer
        number (unreadable or mismatched files are left out: recomputed)."""
        found = {}
        directory = self._layer_dir(key)
        for path in sorted(directory.glob("*.json")) if directory.is_dir() else []:
            try:
                entry = json.loads(path.read_text(encoding="utf-8"))
                if entry.get("key") != key:
                    raise ValueError("key mismatch")
                layer = from_dict(LayerResult, entry["layer"])
            except (OSError, ValueError, KeyError, TypeError):
                continue
            found[layer.layer] = layer
        return found

    def put_layer(self, key: dict[str, Any], layer: LayerResult) -> None:
        """One finished layer of a pair whose other layers are still running."""
        text = json.dumps({"key": key, "layer": metrics_dict(layer)}, allow_nan=True)
        try:
            write_output(self._layer_dir(key) / f"{layer.layer}.json", text)
        except OSError as e:
            self.write_error = f"{self.directory}: {e.strerror or e}"

    def _path(self, key: dict[str, Any]) -> Path:
        return self.directory / "pairs" / f"{self._name(key)}.json"

    def _layer_dir(self, key: dict[str, Any]) -> Path:
        return self.directory / "layers" / self._name(key)

    def _pack_path(self, first: dict[str, Any]) -> Path:
        """A run's pack, named by where its first pair's older checkpoint lies
        and what decides its numbers but the checkpoints: one pack a run and
        settings, replaced as the run grows or its oldest checkpoints are deleted."""
        older = first["older"]
        where = older["url"].rsplit("/", 1)[0] if "url" in older else str(Path(older["path"]).parent)
        name = digest({"run": where, **{k: v for k, v in first.items() if k not in ("older", "newer")}})
        return self.directory / "packs" / f"{name}.pack"


def digest(key: dict[str, Any]) -> str:
    """The name of a cache entry: the SHA-256 of its key."""
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


def metrics_dict(layer: LayerResult) -> dict[str, Any]:
    """A layer's metrics without detection's findings and status."""
    data = dataclasses.asdict(layer)
    data.pop("findings")
    data.pop("status")
    return data


def _key(older: dict[str, Any], newer: dict[str, Any], settings: dict[str, str]) -> dict[str, Any]:
    # A family registered at run time computes values the sources do not show.
    computed = [f.name for f in registry.families() if f.compute is not None]
    return {"format": CACHE_FORMAT, "tool": tool_fingerprint(), "families": computed, "settings": settings,
            "older": older, "newer": newer}


def checkpoint_identity(ckpt: Checkpoint) -> dict[str, Any]:
    if ckpt.identity is not None:
        return ckpt.identity
    files = sorted({*ckpt.files, *([ckpt.path / "config.json"] if ckpt.path.is_dir() else [])})
    if isinstance(ckpt.path, RemotePath):
        # An object's ETag (S3, Azure) or generation (GCS) changes whenever
        # its bytes do: with the size it identifies the object at no read cost.
        return {"url": str(ckpt.path),
                "files": [{"name": f.name, "size": info.size, "etag": info.etag}
                          for f in files if isinstance(f, RemotePath) and (info := f.info()) is not None]}
    return {"path": str(Path(ckpt.path).resolve()),
            "files": [file_identity(f) for f in files if f.is_file()]}


@functools.cache
def tool_fingerprint(sources: tuple[str, ...] = _METRIC_SOURCES) -> str:
    """ckptscan's version and a hash of the source that computes metrics (or of `sources`)."""
    root = Path(ckptscan.__file__).parent
    digest = hashlib.sha256()
    for name in sources:
        target = root / name
        for source in sorted(target.rglob("*.py")) if target.is_dir() else [target]:
            digest.update(str(source.relative_to(root)).encode())
            digest.update(source.read_bytes())
    return f"{ckptscan.__version__}+{digest.hexdigest()[:16]} torch {torch.__version__}"


def file_identity(path: Path | RemotePath) -> dict[str, Any]:
    if isinstance(path, RemotePath):  # as a remote checkpoint's files: no read
        info = path.info()
        return {"url": str(path), "size": info.size if info else None, "etag": info.etag if info else None}
    st = path.stat()
    return {"name": path.name, "size": st.st_size, "mtime_ns": st.st_mtime_ns, "header_sha256": _header_hash(path)}


def _header_hash(path: Path) -> str:
    with path.open("rb") as f:
        if path.suffix == ".safetensors":
            prefix = f.read(8)
            length = int.from_bytes(prefix, "little") if len(prefix) == 8 else 0
            data = prefix + f.read(min(length, _WHOLE_FILE_BYTES * 100))
        else:
            data = f.read(_WHOLE_FILE_BYTES)
    return hashlib.sha256(data).hexdigest()
