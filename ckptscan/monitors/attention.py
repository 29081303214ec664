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
Δ1 is evaluated as ΔQᵀK_b + Q_aᵀΔK, which is algebraically identical and free
of the cancellation in Q_bᵀK_b − Q_aᵀK_a.

Precision
---------
Differences ΔQ, ΔK are taken in a dtype that holds both checkpoints' values
exactly (the promotion of the stored dtype and `compute_dtype`), then cast to
`compute_dtype`; so ΔQ is accurate to the unit roundoff of `compute_dtype`
relative to ΔQ itself, however small the update. Each Gram block (ΔQΔQᵀ,
ΔQQᵀ, QQᵀ, …) is a separate product, accurate relative to its own scale, and
the two blocks of each factor are balanced (monitors.md, "numerical trap")
before the blocks are assembled in float64. Every core, factorisation and
eigenvalue problem is solved in float64.

The remaining error is the rounding of the Gram products in `compute_dtype`,
u·|x||y| per entry with u its unit roundoff times an accumulation factor.
A Gram (squared) method sees σ², so that rounding lands on the eigenvalues σ²
of the cores as an *absolute* error of order c·u·σ_max² (c ≈ 1–20 measured
for d up to 4096), not as a relative error on each σ:

* float64 (u = 1.1e-16), the exact path: every singular value within
  1e-6·σ_max of a dense float64 SVD and every σ ≥ 1e-3·σ_max within 1e-6
  relative; entropies within 1e-6 relative (tests/monitors; measured ~1e-12
  and better).
* float32 (u = 6.0e-8), the default and about 2× faster: the guaranteed (and
  tested) bound is |σ̂_i² − σ_i²| ≤ 1e-5·σ_max² per head, ≈ 170·u, which
  leaves room for the accumulation factor of long (d ≥ 4096) dot products
  (measured ≤ 7e-7 on random layers, 7e-8 at the Llama-7B shape). So σ_max is within 5e-6 relative, any σ within
  1e-5·σ_max²/σ (σ ≥ 0.1·σ_max: 1e-3 relative), Frobenius norm within 1e-5 and
  stable rank within 3e-5 relative, and the entropy within its first-order
  propagation Σ_i 2τ_p(1 + ln 1/p_i), τ_p = 1e-5·σ_max²/Σσ² (≈ 2e-5 relative
  for a flat spectrum). Small singular values are not relatively accurate: a
  true zero (Δ3 or ΔW of a rank-1 update) comes back as ≈ √(c·u)·σ_max, the
  floor of any Gram method in float32, and that spurious energy share is what
  moves a near-zero entropy (≈ 7e-6 for a rank-1 ΔQ_h with r = 128). Use
  compute_dtype=float64 when small singular values themselves matter.

RoPE is not applied: the monitors use the content form M_h, as the paper does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ckptscan.monitors.spectral import gram_singular_values

_F64 = torch.float64


@dataclass
class QKGrams:
    """Per-checkpoint Gram blocks of one layer: exact to reuse across pairs."""

    qq: torch.Tensor  # [H, r, r]  Q_h Q_hᵀ
    kk: torch.Tensor  # [G, r, r]  K_g K_gᵀ


@dataclass
class QKSpectra:
    """Singular values per query head (float64), largest first, and norms.

    A head whose inputs hold non-finite values gets NaN everywhere (never a
    finite-looking spectrum computed from garbage).
    """

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
    # cos(W(a), W(b)) of the layer's whole W_q (W_k): ⟨W_a, W_b⟩ / (‖W_a‖‖W_b‖).
    # Two checkpoints of one run stay related however large the update;
    # unrelated weights give ≈ 0 (detection/provenance.py).
    q_cosine: float = float("nan")
    k_cosine: float = float("nan")

    @property
    def delta2_rank(self) -> int:
        return self.delta2.shape[-1]


def kv_head_index(num_heads: int, num_kv_heads: int) -> torch.Tensor:
    """KV head of each query head, g = h // (H/G), as `repeat_kv` lays them out."""
    if num_kv_heads < 1 or num_heads % num_kv_heads:
        raise ValueError(f"{num_heads} query heads cannot be grouped over {num_kv_heads} KV heads")
    return torch.arange(num_heads) // (num_heads // num_kv_heads)


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
    kv_index: torch.Tensor | None = None,
) -> QKSpectra:
    """Every QK spectrum of one layer between checkpoints a and b.

    q_*: [H, r, d] query head blocks, k_*: [G, r, d] key head blocks, in any
    dtype (norm gains already folded). Differences are taken without rounding
    (see the module docstring), never in the stored low precision.
    `grams_a`/`grams_b` are the checkpoints' own `qk_grams`, passed in when a
    run reuses them; without `grams_b` its blocks are assembled from the
    difference blocks (Q_bQ_bᵀ = QQᵀ + ΔQQᵀ + QΔQᵀ + ΔQΔQᵀ), which saves two
    Gram products. `kv_index` [H] maps each query head to its row in k_*
    when the heads are a selection (`--heads`) rather than all of them.
    """
    num_heads, r, d = q_a.shape
    num_kv = k_a.shape[0]
    if q_b.shape != q_a.shape or k_b.shape != k_a.shape or tuple(k_a.shape[1:]) != (r, d):
        raise ValueError(f"inconsistent head blocks: q {tuple(q_a.shape)}/{tuple(q_b.shape)}, "
                         f"k {tuple(k_a.shape)}/{tuple(k_b.shape)}")
    kv = kv_head_index(num_heads, num_kv) if kv_index is None else kv_index
    dq = _difference(q_b, q_a, compute_dtype)
    dk = _difference(k_b, k_a, compute_dtype)
    qa, ka = q_a.to(compute_dtype), k_a.to(compute_dtype)
    if grams_a is None:
        grams_a = qk_grams(qa, ka, compute_dtype)
    qq_a, kk_a = grams_a.qq.to(_F64), grams_a.kk.to(_F64)

    dqdq, dq_q = _gram(dq, dq), _gram(dq, qa)  # ΔQΔQᵀ, ΔQ Q_aᵀ
    dkdk, dk_k = _gram(dk, dk), _gram(dk, ka)  # ΔKΔKᵀ, ΔK K_aᵀ
    if grams_b is None:
        qq_b = qq_a + dq_q + dq_q.transpose(-1, -2) + dqdq
        kk_b = kk_a + dk_k + dk_k.transpose(-1, -2) + dkdk
    else:
        qq_b, kk_b = grams_b.qq.to(_F64), grams_b.kk.to(_F64)

    # Heads with non-finite inputs: solve on zeros, report NaN (LAPACK returns
    # finite garbage for NaN input rather than failing). A non-finite entry of
    # a factor shows on the diagonal of its Gram, and finite diagonals bound
    # every other entry (Cauchy–Schwarz), so the traces are a complete check.
    bad_q = ~torch.isfinite(_trace(dqdq) + _trace(qq_a) + _trace(qq_b))
    bad_k = ~torch.isfinite(_trace(dkdk) + _trace(kk_a) + _trace(kk_b))
    dqdq, dq_q, qq_a, qq_b = (_zero_where(bad_q, x) for x in (dqdq, dq_q, qq_a, qq_b))
    dkdk, dk_k, kk_a, kk_b = (_zero_where(bad_k, x) for x in (dkdk, dk_k, kk_a, kk_b))
    bad_h = bad_q | bad_k[kv]

    # Expand key-side blocks to query heads once: [G, …] -> [H, …].
    if kv_index is None and num_kv == num_heads:  # MHA: g = h
        dkdk_h, dk_k_h, kk_a_h, kk_b_h = dkdk, dk_k, kk_a, kk_b
    else:
        dkdk_h, dk_k_h, kk_a_h, kk_b_h = dkdk[kv], dk_k[kv], kk_a[kv], kk_b[kv]

    # Balance the two blocks of each factor (monitors.md, "numerical trap"):
    # ‖ΔQ‖ can be 1e-6 of ‖Q‖, and an unbalanced Gram would bury the small
    # block in rounding error. A = [αΔQ; βQ_a], B = [K/α; ΔK/β] keeps AᵀB and
    # gives each term's two factors equal norms: α = √(‖K‖/‖ΔQ‖),
    # β = √(‖ΔK‖/‖Q‖). A term whose update is exactly zero is dropped exactly
    # (its partner block set to 0) instead of being kept at an arbitrary scale.
    norm_dq, norm_q = _block_norm(dqdq), _block_norm(qq_a)
    norm_dk, norm_k = _block_norm(dkdk_h), _block_norm(kk_a_h)
    alpha = _balance(norm_k, norm_dq)
    beta = _balance(norm_dk, norm_q)
    s_dq = alpha  # A block αΔQ (zero anyway when ΔQ = 0)
    s_q = torch.where(norm_dk > 0, beta, torch.zeros_like(beta))  # A block βQ_a
    s_k = torch.where(norm_dq > 0, 1 / alpha, torch.zeros_like(alpha))  # B block K/α
    s_dk = 1 / beta  # B block ΔK/β

    gram_a = _blocks(dqdq, dq_q, qq_a, s_dq, s_q)  # A = [αΔQ; βQ_a]
    # Δ2: B = [K_a/α; ΔK/β]. Δ1 = ΔQᵀK_b + Q_aᵀΔK: B = [K_b/α; ΔK/β], with
    # K_bΔKᵀ = K_aΔKᵀ + ΔKΔKᵀ from the same blocks.
    k_dk = dk_k_h.transpose(-1, -2)
    gram_b2 = _blocks(kk_a_h, k_dk, dkdk_h, s_k, s_dk)
    gram_b1 = _blocks(kk_b_h, k_dk + dkdk_h, dkdk_h, s_k, s_dk)

    core_rank = min(2 * r, d)
    head_rank = min(r, d)
    factor_a = _gram_factor(gram_a)
    delta1 = _factored_product_sv(factor_a, gram_b1, core_rank)
    delta2 = _factored_product_sv(factor_a, gram_b2, core_rank)
    delta3 = product_singular_values(dqdq, dkdk_h, head_rank)
    dwq = gram_singular_values(dqdq, head_rank)
    dwk = gram_singular_values(dkdk, head_rank)
    q_norm_b = gram_singular_values(qq_b, 1)[:, 0]
    q_norm_a = gram_singular_values(qq_a, 1)[:, 0]
    logit_bound = product_singular_values(qq_b, kk_b_h, 1)[:, 0]

    nan = float("nan")
    return QKSpectra(
        delta1=_nan_where(bad_h, delta1),
        delta2=_nan_where(bad_h, delta2),
        delta3=_nan_where(bad_h, delta3),
        dwq=_nan_where(bad_q, dwq),
        dwk=_nan_where(bad_k, dwk),
        dwq_rel_norm=nan if bool(bad_q.any()) else _relative_norm(dqdq, qq_a),
        dwk_rel_norm=nan if bool(bad_k.any()) else _relative_norm(dkdk, kk_a),
        q_spectral_norm=_nan_where(bad_q, q_norm_b),
        q_spectral_norm_base=_nan_where(bad_q, q_norm_a),
        qk_logit_bound=_nan_where(bad_h, logit_bound),
        q_cosine=nan if bool(bad_q.any()) else _cosine(qq_a, dq_q, qq_b),
        k_cosine=nan if bool(bad_k.any()) else _cosine(kk_a, dk_k, kk_b),
    )


def product_singular_values(gram_a: torch.Tensor, gram_b: torch.Tensor, rank: int) -> torch.Tensor:
    """Top `rank` singular values of AᵀB from G_A = AAᵀ and G_B = BBᵀ ([…, k, k]).

    σ(AᵀB)² = eig(G_A G_B) = eig(Lᵀ G_B L) for any factor G_A = L Lᵀ; the
    symmetric form keeps the eigenproblem well posed. Solved in float64.
    """
    return _factored_product_sv(_gram_factor(gram_a.to(_F64)), gram_b.to(_F64), rank)


def _difference(new: torch.Tensor, old: torch.Tensor, compute_dtype: torch.dtype) -> torch.Tensor:
    """new − old without rounding the operands: in a dtype that holds both."""
    wide = torch.promote_types(torch.promote_types(new.dtype, old.dtype), compute_dtype)
    return (new.to(wide) - old.to(wide)).to(compute_dtype)


def _gram(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (x @ y.transpose(-1, -2)).to(_F64)


def _trace(gram: torch.Tensor) -> torch.Tensor:
    return torch.diagonal(gram, dim1=-2, dim2=-1).sum(-1)


def _zero_where(mask: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    return torch.where(mask[:, None, None], torch.zeros_like(x), x) if bool(mask.any()) else x


def _nan_where(mask: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    if not bool(mask.any()):
        return x
    shape = (-1,) + (1,) * (x.dim() - 1)
    return torch.where(mask.reshape(shape), torch.full_like(x, float("nan")), x)


def _blocks(
    top_left: torch.Tensor,
    top_right: torch.Tensor,
    bottom_right: torch.Tensor,
    scale_top: torch.Tensor,
    scale_bottom: torch.Tensor,
) -> torch.Tensor:
    """Gram of the stacked factor [s_t·X; s_b·Y] from XXᵀ, XYᵀ, YYᵀ ([n, k, k]
    blocks, per-batch scales [n]): [[s_t² XXᵀ, s_t s_b XYᵀ], [·ᵀ, s_b² YYᵀ]]."""
    n, k, _ = top_left.shape
    st, sb = scale_top[:, None, None], scale_bottom[:, None, None]
    out = torch.empty(n, 2 * k, 2 * k, dtype=_F64, device=top_left.device)
    torch.mul(top_left, st * st, out=out[:, :k, :k])
    torch.mul(top_right, st * sb, out=out[:, :k, k:])
    out[:, k:, :k] = out[:, :k, k:].transpose(-1, -2)
    torch.mul(bottom_right, sb * sb, out=out[:, k:, k:])
    return out


def _block_norm(gram: torch.Tensor) -> torch.Tensor:
    """Frobenius norm of the factor behind a Gram block: sqrt(trace)."""
    return _trace(gram).clamp_min(0).sqrt()


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
    return gram_singular_values(0.5 * (core + core.transpose(-1, -2)), rank)


def _cosine(base_gram: torch.Tensor, delta_base: torch.Tensor, new_gram: torch.Tensor) -> float:
    """cos(W_a, W_b) from the blocks: ⟨W_a, W_b⟩ = ‖W_a‖² + ⟨ΔW, W_a⟩, the
    traces of W_aW_aᵀ and ΔW W_aᵀ summed over heads."""
    norm_a, norm_b = _trace(base_gram).sum(), _trace(new_gram).sum()
    if norm_a <= 0 or norm_b <= 0:
        return float("nan")
    return float((norm_a + _trace(delta_base).sum()) / (norm_a * norm_b).sqrt())


def logit_scale(
    q: torch.Tensor,
    k: torch.Tensor,
    *,
    input_gain: torch.Tensor | None = None,
    kv_index: torch.Tensor | None = None,
) -> torch.Tensor:
    """The scale of each query head's attention logits a checkpoint sets [H]:
    their standard deviation for isotropic inputs of unit RMS.

    The logit of head h is x_iᵀ Q_hᵀ K_g x_j / √r for the attention's inputs
    x = γ ⊙ x̂ after an RMSNorm of gain γ; for x̂_i, x̂_j independent with
    E[x̂x̂ᵀ] = I its second moment is ‖D_γ Q_hᵀ K_g D_γ‖_F² / r (D_γ = diag(γ);
    `q`, `k` [H|G, r, d] the projections' head blocks), from the r × r Grams:
    tr((Q_h D_γ² Q_hᵀ)(K_g D_γ² K_gᵀ)). It is in logits; healthy runs of the
    corpus sit near 1 at d = 64 and 128 and reach 2.6 at 256 (the ceiling
    grows as √d: detection/thresholds.py), while the worst-case bound
    (σ_max · d / √r) grew ×1.8 from 64 to 128. Attention logit growth
    (Dehghani et al. 2023; Wortsman et al. 2023) is this scale rising until
    softmax is one-hot. The content form: RoPE is not applied, as for every
    monitor here. A QK-norm removes the projections' scale from the logits:
    `qk_norm_logit_bound` is its measure. Computed in float64.
    """
    num_heads, r, _ = q.shape
    kv = kv_head_index(num_heads, k.shape[0]) if kv_index is None else kv_index
    q64, k64 = q.to(_F64), k.to(_F64)
    if input_gain is not None:
        q64 = q64 * input_gain.to(_F64)
        k64 = k64 * input_gain.to(_F64)
    qq, kk = _gram(q64, q64), _gram(k64, k64)[kv]
    return (qq * kk).sum((-1, -2)).clamp_min(0).sqrt() / math.sqrt(r)


def qk_norm_logit_bound(q_norm_gain: torch.Tensor, k_norm_gain: torch.Tensor) -> float:
    """The largest attention logit a per-head QK-norm allows: q and k are
    normalised to norm √r before their gains (`q_norm_gain`, `k_norm_gain`
    [r], shared by the heads), so |q̃·k̃|/√r ≤ ‖γ_q‖_∞ ‖γ_k‖_∞ √r whatever the
    projections (attained when both put their norm on their largest gains,
    RoPE's rotation aligning them). Below ~100 softmax cannot be one-hot:
    what QK-norm is for (Wortsman et al. 2023)."""
    r = q_norm_gain.numel()
    return float(q_norm_gain.to(_F64).abs().max() * k_norm_gain.to(_F64).abs().max()) * math.sqrt(r)


def _relative_norm(delta_gram: torch.Tensor, base_gram: torch.Tensor) -> float:
    delta = _block_norm(delta_gram).square().sum().sqrt()
    base = _block_norm(base_gram).square().sum().sqrt()
    return float(delta / base) if base > 0 else float("inf")
