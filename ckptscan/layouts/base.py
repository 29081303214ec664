"""What a layout resolver produces, and the helpers every resolver shares.

A resolver only looks at tensor names, shapes, the config and the training
framework's metadata; it reads no tensor data. It returns a `ModelLayout`:
the model's shape (`ModelInfo`) and, per layer, a `LayerPlan` naming the
tensors to read with their roles. Each `LayerPlan.build` is a pure function
from the raw tensors of one layer to `LayerWeights`, so the scan can read one
layer at a time. Head geometry lives in geometry.py, plan building in plan.py.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping

import torch

from ckptscan.errors import CkptScanError
from ckptscan.schema.results import ModelInfo

# Roles of router tensors; every other role feeds the attention monitors.
ROUTER_ROLES = ("router", "router_bias")
# Roles of the output family's tensors (read with the model's last layer):
# the LM head, the token embedding standing in for a tied head, the final norm.
OUTPUT_ROLES = ("lm_head", "embedding", "final_norm")
# The LM head's roles: read a block of rows at a time (readers/rows.py), never whole.
HEAD_ROLES = ("lm_head", "embedding")


@dataclass
class LayerWeights:
    """One layer's monitored weights, upcast to the scan's compute dtype.

    q: [H, r, d] query head blocks and k: [G, r, d] key head blocks with any
    QK-norm gain folded in; router: [E, d]; router_bias: [E] (selection bias).
    """

    q: torch.Tensor | None = None
    k: torch.Tensor | None = None
    router: torch.Tensor | None = None
    router_bias: torch.Tensor | None = None
    # How the router turns logits into scores: "softmax" or "sigmoid" (DeepSeek-V3).
    router_scoring: str = "softmax"
    # MLA only: the rope part of each query head [H, dr, d] and the one rope
    # key every head shares [1, dr, d]; q/k above then hold the content part.
    rope_q: torch.Tensor | None = None
    rope_k: torch.Tensor | None = None
    # What bounds the attention logits (monitors.attention.logit_scale): the
    # gain of the norm in front of attention [d], and the QK-norm gains [r]
    # of a per-head QK-norm (one gain shared by the heads; offset applied);
    # None where the layout does not say.
    input_gain: torch.Tensor | None = None
    q_norm_gain: torch.Tensor | None = None
    k_norm_gain: torch.Tensor | None = None
    # The output family (monitors/output.py), on the model's last layer only:
    # the LM head [V, d] as stored, or a scan's `readers.rows.StoredRows`
    # giving it a block of rows at a time (a 128k × 8k head is never read or
    # copied whole), the token embedding when the head is tied to it
    # (`head_tied`), and the final norm's gain [d] in float64.
    head: Any = None
    head_tied: bool = False
    final_gain: torch.Tensor | None = None


Builder = Callable[[Mapping[str, torch.Tensor], torch.dtype], LayerWeights]


@dataclass
class LayerPlan:
    layer: int
    tensors: tuple[str, ...]
    build: Builder
    # Human-readable roles of the tensors read, for `ckptscan inspect`.
    roles: dict[str, str] = field(default_factory=dict)


@dataclass
class ModelLayout:
    info: ModelInfo
    layers: list[LayerPlan]
    # Where the head geometry came from and what was skipped, for `ckptscan inspect`.
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class HeadOverrides:
    """Head geometry from CLI flags, for checkpoints that carry no config;
    `model_config` is `--model-config FILE` (stated_config.ModelConfigFile)."""

    num_heads: int | None = None
    num_kv_heads: int | None = None
    head_dim: int | None = None
    model_config: Any = None


def config_value(config: Mapping[str, Any] | None, *names: str) -> Any:
    """First of `names` present in the config or its `text_config` (multimodal
    wrappers keep the language model's settings there)."""
    found = config_entry(config, *names)
    return None if found is None else found[0]


def config_entry(config: Mapping[str, Any] | None, *names: str, source: str = "config.json") -> tuple[Any, str] | None:
    """(value, where) of the first of `names` in the config or its `text_config`;
    `where` names the file the config came from when it knows (SourcedConfig)."""
    source = getattr(config, "source", source)
    scopes = (("", config or {}), ("text_config.", (config or {}).get("text_config") or {}))
    for scope_name, scope in scopes:
        for name in names:
            if isinstance(scope, Mapping) and scope.get(name) is not None:
                return scope[name], f"{source} '{scope_name}{name}'"
    return None


def model_types(config: Mapping[str, Any] | None) -> list[str]:
    """The config's model_type and, for multimodal wrappers, its text model's."""
    config = config or {}
    text = config["text_config"] if isinstance(config.get("text_config"), Mapping) else {}
    return [str(t) for t in (config.get("model_type"), text.get("model_type")) if t]


def as_mapping(value: Any) -> Mapping[str, Any]:
    """`value` if it is a mapping (a config section, Megatron's `args`), else {}."""
    return value if isinstance(value, Mapping) else {}


def head_blocks(weight: torch.Tensor, num_heads: int, head_dim: int, *, tensor: str, path: Any = None) -> torch.Tensor:
    """Split an nn.Linear weight [n·r, d] into head blocks [n, r, d]
    (head h is rows h·r:(h+1)·r)."""
    if weight.ndim != 2 or weight.shape[0] != num_heads * head_dim:
        raise CkptScanError(
            f"shape {list(weight.shape)} does not split into {num_heads} heads of {head_dim} rows",
            path=path,
            tensor=tensor,
        )
    return weight.reshape(num_heads, head_dim, weight.shape[1])


def require_shape(actual: tuple[int, ...], expected: tuple[int, ...], *, tensor: str, path: Any, why: str) -> None:
    if tuple(actual) != tuple(expected):
        raise CkptScanError(f"shape {list(actual)} but {why} implies {list(expected)}", path=path, tensor=tensor)


def find_layers(keys: Iterable[str], pattern: re.Pattern[str], path: Any, expected: str) -> dict[int, str]:
    """layer index -> key for the keys that fully match `pattern` (named
    groups `prefix` and `layer`); `expected` describes those names for the
    error when none matches. Keys under several prefixes (a vision tower
    beside the language model) resolve to the language model's; anything
    else ambiguous is an error."""
    by_prefix: dict[str, dict[int, str]] = {}
    for key in keys:
        match = pattern.fullmatch(key)
        if match:
            by_prefix.setdefault(match.group("prefix"), {})[int(match.group("layer"))] = key
    if not by_prefix:
        raise CkptScanError(f"no '{expected}' tensors found", path=path)
    if len(by_prefix) > 1:
        language = [p for p in by_prefix if "language_model" in p]
        if len(language) != 1:
            raise CkptScanError(f"attention tensors under several prefixes {sorted(by_prefix)}; map the ones to "
                                "scan with --tensor-map", path=path)
        return by_prefix[language[0]]
    return next(iter(by_prefix.values()))


def matched_prefix(pattern: re.Pattern[str], key: str) -> str:
    """The `prefix` group of a key `find_layers` found with `pattern`."""
    match = pattern.fullmatch(key)
    if match is None:
        raise ValueError(f"{key!r} is not a key that {pattern.pattern!r} found")
    return match.group("prefix")


def module_prefixes(found: Mapping[int, str], module: str) -> dict[int, str]:
    """layer -> the name prefix through `module` (`….layers.3.attention.`), under
    which a resolver finds the layer's other tensors."""
    return {i: name[: name.index(module) + len(module)] for i, name in found.items()}


def present(keys: set[str], name: str) -> str | None:
    """`name` if the checkpoint has that tensor (optional norms and biases), else None."""
    return name if name in keys else None
