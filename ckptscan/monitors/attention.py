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
from dataclasses import dataclass, field

import torch

from ckptscan.monitors.spectral import eigvalsh_two_sizes, gram_singular_values

_F64 = torch.float64


@dataclass
class QKGrams:
    """Per-checkpoint Gram blocks of one layer: exact to reuse across pairs."""

    qq: torch.Tensor  # [H, r, r]  Q_h Q_hᵀ
    kk: torch.Tensor  # [G, r, r]  K_g K_gᵀ


@dataclass
class QKSpectra:
    """Singular values per query head (float64, on the CPU), largest first, and norms.

    A head whose inputs hold non-finite values gets NaN everywhere (never a
    finite-looking spectrum computed from garbage). The layer-wide values are
    0-d tensors, so a caller reads the whole layer back at once.
    """

    delta1: torch.Tensor  # [H, min(2r, d)]
    delta2: torch.Tensor  # [H, min(2r, d)]
    delta3: torch.Tensor  # [H, min(r, d)]
    dwq: torch.Tensor  # [H, min(r, d)]  σ(ΔQ_h)
    dwk: torch.Tensor  # [G, min(r, d)]  σ(ΔK_g)
    dwq_rel_norm: torch.Tensor  # 0-d: ‖ΔW_q‖_F / ‖W_q(a)‖_F over the layer
    dwk_rel_norm: torch.Tensor
    q_spectral_norm: torch.Tensor  # [H] ‖Q_h‖₂ at b
    q_spectral_norm_base: torch.Tensor  # [H] ‖Q_h‖₂ at a
    qk_logit_bound: torch.Tensor  # [H] σ_max(Q_hᵀK_g) at b
    # cos(W(a), W(b)) of the layer's whole W_q (W_k): ⟨W_a, W_b⟩ / (‖W_a‖‖W_b‖), 0-d.
    # Two checkpoints of one run stay related however large the update;
    # unrelated weights give ≈ 0 (detection/provenance.py).
    q_cosine: torch.Tensor = field(default_factory=lambda: torch.tensor(float("nan"), dtype=_F64))
    k_cosine: torch.Tensor = field(default_factory=lambda: torch.tensor(float("nan"), dtype=_F64))

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
    dtype (norm gains already folded), on any device. Differences are taken
    without rounding (see the module docstring), never in the stored low
    precision. `grams_a`/`grams_b` are the checkpoints' own `qk_grams`, passed
    in when a run reuses them; without `grams_b` its blocks are assembled from
    the difference blocks (Q_bQ_bᵀ = QQᵀ + ΔQQᵀ + QΔQᵀ + ΔQΔQᵀ), which saves
    two Gram products. `kv_index` [H] maps each query head to its row in k_*
    when the heads are a selection (`--heads`) rather than all of them.
    """
    num_heads, r, d = q_a.shape
    num_kv = k_a.shape[0]
    if q_b.shape != q_a.shape or k_b.shape != k_a.shape or tuple(k_a.shape[1:]) != (r, d):
        raise ValueError(f"inconsistent head blocks: q {tuple(q_a.shape)}/{tuple(q_b.shape)}, "
                         f"k {tuple(k_a.shape)}/{tuple(k_b.shape)}")
    kv = kv_head_index(num_heads, num_kv) if kv_index is None else kv_index.cpu()
    blocks = _gram_blocks(q_a, k_a, q_b, k_b, compute_dtype, grams_a, grams_b)
    return _solve(blocks, num_heads, num_kv, kv, d)


def _gram_blocks(q_a: torch.Tensor, k_a: torch.Tensor, q_b: torch.Tensor, k_b: torch.Tensor,
                 compute_dtype: torch.dtype, grams_a: QKGrams | None, grams_b: QKGrams | None) -> torch.Tensor:
    """The layer's O(d) work, on the weights' device: every r × r Gram block the
    spectra need, stacked [ΔQΔQᵀ, ΔQQ_aᵀ, Q_aQ_aᵀ, (Q_bQ_bᵀ)] ([H] each) then
    [ΔKΔKᵀ, ΔKK_aᵀ, K_aK_aᵀ, (K_bK_bᵀ)] ([G] each), and brought to the CPU in
    float64 in one transfer: everything after them is small, and is solved there."""
    dq, qa = _difference(q_b, q_a, compute_dtype)
    dk, ka = _difference(k_b, k_a, compute_dtype)
    qq_a = (qa @ qa.mT) if grams_a is None else grams_a.qq.to(compute_dtype)
    kk_a = (ka @ ka.mT) if grams_a is None else grams_a.kk.to(compute_dtype)
    query = [dq @ dq.mT, dq @ qa.mT, qq_a]
    key = [dk @ dk.mT, dk @ ka.mT, kk_a]
    if grams_b is not None:
        query.append(grams_b.qq.to(compute_dtype))
        key.append(grams_b.kk.to(compute_dtype))
    return torch.cat(query + key).to("cpu", _F64)


def _solve(blocks: torch.Tensor, num_heads: int, num_kv: int, kv: torch.Tensor, d: int) -> QKSpectra:
    """Every spectrum from the Gram blocks (float64, CPU): one batched Cholesky
    and one batched symmetric eigensolve for the whole layer."""
    r = blocks.shape[-1]
    per_side = blocks.shape[0] // (num_heads + num_kv)
    query, key = blocks[:per_side * num_heads], blocks[per_side * num_heads:]
    query, key = query.unflatten(0, (per_side, num_heads)), key.unflatten(0, (per_side, num_kv))
    if per_side == 3:  # the newer checkpoint's Grams from the difference blocks
        query = torch.cat([query, _newer_gram(query)[None]])
        key = torch.cat([key, _newer_gram(key)[None]])
    # Heads with non-finite inputs: solve on zeros, report NaN (LAPACK returns
    # finite garbage for NaN input rather than failing). A non-finite entry of
    # a factor shows on the diagonal of its Gram, and finite diagonals bound
    # every other entry (Cauchy–Schwarz), so the traces are a complete check.
    traces_q, traces_k = _trace(query), _trace(key)  # [4, H], [4, G]
    bad_q = ~torch.isfinite(traces_q.sum(0))
    bad_k = ~torch.isfinite(traces_k.sum(0))
    query = torch.where(bad_q[:, None, None], 0.0, query)
    key = torch.where(bad_k[:, None, None], 0.0, key)
    bad_h = bad_q | bad_k[kv]
    dqdq, dq_q, qq_a, qq_b = query
    dkdk, dk_k, kk_a, kk_b = key
    dkdk_h, dk_k_h, kk_a_h, kk_b_h = key[:, kv]  # key-side blocks of each query head

    # Balance the two blocks of each factor (monitors.md, "numerical trap"):
    # ‖ΔQ‖ can be 1e-6 of ‖Q‖, and an unbalanced Gram would bury the small
    # block in rounding error. A = [αΔQ; βQ_a], B = [K/α; ΔK/β] keeps AᵀB and
    # gives each term's two factors equal norms: α = √(‖K‖/‖ΔQ‖),
    # β = √(‖ΔK‖/‖Q‖). A term whose update is exactly zero is dropped exactly
    # by scaling its B block to 0; its A block is kept (balanced against the
    # other) so that G_A stays positive definite for the Cholesky factor, and
    # an A block that is itself zero stands in as an identity block in
    # coordinates of its own (B has nothing there, so AᵀB is unchanged).
    norm_dq, norm_q, norm_dk, norm_k = (x.clamp_min(0).sqrt() for x in
                                        (traces_q[0], traces_q[2], _trace(dkdk_h), _trace(kk_a_h)))
    norm_dq, norm_q = torch.where(bad_q, 0.0, norm_dq), torch.where(bad_q, 0.0, norm_q)
    alpha, beta = _balance(norm_k, norm_dq), _balance(norm_dk, norm_q)
    zero_dq, zero_q = norm_dq == 0, norm_q == 0
    s_dq = alpha
    s_q = torch.where(norm_dk > 0, beta, _balance(alpha * alpha * norm_dq * norm_dq, norm_q * norm_q))
    s_k = torch.where(zero_dq, 0.0, 1 / alpha)
    s_dk = torch.where(zero_q, 0.0, 1 / beta)

    # Four 2r × 2r matrices per head, [[s_t² X, s_t s_b Z], [·ᵀ, s_b² Y]]:
    # G_A = Gram of [αΔQ; βQ_a]; the Grams of Δ2's B = [K_a/α; ΔK/β] and of
    # Δ1's B = [K_b/α; ΔK/β] (Δ1 = ΔQᵀK_b + Q_aᵀΔK, with K_bΔKᵀ = K_aΔKᵀ +
    # ΔKΔKᵀ); and diag(ΔQΔQᵀ, Q_bQ_bᵀ), whose Cholesky blocks factor the Δ3
    # and logit-bound cores.
    identity = torch.eye(r, dtype=_F64)
    k_dk = dk_k_h.mT
    top = torch.stack([torch.where(zero_dq[:, None, None], identity, dqdq), kk_a_h, kk_b_h,
                       torch.where(zero_dq[:, None, None], identity, dqdq)])
    corner = torch.stack([dq_q, k_dk, k_dk + dkdk_h, torch.zeros_like(dq_q)])
    zero_qb = _trace(qq_b) <= 0
    bottom = torch.stack([torch.where(zero_q[:, None, None], identity, qq_a), dkdk_h, dkdk_h,
                          torch.where(zero_qb[:, None, None], identity, qq_b)])
    ones = torch.ones_like(alpha)
    scale_top = torch.stack([torch.where(zero_dq, 1.0, s_dq), s_k, s_k, ones])[..., None, None]
    scale_bottom = torch.stack([torch.where(zero_q, 1.0, s_q), s_dk, s_dk, ones])[..., None, None]
    corner = corner * (scale_top * scale_bottom)
    grams = torch.cat([torch.cat([top * scale_top.square(), corner], -1),
                       torch.cat([corner.mT, bottom * scale_bottom.square()], -1)], -2)  # [4, H, 2r, 2r]

    factors = _cholesky(grams[[0, 3]], r)  # [2, H, 2r, 2r]: L_A, diag(L_ΔQ, L_Qb)
    factor_a, factor_dq, factor_qb = factors[0], factors[1, :, :r, :r], factors[1, :, r:, r:]
    wide = factor_a.mT @ grams[[2, 1]] @ factor_a  # Δ1, Δ2 cores [2, H, 2r, 2r]
    narrow = torch.stack([dkdk_h, kk_b_h]) * torch.stack([~zero_dq, ~zero_qb])[..., None, None]
    narrow = torch.stack([factor_dq, factor_qb]).mT @ narrow @ torch.stack([factor_dq, factor_qb])
    # Δ3 core, logit-bound core, and the Grams whose own spectra are wanted.
    wide_values, narrow_values = eigvalsh_two_sizes(
        wide.flatten(0, 1), torch.cat([narrow.flatten(0, 1), dqdq, qq_a, qq_b, dkdk]))
    core_rank, head_rank = min(2 * r, d), min(r, d)
    delta1, delta2 = _singular_values(wide_values, core_rank).unflatten(0, (2, num_heads))
    narrow_sv = _singular_values(narrow_values, head_rank)
    delta3, logit_bound, dwq, q_norm_a, q_norm_b = narrow_sv[:5 * num_heads].unflatten(0, (5, num_heads))
    dwk = narrow_sv[5 * num_heads:]

    sums_q, sums_k = traces_q.sum(1), traces_k.sum(1)  # Σ over heads: ‖ΔW‖², ⟨ΔW, W_a⟩, ‖W_a‖², ‖W_b‖²
    return QKSpectra(
        delta1=_nan_where(bad_h, delta1),
        delta2=_nan_where(bad_h, delta2),
        delta3=_nan_where(bad_h, delta3),
        dwq=_nan_where(bad_q, dwq),
        dwk=_nan_where(bad_k, dwk),
        dwq_rel_norm=_nan_where(bad_q.any(), _relative_norm(sums_q)),
        dwk_rel_norm=_nan_where(bad_k.any(), _relative_norm(sums_k)),
        q_spectral_norm=_nan_where(bad_q, q_norm_b[:, 0]),
        q_spectral_norm_base=_nan_where(bad_q, q_norm_a[:, 0]),
        qk_logit_bound=_nan_where(bad_h, logit_bound[:, 0]),
        q_cosine=_cosine(sums_q),
        k_cosine=_cosine(sums_k),
    )


def _newer_gram(blocks: torch.Tensor) -> torch.Tensor:
    """Q_bQ_bᵀ = QQᵀ + ΔQQᵀ + QΔQᵀ + ΔQΔQᵀ from [ΔQΔQᵀ, ΔQQᵀ, QQᵀ] blocks."""
    delta, cross, base = blocks
    return base + cross + cross.mT + delta


def _cholesky(grams: torch.Tensor, r: int) -> torch.Tensor:
    """Lower factors of [2, H, 2r, 2r] Grams (G_A and diag(ΔQΔQᵀ, Q_bQ_bᵀ)), by
    Cholesky where positive definite; a rank-deficient one (ΔQ_h of rank < r,
    r > d) gets an eigendecomposition square root instead, the diagonal pair
    each block on its own so that the factor stays block diagonal."""
    factors, info = torch.linalg.cholesky_ex(grams)
    failed = info != 0
    if not bool(failed.any()):  # the one scalar read of the layer, on the host
        return factors
    factors = factors.clone()
    if bool(failed[0].any()):
        factors[0, failed[0]] = _gram_factor(grams[0, failed[0]])
    if bool(failed[1].any()):
        pair = grams[1, failed[1]]
        blocks = _gram_factor(torch.stack([pair[:, :r, :r], pair[:, r:, r:]]))
        rebuilt = torch.zeros_like(pair)
        rebuilt[:, :r, :r], rebuilt[:, r:, r:] = blocks
        factors[1, failed[1]] = rebuilt
    return factors


def _singular_values(eigenvalues: torch.Tensor, rank: int) -> torch.Tensor:
    """Largest first: √λ of ascending eigenvalues, a rounding-negative λ read as 0."""
    return eigenvalues.flip(-1)[..., :rank].clamp_min(0).sqrt()


def product_singular_values(gram_a: torch.Tensor, gram_b: torch.Tensor, rank: int) -> torch.Tensor:
    """Top `rank` singular values of AᵀB from G_A = AAᵀ and G_B = BBᵀ ([…, k, k]).

    σ(AᵀB)² = eig(G_A G_B) = eig(Lᵀ G_B L) for any factor G_A = L Lᵀ; the
    symmetric form keeps the eigenproblem well posed. Solved in float64.
    """
    factor = _gram_factor(gram_a.to(_F64))
    core = factor.mT @ gram_b.to(_F64) @ factor
    return gram_singular_values(0.5 * (core + core.mT), rank)


def _difference(new: torch.Tensor, old: torch.Tensor, compute_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(new − old, old), both in `compute_dtype`; the difference without rounding
    the operands: taken in a dtype that holds both."""
    wide = torch.promote_types(torch.promote_types(new.dtype, old.dtype), compute_dtype)
    old_wide = old.to(wide)
    return (new.to(wide) - old_wide).to(compute_dtype), old_wide.to(compute_dtype)


def _gram(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return (x @ y.transpose(-1, -2)).to(_F64)


def _trace(gram: torch.Tensor) -> torch.Tensor:
    return torch.diagonal(gram, dim1=-2, dim2=-1).sum(-1)


def _nan_where(mask: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """x with NaN in the rows (or the whole 0-d value) `mask` marks."""
    return torch.where(mask.reshape(mask.shape + (1,) * (x.dim() - mask.dim())), float("nan"), x)


def _balance(numerator: torch.Tensor, denominator: torch.Tensor) -> torch.Tensor:
    """sqrt(numerator / denominator), or 1 where either side is zero."""
    ok = (numerator > 0) & (denominator > 0)
    return torch.where(ok, numerator / torch.where(ok, denominator, 1.0), 1.0).sqrt()


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


def _relative_norm(sums: torch.Tensor) -> torch.Tensor:
    """‖ΔW‖_F / ‖W_a‖_F from the summed traces [‖ΔW‖², ⟨ΔW, W_a⟩, ‖W_a‖², ‖W_b‖²]
    (inf for a zero base)."""
    delta, base = sums[0].clamp_min(0).sqrt(), sums[2].clamp_min(0).sqrt()
    return torch.where(base > 0, delta / torch.where(base > 0, base, 1.0), float("inf"))


def _cosine(sums: torch.Tensor) -> torch.Tensor:
    """cos(W_a, W_b) from the summed traces: ⟨W_a, W_b⟩ = ‖W_a‖² + ⟨ΔW, W_a⟩
    (NaN where either side has no norm or a value is non-finite)."""
    norm_a, norm_b = sums[2], sums[3]
    ok = (norm_a > 0) & (norm_b > 0)
    return torch.where(ok, (norm_a + sums[1]) / torch.where(ok, norm_a * norm_b, 1.0).sqrt(), float("nan"))


def logit_scale(
    q: torch.Tensor,
    k: torch.Tensor,
    *,
    input_gain: torch.Tensor | None = None,
    kv_index: torch.Tensor | None = None,
    compute_dtype: torch.dtype = torch.float64,
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
    `qk_norm_logit_bound` is its measure. The Grams are taken in
    `compute_dtype` (float64 by default; a scan passes its own, float32 by
    default: relative error ~1e-6, against a ceiling) and combined in float64.
    """
    num_heads, r, _ = q.shape
    kv = kv_head_index(num_heads, k.shape[0]) if kv_index is None else kv_index
    q, k = q.to(compute_dtype), k.to(compute_dtype)
    # Q D_γ² Qᵀ as (Q ⊙ γ²) Qᵀ: one scaled copy per projection.
    square = None if input_gain is None else input_gain.to(device=q.device, dtype=compute_dtype).square()
    qq = _gram(q if square is None else q * square, q)
    kk = _gram(k if square is None else k * square, k)[kv.to(k.device)]
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
