"""Read an offline W&B run back: the records of its `run-<id>.wandb` files.

wandb 0.31 has no Python reader of its transaction log (the Go core writes
and syncs it), so this follows the log's framing (wandb's LevelDB-style
format: a 7-byte header ':W&B' 0xBEE1 v0, then 32 KiB blocks of records,
each a 7-byte header (CRC-32, length, type: full/first/middle/last) and a
chunk) and parses each record with wandb's own protobuf, `wandb.proto`.
"""

import json
import struct
import zlib
from pathlib import Path

from wandb.proto import wandb_internal_pb2

BLOCK = 32 * 1024
HEADER = struct.Struct("<4sHB")
RECORD = struct.Struct("<IHB")
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path):
    data = Path(path).read_bytes()
    assert HEADER.unpack_from(data) == (b":W&B", 0xBEE1, 0), "not a W&B transaction log"
    pos, pending = HEADER.size, b""
    while pos < len(data):
        left = BLOCK - pos % BLOCK
        if left < RECORD.size:  # a block's tail too short for a record header is padding
            pos += left
            continue
        crc, length, kind = RECORD.unpack_from(data, pos)
        if kind == 0:  # zero padding up to the block's end
            pos += left
            continue
        chunk = data[pos + RECORD.size: pos + RECORD.size + length]
        assert zlib.crc32(chunk, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF == crc, f"{path}: bad checksum at {pos}"
        pos += RECORD.size + length
        pending += chunk
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            pending = b""
            yield record


def key(item):
    return item.key or "/".join(item.nested_key)


def read_run(path):
    """(run id, {step: {key: value}} of its history, its summary updates in order)."""
    run_id, history, summary = None, {}, {}
    for record in records(path):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run_id = record.run.run_id
        elif kind == "history":
            row = {key(i): json.loads(i.value_json) for i in record.history.item}
            history[row["_step"]] = row
        elif kind == "summary":
            summary.update({key(i): json.loads(i.value_json) for i in record.summary.update})
    return run_id, history, summary
