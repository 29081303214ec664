"""Attention monitors: spectra of the QK-product increment through small cores.

For query head h and its KV head g (GQA: g = h // (H/G)) the attention score
is x_iᵀ M_h x_j with M_h = Q_hᵀ K_g (d × d, rank ≤ r). Between checkpoints a
(base) and b:

    Δ1 = Q_bᵀK_b − Q_aᵀK_a = Δ2 + Δ3
    Δ2 = ΔQᵀK_a + Q_aᵀΔK        first-order term, the early signal
    Δ3 = ΔQᵀΔK                   second-order term

Every one of them is a product AᵀB of two thin (k × d) factors, and the
non-zero singular values of AᵀB are those of a k × k core built from the Grams
AAᵀ and BBᵀ (`product_singular_values`). So the only O(d) work is a handful of
batched r × d × r Gram products per head; no d × d matrix is ever formed.

The Grams are taken in `compute_dtype` (float32 is fast and accurate enough
for entropies; float64 is the exact path); every core and eigenvalue problem
is solved in float64, because the cores are tiny and a float32 eigen solve
would lose ~1e-4 relative on entropies.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_F64 = torch.float64


@dataclass
class QKGrams:
    """Per-checkpoint Gram blocks of one layer: exact to reuse across pairs."""

    qq: torch.Tensor  # [H, r, r]  Q_h Q_hᵀ
    kk: torch.Tensor  # [G, r, r]  K_g K_gᵀ


@dataclass
class QKSpectra:
    """Singular values per query head (float64), largest first, and norms."""

    delta1: torch.Tensor  # [H, min(2r, d)]
    delta2: torch.Tensor  # [H, min(2r, d)]
    delta3: torch.Tensor  # [H, min(r, d)]
    dwq: torch.Tensor  # [H, min(r, d)]  σ(ΔQ_h)
    dwk: torch.Tensor  # [G, min(r, d)]  σ(ΔK_g)
    dwq_rel_norm: float  # ‖ΔW_q‖_F / ‖W_q(a)‖_F over the layer
    dwk_rel_norm: float
    q_spectral_norm: torch.Tensor  # [H] ‖Q_h‖₂ at b
    q_spectral_norm_base: torch.Tensor  # [H] ‖Q_h‖₂ at a
    qk_logit_bound: torch.Tensor  # [H] σ_max(Q_hᵀK_g) at b

    @property
    def delta2_rank(self) -> int:
        return self.delta2.shape[-1]


def kv_head_index(num_heads: int, num_kv_heads: int) -> torch.Tensor:
    """KV head of each query head, g = h // (H/G), as `repeat_kv` lays them out."""
    if num_kv_heads < 1 or num_heads % num_kv_heads:
        raise ValueError(f"{num_heads} query heads cannot be grouped over {num_kv_heads} KV heads")
    return torch.arange(num_heads) // (num_heads // num_kv_heads)


def fold_head_gains(weight: torch.Tensor, gain: torch.Tensor) -> torch.Tensor:
    """Multiply the rows of each head block [n, r, d] by a norm gain.

    `gain` is per head ([r], shared by all heads: Qwen3/Gemma3 `q_norm`) or
    flat over the projection ([n·r] or [n, r]: OLMo2/OLMoE). The per-token
    1/rms factor is a scalar per token and does not change the spectrum shape.
    """
    n, r, _ = weight.shape
    if gain.numel() == r:
        scale = gain.reshape(1, r)
    elif gain.numel() == n * r:
        scale = gain.reshape(n, r)
    else:
        raise ValueError(f"norm gain of {gain.numel()} values fits neither {r} nor {n}x{r}")
    return weight * scale.to(weight.dtype).unsqueeze(-1)


def qk_grams(q: torch.Tensor, k: torch.Tensor, compute_dtype: torch.dtype = torch.float32) -> QKGrams:
    """Q_hQ_hᵀ and K_gK_gᵀ of one checkpoint's layer, q: [H, r, d], k: [G, r, d]."""
    q = q.to(compute_dtype)
    k = k.to(compute_dtype)
    return QKGrams(qq=_gram(q, q), kk=_gram(k, k))


def qk_spectra(
    q_a: torch.Tensor,
    k_a: torch.Tensor,
    q_b: torch.Tensor,
    k_b: torch.Tensor,
    *,
    compute_dtype: torch.dtype = torch.float32,
    grams_a: QKGrams | None = None,
    grams_b: QKGrams | None = None,
) -> QKSpectra:
    """Every QK spectrum of one layer between checkpoints a and b.

    q_*: [H, r, d] query head blocks, k_*: [G, r, d] key head blocks, in any
    dtype (norm gains already folded). Differences are taken in
    `compute_dtype`, never in the stored low precision. `grams_a`/`grams_b`
    are the checkpoints' own `qk_grams`, passed in when a run reuses them.
    """
    num_heads, r, d = q_a.shape
    kv = kv_head_index(num_heads, k_a.shape[0])
    dq = _difference(q_b, q_a, compute_dtype)
    dk = _difference(k_b, k_a, compute_dtype)
    q_a, k_a = q_a.to(compute_dtype), k_a.to(compute_dtype)
    grams_a = grams_a or qk_grams(q_a, k_a, compute_dtype)
    grams_b = grams_b or qk_grams(q_b, k_b, compute_dtype)

    dqdq, dq_q = _gram(dq, dq), _gram(dq, q_a)  # ΔQΔQᵀ, ΔQ Q_aᵀ
    dkdk, dk_k = _gram(dk, dk), _gram(dk, k_a)  # ΔKΔKᵀ, ΔK K_aᵀ
    qq_a, kk_a, kk_b = grams_a.qq, grams_a.kk, grams_b.kk

    # Expand key-side blocks to query heads once: [G, …] -> [H, …].
    dkdk_h, dk_k_h, kk_a_h, kk_b_h = dkdk[kv], dk_k[kv], kk_a[kv], kk_b[kv]

    # Balance the two blocks of each factor (monitors.md, "numerical trap"):
    # ‖ΔQ‖ can be 1e-6 of ‖Q‖, and an unbalanced Gram would bury the small
    # block in rounding error. With A = [αΔQ; βQ], B = [K/α; ΔK/β] the
    # product AᵀB is unchanged and each term's factors have equal norms.
    norm_dq, norm_q = _block_norm(dqdq), _block_norm(qq_a)
    norm_dk, norm_k = _block_norm(dkdk_h), _block_norm(kk_a_h)
    alpha = _balance(norm_k, norm_dq)
    beta = _balance(norm_dk, norm_q)
    ab = (alpha * beta)[:, None, None]
    a2, b2 = (alpha**2)[:, None, None], (beta**2)[:, None, None]

    gram_a = _blocks(a2 * dqdq, ab * dq_q, b2 * qq_a)  # A = [αΔQ; βQ_a]
    # Δ2: B = [K_a/α; ΔK/β]. Δ1 = ΔQᵀK_b + Q_aᵀΔK: B = [K_b/α; ΔK/β], with
    # K_b ΔKᵀ = K_aΔKᵀ + ΔKΔKᵀ from the same blocks.
    k_dk = dk_k_h.transpose(-1, -2)
    gram_b2 = _blocks(kk_a_h / a2, k_dk / ab, dkdk_h / b2)
    gram_b1 = _blocks(kk_b_h / a2, (k_dk + dkdk_h) / ab, dkdk_h / b2)

    core_rank = min(2 * r, d)
    factor_a = _gram_factor(gram_a)
    head_rank = min(r, d)
    return QKSpectra(
        delta1=_factored_product_sv(factor_a, gram_b1, core_rank),
        delta2=_factored_product_sv(factor_a, gram_b2, core_rank),
        delta3=product_singular_values(dqdq, dkdk_h, head_rank),
        dwq=_gram_sv(dqdq, head_rank),
        dwk=_gram_sv(dkdk, head_rank),
        dwq_rel_norm=_relative_norm(dqdq, qq_a),
        dwk_rel_norm=_relative_norm(dkdk, kk_a),
        q_spectral_norm=_gram_sv(grams_b.qq, 1)[:, 0],
        q_spectral_norm_base=_gram_sv(qq_a, 1)[:, 0],
        qk_logit_bound=product_singular_values(grams_b.qq, kk_b_h, 1)[:, 0],
    )


def product_singular_values(gram_a: torch.Tensor, gram_b: torch.Tensor, rank: int) -> torch.Tensor:
    """Top `rank` singular values of AᵀB from G_A = AAᵀ and G_B = BBᵀ ([…, k, k]).

    σ(AᵀB)² = eig(G_A G_B) = eig(Lᵀ G_B L) for any factor G_A = L Lᵀ; the
    symmetric form keeps the eigenproblem well posed. Solved in float64.
    """
    return _factored_product_sv(_gram_factor(gram_a), gram_b, rank)


def _difference(new: torch.Tensor, old: torch.Tensor, compute_dtype: torch.dtype) -> torch.Tensor:
    wide = torch.promote_types(torch.promote_types(new.dtype, old.dtype), compute_dtype)
    return (new.to(wide) - old.to(wide)).to(compute_dtype)


def _gram(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (x @ y.transpose(-1, -2)).to(_F64)


def _blocks(top_left: torch.Tensor, top_right: torch.Tensor, bottom_right: torch.Tensor) -> torch.Tensor:
    """The symmetric 2×2 block matrix [[TL, TR], [TRᵀ, BR]]."""
    top = torch.cat([top_left, top_right], dim=-1)
    bottom = torch.cat([top_right.transpose(-1, -2), bottom_right], dim=-1)
    return torch.cat([top, bottom], dim=-2)


def _block_norm(gram: torch.Tensor) -> torch.Tensor:
    """Frobenius norm of the factor behind a Gram block: sqrt(trace)."""
    return torch.diagonal(gram, dim1=-2, dim2=-1).sum(-1).clamp_min(0).sqrt()


def _balance(numerator: torch.Tensor, denominator: torch.Tensor) -> torch.Tensor:
    """sqrt(numerator / denominator), or 1 where either side is zero."""
    ok = (numerator > 0) & (denominator > 0)
    ratio = numerator / torch.where(ok, denominator, torch.ones_like(denominator))
    return torch.where(ok, ratio.sqrt(), torch.ones_like(ratio))


def _gram_factor(gram: torch.Tensor) -> torch.Tensor:
    """A factor L with G = L Lᵀ: Cholesky where G is positive definite,
    an eigendecomposition square root where it is not (ΔQ = 0, r > d)."""
    factor, info = torch.linalg.cholesky_ex(gram)
    singular = info != 0
    if bool(singular.any()):
        evals, evecs = torch.linalg.eigh(gram[singular])
        factor = factor.clone()
        factor[singular] = evecs * evals.clamp_min(0).sqrt().unsqueeze(-2)
    return factor


def _factored_product_sv(factor_a: torch.Tensor, gram_b: torch.Tensor, rank: int) -> torch.Tensor:
    core = factor_a.transpose(-1, -2) @ gram_b @ factor_a
    core = 0.5 * (core + core.transpose(-1, -2))
    evals = torch.linalg.eigvalsh(core)  # ascending
    return evals.flip(-1)[..., :rank].clamp_min(0).sqrt()


def _gram_sv(gram: torch.Tensor, rank: int) -> torch.Tensor:
    evals = torch.linalg.eigvalsh(gram)
    return evals.flip(-1)[..., :rank].clamp_min(0).sqrt()


def _relative_norm(delta_gram: torch.Tensor, base_gram: torch.Tensor) -> float:
    delta = _block_norm(delta_gram).square().sum().sqrt()
    base = _block_norm(base_gram).square().sum().sqrt()
    return float(delta / base) if base > 0 else float("inf")
