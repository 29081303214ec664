"""A record of the checkpoints a run's discovery opened and found whole, so
a re-run opens only what is new or changed.

One JSON file per run directory under `<cache dir>/opened/`. For each
checkpoint folder of the run it keeps what opening it found —
format, step, files, the framework's meta — and the stat of the checkpoint
and of every file it read: size, modification and change times (ns), inode.
A write, a rename over, a truncation or a file added to the folder changes
one of them (the change time cannot be set back by a user), so a checkpoint
whose stats all match opens as it did: it comes back with its recorded
path, format, step, files, meta, config and pair-cache identity (its files'
header hashes: not read again), and a `DeferredSource` for its tensors,
read only if a pair of it is computed. Any other
checkpoint is opened and validated as always, and a corrupt one is never
recorded. Only local safetensors checkpoints are recorded (their files are
all the open reads); any other format is opened every time.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from ckptscan.caches.pair_cache import checkpoint_identity, tool_fingerprint
from ckptscan.system.output import write_output
from ckptscan.readers import Checkpoint
from ckptscan.readers.deferred import DeferredSource
from ckptscan.storage import RemotePath

RECORD_FORMAT = 2
# The formats whose open reads only `Checkpoint.files` and the folder's config.json.
RECORDED_FORMATS = ("safetensors", "safetensors-sharded")
# The code that decides what opening finds: a record from other code is not used.
_OPENING_SOURCES = ("readers", "storage", "pipeline/discovery.py", "pipeline/opened.py")


class OpenedRecord:
    """The record of one run directory's checkpoints (`lookup`, `remember`, `save`)."""

    def __init__(self, cache_dir: str | Path, run_dir: str | Path | RemotePath) -> None:
        self.entries: dict[str, dict[str, Any]] = {}
        self._changed = False
        self.path: Path | None = None
        if isinstance(run_dir, RemotePath):
            return  # a listing already names every object's size and ETag: nothing to save
        run = self._run = str(Path(run_dir).resolve())
        self.path = Path(cache_dir) / "opened" / f"{hashlib.sha256(run.encode()).hexdigest()}.json"
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
            if data.get("format") == RECORD_FORMAT and data.get("run") == run \
                    and data.get("tool") == tool_fingerprint(_OPENING_SOURCES):
                self.entries = data["checkpoints"]
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            self.entries = {}  # no record, or an unreadable one: everything is opened

    def lookup(self, entry: Path | RemotePath) -> Checkpoint | None:
        """`entry` as it last opened, if nothing it is made of has changed since."""
        found = self.entries.get(str(entry))  # a remote run's record is always empty
        if found is None:
            return None
        try:
            if _signature(found["path"], found["files"]) != found["signature"]:
                return None
            path = Path(found["path"])
            # Copies: what callers set in a checkpoint's meta or config is not the record's.
            config = dict(found["config"]) if found["config"] is not None else None
            return Checkpoint(path, found["format"], found["step"], DeferredSource(path), config,
                              [Path(f) for f in found["files"]], dict(found["meta"]), found["identity"])
        except (OSError, KeyError, TypeError, ValueError):
            return None

    def remember(self, entry: Path | RemotePath, checkpoint: Checkpoint) -> None:
        """Record a checkpoint just opened from `entry` (before discovery sets its step)."""
        if self.path is None or checkpoint.format not in RECORDED_FORMATS:
            return  # a remote run, or a format whose open reads more than its files
        if type(checkpoint.meta) is not dict or type(checkpoint.config) not in (dict, type(None)):
            return
        try:  # exactly what this record can hold (JSON), else it is opened every time
            if json.loads(json.dumps([checkpoint.meta, checkpoint.config])) != [checkpoint.meta, checkpoint.config]:
                return
        except (TypeError, ValueError):
            return
        if not isinstance(checkpoint.path, Path) or not isinstance(entry, Path):
            return  # a remote run (no record: returned above)
        folder = Path(checkpoint.path)
        if folder != Path(entry) or not folder.is_dir():
            return
        files = [str(f) for f in checkpoint.files]
        try:
            signature = _signature(str(folder), files)
            identity = checkpoint_identity(checkpoint)
            if _signature(str(folder), files) != signature:
                return  # written to while it was hashed
        except OSError:
            return
        self.entries[str(entry)] = {"path": str(folder), "format": checkpoint.format, "step": checkpoint.step,
                                    "files": files, "meta": checkpoint.meta, "config": checkpoint.config,
                                    "identity": identity, "signature": signature}
        self._changed = True

    def forget_others(self, entries: list[Path | RemotePath]) -> None:
        """Keep only these entries' records (checkpoints deleted from the run drop out)."""
        keep = {str(e) for e in entries}
        if set(self.entries) - keep:
            self.entries = {k: v for k, v in self.entries.items() if k in keep}
            self._changed = True

    def save(self) -> None:
        """Write the record if it changed; a failed write only costs the next run its opens."""
        if self.path is None or not self._changed:
            return
        text = json.dumps({"format": RECORD_FORMAT, "run": self._run, "tool": tool_fingerprint(_OPENING_SOURCES),
                           "checkpoints": self.entries})
        try:
            write_output(self.path, text)
        except OSError:
            pass
        self._changed = False


def _signature(folder: str, files: list[str]) -> list[list[Any]]:
    """The stat of a checkpoint folder, of every file directly in it (config.json,
    the shards, what a framework registered) and of the files its open read."""
    made_of = {folder: os.stat(folder)}
    with os.scandir(folder) as listing:
        for item in listing:
            if item.is_file():
                made_of[item.path] = item.stat()
    for file in files:
        if file not in made_of:
            made_of[file] = os.stat(file)
    return sorted([path, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino] for path, st in made_of.items())
