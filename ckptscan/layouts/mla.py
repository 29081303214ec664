"""Multi-head latent attention (DeepSeek-V2/V3): per-head Q/K from low-rank factors.

With dn = qk_nope_head_dim, dr = qk_rope_head_dim, dv = v_head_dim and the
LoRA ranks rq (query) and rkv (key/value), the weights are (TF
`deepseek_v3/modeling_deepseek_v3.py`, torchtitan `deepseek_v3`):

    q_a_proj [rq, D] -> q_a_layernorm [rq] -> q_b_proj [H(dn+dr), rq]
        (or one q_proj [H(dn+dr), D] when q_lora_rank is null: V2-Lite)
    kv_a_proj_with_mqa [rkv+dr, D]: rows [0:rkv] the latent, which goes
        through kv_a_layernorm [rkv] and kv_b_proj [H(dn+dv), rkv];
        rows [rkv:] one rope key shared by every head
    head h: rows h(dn+dr)+[0:dn] (nope) and +[dn:dn+dr] (rope) of the query,
        rows h(dn+dv)+[0:dn] (k_nope) and +[dn:dn+dv] (v) of kv_b_proj

The content ("nope") part of head h is Q_h = q_b[h, nope] · diag(γ_q) · q_a
and K_h = kv_b[h, k_nope] · diag(γ_kv) · kv_a[:rkv]; every head has its own
key (G = H). The rope part, q_b[h, rope] · diag(γ_q) · q_a against the
shared kv_a[rkv:], is a separate one-KV-head term (`rope_q`, `rope_k`).

Given H, the shapes fix every other dimension (rkv from the kv_a norm, dr =
kv_a rows − rkv, dn + dr = query rows / H, dn + dv = kv_b rows / H); a config
that states them must agree. The products are formed in float64, so that two
checkpoints' blocks difference exactly however small the update.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

import torch

from ckptscan.errors import CkptScanError
from ckptscan.layouts.base import Builder, LayerPlan, LayerWeights, require_shape
from ckptscan.layouts.geometry import Geometry, HeadHints, missing
from ckptscan.layouts.plan import RouterTensors

_F64 = torch.float64


@dataclass(frozen=True)
class MLATensors:
    kv_a: str
    kv_a_norm: str
    kv_b: str
    q: str | None = None  # no query LoRA (V2-Lite)
    q_a: str | None = None
    q_a_norm: str | None = None
    q_b: str | None = None

    @property
    def query(self) -> str:
        """The query's up-projection: q_b with a query LoRA, else q."""
        name = self.q_b or self.q
        if name is None:
            raise ValueError("MLATensors names neither q nor q_b")
        return name

    @property
    def lora(self) -> tuple[str, str, str] | None:
        """(q_a, q_a_norm, q_b) of a query LoRA; None without one (q: V2-Lite)."""
        if self.q_b is None:
            return None
        if self.q_a is None or self.q_a_norm is None:
            raise ValueError("MLATensors names q_b without q_a and q_a_norm")
        return self.q_a, self.q_a_norm, self.q_b


@dataclass(frozen=True)
class MLAGeometry:
    hidden_size: int
    num_heads: int
    nope: int
    rope: int
    value: int
    kv_rank: int
    q_rank: int | None
    notes: tuple[str, ...]

    def heads(self) -> Geometry:
        """The head shape a report states: every head has its own content key
        (G = H), and head_dim is the content ("nope") part."""
        return Geometry(self.hidden_size, self.num_heads, self.num_heads, self.nope, self.notes)


def mla_geometry(
    hints: HeadHints,
    tensors: MLATensors,
    shape: Callable[[str], tuple[int, ...]],
    stated: Mapping[str, tuple[Any, str] | None],
    path: Any,
    looked: str,
) -> MLAGeometry:
    """Dimensions from H and the shapes; `stated` (qk_nope_head_dim, qk_rope_head_dim,
    v_head_dim, kv_lora_rank, q_lora_rank) are checked against them."""
    if hints.num_heads is None:
        raise missing("the number of query heads", "--num-heads", path, looked)
    num_heads, heads_from = hints.num_heads
    kv_a, kv_norm, kv_b, query = (tuple(shape(n)) for n in (tensors.kv_a, tensors.kv_a_norm, tensors.kv_b,
                                                             tensors.query))
    if len(kv_norm) != 1 or len(kv_a) != 2 or kv_a[0] <= kv_norm[0]:
        raise CkptScanError(f"kv_a {list(kv_a)} and its norm {list(kv_norm)} are not [rkv+dr, D] and [rkv]",
                            path=path, tensor=tensors.kv_a)
    kv_rank, hidden = kv_norm[0], kv_a[1]
    rope = kv_a[0] - kv_rank
    if query[0] % num_heads or kv_b[0] % num_heads:
        raise CkptScanError(f"query rows {query[0]} or kv_b rows {kv_b[0]} do not split into {num_heads} heads "
                            f"({heads_from})", path=path, tensor=tensors.query)
    nope = query[0] // num_heads - rope
    value = kv_b[0] // num_heads - nope
    if nope < 1 or value < 1:
        raise CkptScanError(f"{num_heads} heads ({heads_from}) leave no content dims: query head "
                            f"{query[0] // num_heads} rows, rope {rope}", path=path, tensor=tensors.query)
    q_rank = None
    lora = tensors.lora
    if lora is not None:
        q_a, q_a_norm, q_b = lora
        q_norm = tuple(shape(q_a_norm))
        q_rank = q_norm[0] if len(q_norm) == 1 else -1
        require_shape(shape(q_a), (q_rank, hidden), tensor=q_a, path=path,
                      why=f"q_lora_rank {q_rank} (its norm) and hidden {hidden}")
        require_shape(query, (num_heads * (nope + rope), q_rank), tensor=q_b, path=path,
                      why=f"{num_heads} heads of {nope}+{rope} rows and q_lora_rank {q_rank}")
    else:
        require_shape(query, (num_heads * (nope + rope), hidden), tensor=tensors.query, path=path,
                      why=f"{num_heads} heads of {nope}+{rope} rows and hidden {hidden}")
    require_shape(kv_b, (num_heads * (nope + value), kv_rank), tensor=tensors.kv_b, path=path,
                  why=f"{num_heads} heads of {nope}+{value} rows and kv_lora_rank {kv_rank}")
    derived = {"qk_nope_head_dim": nope, "qk_rope_head_dim": rope, "v_head_dim": value, "kv_lora_rank": kv_rank,
               "q_lora_rank": q_rank}
    for name, entry in stated.items():
        if entry is not None and entry[0] != derived[name]:
            raise CkptScanError(f"{entry[1]} is {entry[0]} but the tensor shapes give {derived[name]}", path=path,
                                tensor=tensors.kv_b)
    notes = (f"query heads {num_heads}: {heads_from}; every head has its own content key (MLA)",
             f"MLA dims from the shapes: nope {nope}, rope {rope} (shared rope key), v {value}, kv_lora_rank "
             f"{kv_rank}, q_lora_rank {q_rank}")
    return MLAGeometry(hidden, num_heads, nope, rope, value, kv_rank, q_rank, notes)


def mla_plan(
    layer: int,
    geometry: MLAGeometry,
    tensors: MLATensors,
    router: RouterTensors | None,
    shape: Callable[[str], tuple[int, ...]],
    path: Any,
    router_scoring: str | None,
) -> LayerPlan:
    """Validate one MLA layer's shapes and return its plan."""
    g = geometry
    expected: dict[str, tuple[int, ...]] = {
        tensors.kv_a: (g.kv_rank + g.rope, g.hidden_size),
        tensors.kv_a_norm: (g.kv_rank,),
        tensors.kv_b: (g.num_heads * (g.nope + g.value), g.kv_rank),
    }
    lora = tensors.lora
    if lora is not None:
        q_a, q_a_norm, q_b = lora
        if g.q_rank is None:
            raise CkptScanError("a query LoRA in this layer, but none in layer 0 (q_proj there)", path=path,
                                tensor=q_b)
        expected.update({q_a: (g.q_rank, g.hidden_size), q_a_norm: (g.q_rank,),
                         q_b: (g.num_heads * (g.nope + g.rope), g.q_rank)})
        roles = {q_a: "W_q_a", q_a_norm: "q_a_norm", q_b: "W_q_b"}
    else:
        expected[tensors.query] = (g.num_heads * (g.nope + g.rope), g.hidden_size)
        roles = {tensors.query: "W_q"}
    roles.update({tensors.kv_a: "W_kv_a", tensors.kv_a_norm: "kv_a_norm", tensors.kv_b: "W_kv_b"})
    for name, want in expected.items():
        require_shape(shape(name), want, tensor=name, path=path, why="the layer-0 MLA geometry")
    experts = None
    if router is not None:
        experts = shape(router.weight)[0]
        require_shape(shape(router.weight), (experts, g.hidden_size), tensor=router.weight, path=path,
                      why=f"hidden {g.hidden_size}")
        roles[router.weight] = "router"
        if router.bias is not None:
            require_shape(shape(router.bias), (experts,), tensor=router.bias, path=path, why=f"{experts} experts")
            roles[router.bias] = "router_bias"
    query_lora = None if lora is None or g.q_rank is None else (*lora, g.q_rank)
    return LayerPlan(layer, tuple(roles), _builder(g, tensors, query_lora, router, router_scoring), roles)


def _builder(g: MLAGeometry, t: MLATensors, lora: tuple[str, str, str, int] | None, router: RouterTensors | None,
             scoring: str | None) -> Builder:
    """`lora`: (q_a, q_a_norm, q_b, q_lora_rank) of a query LoRA, None without one."""

    def build(raw: Mapping[str, torch.Tensor], dtype: torch.dtype) -> LayerWeights:
        if lora is not None:
            q_a, q_a_norm, q_b, q_rank = lora
            latent = raw[q_a].to(_F64) * raw[q_a_norm].to(_F64)[:, None]  # diag(γ_q) q_a  [rq, D]
            query = raw[q_b].to(_F64).reshape(g.num_heads, g.nope + g.rope, q_rank) @ latent
        else:
            query = raw[t.query].to(_F64).reshape(g.num_heads, g.nope + g.rope, g.hidden_size)
        kv_a = raw[t.kv_a].to(_F64)
        kv_latent = kv_a[: g.kv_rank] * raw[t.kv_a_norm].to(_F64)[:, None]  # diag(γ_kv) kv_a[:rkv]
        k_up = raw[t.kv_b].to(_F64).reshape(g.num_heads, g.nope + g.value, g.kv_rank)[:, : g.nope]
        weights = LayerWeights(
            q=query[:, : g.nope],
            k=k_up @ kv_latent,
            rope_q=query[:, g.nope :],
            rope_k=kv_a[g.kv_rank :].unsqueeze(0),
        )
        if scoring is not None:
            weights.router_scoring = scoring
        if router is not None:
            weights.router = raw[router.weight].to(dtype)
            weights.router_bias = raw[router.bias].to(dtype) if router.bias is not None else None
        return weights

    return build
