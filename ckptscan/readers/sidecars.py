"""The small files beside a checkpoint's weights: a Hugging Face
`config.json`, litgpt's `model_config.yaml`, a sharded checkpoint's index.
Each is read within the limits of `bounded`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ckptscan.errors import CkptScanError
from ckptscan.readers.bounded import MAX_CONFIG_BYTES, MAX_INDEX_BYTES, check_depth, load_json, read_limited


def read_config(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    config = load_json(path, MAX_CONFIG_BYTES, "config")
    if not isinstance(config, dict):
        raise CkptScanError("config is not a JSON object", path=path)
    return config


def read_yaml(path: Path) -> dict[str, Any]:
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


def weight_map(index_path: Path) -> dict[str, str]:
    """The tensor -> shard map of a sharded checkpoint's index (safetensors or
    .bin). An index names shards inside its own directory: an absolute path or
    '..' would read another checkpoint's (or any file's) data as this one's."""
    index = load_json(index_path, MAX_INDEX_BYTES, "shard index")
    shards = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(shards, dict) or not shards:
        raise CkptScanError("index has no 'weight_map'", path=index_path)
    checked: set[str] = set()  # an index names a few shards for many tensors: each shard checked once
    for name, shard in shards.items():
        if isinstance(shard, str) and shard in checked:
            continue
        parts = Path(str(shard)).parts
        if not isinstance(shard, str) or not parts or Path(shard).is_absolute() or ".." in parts:
            raise CkptScanError(f"the index names shard {shard!r}, which is not a file in the index's directory",
                                path=index_path, tensor=str(name))
        checked.add(shard)
    return {str(k): v for k, v in shards.items()}
