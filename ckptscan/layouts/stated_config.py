"""The model config a checkpoint (or its user) states, in config.json's words.

Resolvers read head geometry from a Hugging Face `config.json`. Training
frameworks that write none state the same numbers elsewhere, under their own
names: Lightning's `hyper_parameters` (whatever `save_hyperparameters()`
kept, often the model config dict), litgpt's `model_config.yaml` (`n_head`,
`n_query_groups`, `head_size`, `n_embd`), DeepSpeed's `args` when the
training script passed them, torchtitan's job TOML (a `[model]` name and
flavour, whose numbers live in torchtitan's source). `--model-config FILE`
gives any of these files for checkpoints that carry nothing.

`stated_config` picks, in order: `--model-config`, the checkpoint's own
config.json, then what its framework stored; and returns it as a
`SourcedConfig`: a dict with config.json's key names added, that remembers
where it came from, so `inspect` notes say "litgpt model_config.yaml
'n_head'", not "config.json".
"""

from __future__ import annotations

import dataclasses
import json
import re
import sys
from pathlib import Path
from typing import Any, Mapping

from ckptscan.errors import CkptScanError
from ckptscan.readers.base import Checkpoint

# config.json name -> the names frameworks use for the same number.
ALIASES = {
    "num_attention_heads": ("n_head", "n_heads", "num_heads"),
    "num_key_value_heads": ("n_query_groups", "n_kv_heads", "num_kv_heads"),
    "head_dim": ("head_size", "kv_channels"),
    "hidden_size": ("n_embd", "dim", "d_model"),
    "num_hidden_layers": ("n_layer", "n_layers", "num_layers"),
}
HEAD_KEYS = ("num_attention_heads", *ALIASES["num_attention_heads"])
TRANSFORMERS_CONFIG = re.compile(r"^transformers\.models\.(\w+)\.configuration_\1\.\w+$")

# torchtitan's model flavours (`torchtitan/models/llama3/__init__.py`,
# torchtitan 0.3.0): the job TOML names one as [model] name / flavor and the
# numbers are only in this table. n_kv_heads None means = n_heads.
TORCHTITAN_FLAVORS: dict[tuple[str, str], dict[str, int]] = {
    ("llama3", "debugmodel"): {"dim": 256, "n_layers": 6, "n_heads": 16, "n_kv_heads": 16},
    ("llama3", "1B"): {"dim": 2048, "n_layers": 16, "n_heads": 32, "n_kv_heads": 8},
    ("llama3", "3B"): {"dim": 3072, "n_layers": 28, "n_heads": 24, "n_kv_heads": 8},
    ("llama3", "8B"): {"dim": 4096, "n_layers": 32, "n_heads": 32, "n_kv_heads": 8},
    ("llama3", "70B"): {"dim": 8192, "n_layers": 80, "n_heads": 64, "n_kv_heads": 8},
    ("llama3", "405B"): {"dim": 16384, "n_layers": 126, "n_heads": 128, "n_kv_heads": 8},
}
TORCHTITAN_NAMES = {"llama3": "llama3", "llama3_ft": "llama3", "llama": "llama3"}

KINDS = "a Hugging Face config.json, a litgpt model_config.yaml or a torchtitan job .toml"


class SourcedConfig(dict):
    """A config dict that remembers where it came from (for `inspect` notes)."""

    def __init__(self, values: Mapping[str, Any], source: str):
        super().__init__(values)
        self.source = source


@dataclasses.dataclass(frozen=True)
class ModelConfigFile:
    """`--model-config FILE`, read and normalised once."""

    path: str
    values: Mapping[str, Any] = dataclasses.field(hash=False, compare=False)


def normalise(values: Mapping[str, Any]) -> dict[str, Any] | None:
    """`values` with config.json's names added for the framework names it
    uses, or None when it states no number of query heads."""
    if not any(values.get(k) is not None for k in HEAD_KEYS):
        return None
    out = dict(values)
    for name, aliases in ALIASES.items():
        if out.get(name) is None:
            found = next((values[a] for a in aliases if values.get(a) is not None), None)
            if found is not None:
                out[name] = found
    # A transformers config object (opened from a Lightning pickle) keeps its
    # model_type on the class: transformers.models.<model_type>.configuration_<model_type>.
    match = TRANSFORMERS_CONFIG.match(str(values.get("__class__", "")))
    if out.get("model_type") is None and match:
        out["model_type"] = match.group(1)
    # Megatron-style args: query groups count only with group_query_attention.
    if "num_query_groups" in values and values.get("group_query_attention") and out.get("num_key_value_heads") is None:
        out["num_key_value_heads"] = values["num_query_groups"]
    return out


def load_model_config(path: str | Path) -> ModelConfigFile:
    """Read `--model-config FILE`: .json (config.json or any dict of head
    counts), .yaml/.yml (litgpt), .toml (torchtitan job config)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise CkptScanError(f"--model-config: cannot read: {e.strerror or e}", path=path) from None
    except UnicodeDecodeError:
        raise CkptScanError("--model-config: not a text file", path=path) from None
    suffix = path.suffix.lower()
    try:
        if suffix == ".toml":
            values = _torchtitan_toml(text, path)
        elif suffix in (".yaml", ".yml"):
            import yaml

            values = yaml.safe_load(text)
        else:
            values = json.loads(text)
    except CkptScanError:
        raise
    except Exception as e:  # JSON/YAML/TOML syntax errors of several libraries
        raise CkptScanError(f"--model-config: cannot parse ({type(e).__name__}: {e})", path=path) from None
    normalised = normalise(values) if isinstance(values, Mapping) else None
    if normalised is None:
        raise CkptScanError(f"--model-config: no number of attention heads found (expected {KINDS})", path=path)
    return ModelConfigFile(str(path), normalised)


def _torchtitan_toml(text: str, path: Path) -> dict[str, Any]:
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # Python 3.10: the same API under its backport's name
        import tomli as tomllib

    model = tomllib.loads(text).get("model")
    if not isinstance(model, Mapping):
        raise CkptScanError("--model-config: a TOML without a [model] table (expected a torchtitan job config)",
                            path=path)
    name, flavor = model.get("name"), model.get("flavor", model.get("flavour"))
    if any(model.get(k) is not None for k in HEAD_KEYS):
        return {**model, "torchtitan_model": str(name)} if name is not None else dict(model)
    numbers = TORCHTITAN_FLAVORS.get((TORCHTITAN_NAMES.get(str(name), str(name)), str(flavor)))
    if numbers is None:
        known = ", ".join(f"{n}/{f}" for n, f in TORCHTITAN_FLAVORS)
        raise CkptScanError(f"--model-config: torchtitan model {name!r} flavor {flavor!r} is not in ckptscan's table "
                            f"({known}); add n_heads, n_kv_heads and dim to the [model] table", path=path)
    return {**numbers, "torchtitan_model": str(name), "torchtitan_flavor": str(flavor)}


def stated_config(checkpoint: Checkpoint, model_config: ModelConfigFile | None) -> Checkpoint:
    """`checkpoint` with the config to resolve its layout by: --model-config,
    else its config.json, else what its training framework stored."""
    if model_config is not None:
        config: dict[str, Any] | None = SourcedConfig(model_config.values, f"--model-config {model_config.path}")
    elif checkpoint.config is not None:
        return checkpoint
    else:
        config = framework_config(checkpoint)
    if config is None:
        return checkpoint
    return dataclasses.replace(checkpoint, config=config)


def framework_config(checkpoint: Checkpoint) -> SourcedConfig | None:
    """Head geometry a training framework stored with the weights."""
    meta = checkpoint.meta
    litgpt = meta.get("litgpt_config")
    if isinstance(litgpt, Mapping) and (values := normalise(litgpt)) is not None:
        return SourcedConfig(values, "litgpt model_config.yaml")
    hparams = meta.get("hyper_parameters")
    if isinstance(hparams, Mapping) and (found := _search(hparams, "hyper_parameters")) is not None:
        values, where = found
        return SourcedConfig(values, f"Lightning {where}")
    args = meta.get("args")
    if checkpoint.format == "deepspeed" and isinstance(args, Mapping) and (values := normalise(args)) is not None:
        return SourcedConfig(values, "DeepSpeed args")
    return None


def _search(tree: Mapping[str, Any], where: str, depth: int = 0) -> tuple[dict[str, Any], str] | None:
    """The first mapping stating head counts in `tree`: itself, else its
    nested mappings in order, 3 levels deep at most."""
    values = normalise(tree)
    if values is not None:
        return values, where
    if depth >= 3:
        return None
    for key, value in tree.items():
        if isinstance(value, Mapping):
            found = _search(value, f"{where}.{key}", depth + 1)
            if found is not None:
                return found
    return None
