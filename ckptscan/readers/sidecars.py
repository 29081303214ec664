"""The small files beside a checkpoint's weights: a Hugging Face
`config.json`, litgpt's `model_config.yaml`, a sharded checkpoint's index.
Each is read within the limits of `bounded`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ckptscan.errors import CkptScanError
from ckptscan.readers.bounded import MAX_CONFIG_BYTES, MAX_INDEX_BYTES, check_depth, load_json, read_limited
from ckptscan.storage import RemotePath


# Counts the head geometry is read from, under config.json's names and the
# names frameworks use for them (layouts.stated_config.ALIASES), and the MoE
# counts. A value of another type (a layer count written as the string "32")
# would otherwise be passed over as if the key were absent.
GEOMETRY_COUNTS = ("num_hidden_layers", "n_layer", "n_layers", "num_layers", "num_attention_heads", "n_head",
                   "n_heads", "num_heads", "num_key_value_heads", "n_query_groups", "n_kv_heads", "num_kv_heads",
                   "num_query_groups", "head_dim", "head_size", "kv_channels", "hidden_size", "n_embd", "d_model",
                   "num_local_experts", "num_experts", "n_routed_experts", "num_experts_per_tok", "moe_router_topk")


def check_counts(values: dict[str, Any], path: Path | RemotePath | str, scope: str = "") -> None:
    """Refuse a geometry count in `values` (and its `text_config`) that is
    not a whole number, naming the file and the key."""
    for key in GEOMETRY_COUNTS:
        value = values.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
            raise CkptScanError(f"'{scope}{key}' is {value!r} ({type(value).__name__}), expected an integer",
                                path=path)
    if not scope and isinstance(values.get("text_config"), dict):
        check_counts(values["text_config"], path, "text_config.")


def read_config(path: Path | RemotePath) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    config = load_json(path, MAX_CONFIG_BYTES, "config")
    if not isinstance(config, dict):
        raise CkptScanError("config is not a JSON object", path=path)
    check_counts(config, path)
    return config


def read_yaml(path: Path | RemotePath) -> dict[str, Any]:
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


def weight_map(index_path: Path | RemotePath) -> dict[str, str]:
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
