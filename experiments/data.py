"""Byte-level corpus: the Python standard library's own top-level *.py files.

Every machine that runs Python has this corpus, so the sample runs can be
regenerated offline. Files are taken in sorted order; every `holdout_every`-th
file is held out, and the probe is read from the first held-out file. The
corpus differs between Python versions, so runs are reproducible only for the
same Python (recorded in run.json).
"""

import glob
import hashlib
import os
import sysconfig
from dataclasses import dataclass

import torch


@dataclass
class Corpus:
    train: torch.Tensor  # uint8 bytes, concatenated training files
    probe_source: torch.Tensor  # bytes of the first held-out file
    info: dict  # what went in, for run.json


def load_stdlib_corpus(max_bytes: int, holdout_every: int = 10) -> Corpus:
    root = sysconfig.get_paths()["stdlib"]
    files = sorted(glob.glob(os.path.join(root, "*.py")))
    held_out = files[holdout_every - 1 :: holdout_every]
    train_files = [f for f in files if f not in held_out]
    chunks, total = [], 0
    for path in train_files:
        if total >= max_bytes:
            break
        with open(path, "rb") as fh:
            data = fh.read()[: max_bytes - total]
        chunks.append(data)
        total += len(data)
    blob = b"".join(chunks)
    with open(held_out[0], "rb") as fh:
        probe_blob = fh.read()
    info = {
        "stdlib": root,
        "train_files": len(chunks),
        "train_bytes": len(blob),
        "train_sha256": hashlib.sha256(blob).hexdigest(),
        "probe_file": os.path.basename(held_out[0]),
    }
    return Corpus(_as_tensor(blob), _as_tensor(probe_blob), info)


def _as_tensor(blob: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(blob), dtype=torch.uint8).clone()


def sample_batch(data: torch.Tensor, batch_size: int, seq_len: int,
                 gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Random windows; targets are the inputs shifted by one byte."""
    start = torch.randint(0, data.numel() - seq_len - 1, (batch_size,), generator=gen)
    window = torch.stack([data[s : s + seq_len + 1] for s in start.tolist()]).long()
    return window[:, :-1], window[:, 1:]
