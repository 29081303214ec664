"""A user's tensor map: regex -> role, for naming schemes ckptscan does not know.

A small TOML (or JSON) file replaces the resolvers, e.g. for GGUF-style names:

    q = 'blk\\.(\\d+)\\.attn_q\\.weight'       # one capture group: the layer
    k = 'blk\\.(\\d+)\\.attn_k\\.weight'
    q_norm = 'blk\\.(\\d+)\\.attn_q_norm\\.weight'   # optional, as k_norm
    router = 'blk\\.(\\d+)\\.ffn_gate_inp\\.weight'  # optional, as router_bias
    num_heads = 32                  # optional: flags > this file > config.json
    num_kv_heads = 8
    transpose = false               # weights stored [in, out] (Conv1D)
    norm_offset = 0.0               # 1.0 when the norm scales by (1 + w)

With `fused` the `q` pattern names one fused QKV weight and `k` is omitted:
"qkv" (blocks [Q | K | V], Phi-3/GPT-2), "grouped" (per KV group
[q·H/G | k | v], Megatron/Falcon), "per_head" (per head [q | k | v],
GPT-NeoX) or "grouped_gated" (Megatron with an output gate). Optional:
`family` (a label), `top_k`, `router_scoring` ("softmax" or "sigmoid").
Patterns must match whole tensor names. Every layer with a q tensor needs its
k tensor (and its norms, if those patterns are given); routers may be
missing in dense layers.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ckptscan.errors import CkptScanError
from ckptscan.layouts.base import HeadOverrides, ModelLayout, config_entry
from ckptscan.layouts.geometry import Geometry, HeadHints, fused_geometry, separate_geometry
from ckptscan.layouts.plan import QKTensors, RouterTensors, layer_plan, model_info
from ckptscan.readers.base import Checkpoint

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: JSON maps only
    tomllib = None

ROLES = ("q", "k", "q_norm", "k_norm", "router", "router_bias")
FUSED = {"qkv": "blocked", "grouped": "grouped", "per_head": "grouped", "grouped_gated": "grouped_gated"}
SETTINGS: dict[str, type | tuple[type, ...]] = {
    "fused": str, "transpose": bool, "norm_offset": (int, float), "num_heads": int, "num_kv_heads": int,
    "head_dim": int, "family": str, "top_k": int, "router_scoring": str}


@dataclass(frozen=True)
class TensorMap:
    path: Path
    patterns: dict[str, re.Pattern[str]]
    settings: dict[str, Any] = field(default_factory=dict)

    def resolve(self, ckpt: Checkpoint, keys: set[str], overrides: HeadOverrides) -> ModelLayout:
        """The checkpoint's layout as this map describes it."""
        by_role = {role: self._layers(role, keys) for role in self.patterns}
        queries = by_role["q"]
        if not queries:
            raise CkptScanError(f"the tensor map's q pattern {self.patterns['q'].pattern!r} matches no tensor",
                                path=ckpt.path)
        for role in ("k", "q_norm", "k_norm"):
            if role in by_role and (absent := sorted(set(queries) - set(by_role[role]))):
                raise CkptScanError(f"the tensor map's {role} pattern matches nothing in layers {absent}",
                                    path=ckpt.path)
        shape = ckpt.tensors.shape
        geometry = self._geometry(ckpt, queries, by_role.get("k", {}), overrides)
        fused = FUSED.get(self.settings.get("fused", ""))
        plans = []
        for layer in sorted(queries):
            qk = QKTensors(
                queries[layer],
                by_role.get("k", {}).get(layer),
                fused=fused,
                transposed=bool(self.settings.get("transpose", False)),
                q_norm=by_role.get("q_norm", {}).get(layer),
                k_norm=by_role.get("k_norm", {}).get(layer),
                gain_offset=float(self.settings.get("norm_offset", 0.0)),
            )
            router = by_role.get("router", {}).get(layer)
            bias = by_role.get("router_bias", {}).get(layer)
            if bias is not None and router is None:
                raise CkptScanError(f"layer {layer} has a router bias but no router", path=ckpt.path, tensor=bias)
            plans.append(layer_plan(layer, geometry, qk, RouterTensors(router, bias) if router else None, shape,
                                    ckpt.path, router_scoring=self.settings.get("router_scoring")))
        info = model_info(str(self.settings.get("family", "tensor-map")), geometry, plans, shape,
                          top_k=self.settings.get("top_k"), router_scoring=self.settings.get("router_scoring"))
        return ModelLayout(info, plans, [f"tensor map {self.path}", *geometry.notes])

    def _layers(self, role: str, keys: set[str]) -> dict[int, str]:
        found: dict[int, str] = {}
        for key in sorted(keys):
            match = self.patterns[role].fullmatch(key)
            if match:
                layer = int(match.group(1))
                if layer in found:
                    raise CkptScanError(f"the tensor map's {role} pattern matches both '{found[layer]}' and '{key}' "
                                        f"for layer {layer}", path=self.path)
                found[layer] = key
        return found

    def _geometry(self, ckpt: Checkpoint, queries: dict[int, str], keys_by_layer: dict[int, str],
                  overrides: HeadOverrides) -> Geometry:
        shape, config = ckpt.tensors.shape, ckpt.config

        def stated(name: str, *config_names: str) -> tuple[Any, str] | None:
            if name in self.settings:
                return self.settings[name], f"tensor map '{name}'"
            return config_entry(config, *config_names)

        hints = HeadHints.gather(
            overrides,
            num_heads=stated("num_heads", "num_attention_heads", "n_head"),
            num_kv_heads=stated("num_kv_heads", "num_key_value_heads", "num_kv_heads"),
            head_dim=stated("head_dim", "head_dim"),
            path=ckpt.path,
        )
        first = min(queries)
        q_name = queries[first]
        q_shape = tuple(shape(q_name))
        transpose = bool(self.settings.get("transpose", False))
        if len(q_shape) != 2:
            raise CkptScanError(f"expected a 2-D weight, not shape {list(q_shape)}", path=ckpt.path, tensor=q_name)
        looked = "neither the tensor map nor config.json states num_heads"
        fused = self.settings.get("fused")
        if fused is None:
            k_name = keys_by_layer[first]
            k_shape = tuple(shape(k_name))
            if transpose:
                q_shape, k_shape = q_shape[::-1], k_shape[::-1]
            return separate_geometry(hints, (q_name, q_shape), (k_name, k_shape), ckpt.path, looked=looked)
        rows, hidden = q_shape[::-1] if transpose else q_shape
        if fused == "per_head" and hints.num_heads is not None:
            if hints.num_kv_heads is not None and hints.num_kv_heads[0] != hints.num_heads[0]:
                raise CkptScanError("fused = \"per_head\" is multi-head: num_kv_heads must equal num_heads",
                                    path=self.path)
            hints = replace(hints, num_kv_heads=(hints.num_heads[0], "per_head layout (KV heads = heads)"))
        return fused_geometry(hints, q_name, rows, hidden, FUSED[fused], ckpt.path, looked=looked)


def load_tensor_map(path: str | Path) -> TensorMap:
    """Parse and validate a tensor map file (.toml or .json)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise CkptScanError(f"cannot read the tensor map: {e.strerror or e}", path=path) from None
    if path.suffix != ".json" and tomllib is None:
        raise CkptScanError("TOML tensor maps need Python 3.11 or newer; write the map as .json", path=path)
    try:
        data = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except ValueError as e:  # JSONDecodeError and TOMLDecodeError both are
        raise CkptScanError(f"invalid tensor map ({e})", path=path) from None
    if not isinstance(data, dict):
        raise CkptScanError("a tensor map is a table of role = 'regex' entries", path=path)
    unknown = sorted(set(data) - set(ROLES) - set(SETTINGS))
    if unknown:
        raise CkptScanError(f"unknown tensor map entries {unknown}; roles are {', '.join(ROLES)} and settings "
                            f"{', '.join(SETTINGS)}", path=path)
    patterns = {}
    for role in ROLES:
        if role not in data:
            continue
        try:
            pattern = re.compile(data[role]) if isinstance(data[role], str) else None
        except re.error as e:
            raise CkptScanError(f"tensor map {role}: invalid regex ({e})", path=path) from None
        if pattern is None or pattern.groups != 1:
            raise CkptScanError(f"tensor map {role} must be a regex with one capture group (the layer number)",
                                path=path)
        patterns[role] = pattern
    settings = {name: data[name] for name in SETTINGS if name in data}
    for name, value in settings.items():
        kind = SETTINGS[name]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise CkptScanError(f"tensor map {name} has the wrong type: {value!r}", path=path)
    if "q" not in patterns:
        raise CkptScanError("a tensor map needs a q pattern", path=path)
    fused = settings.get("fused")
    if fused is not None and fused not in FUSED:
        raise CkptScanError(f"tensor map fused must be one of {', '.join(FUSED)}, not {fused!r}", path=path)
    if (fused is None) != ("k" in patterns):
        raise CkptScanError("a tensor map needs a k pattern unless q is fused (and none when it is)", path=path)
    if settings.get("router_scoring") not in (None, "softmax", "sigmoid"):
        raise CkptScanError("tensor map router_scoring must be 'softmax' or 'sigmoid'", path=path)
    return TensorMap(path, patterns, settings)
