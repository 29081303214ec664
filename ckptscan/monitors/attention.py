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
from dataclasses import dataclass, field, fields

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

    def layer(self, index: int) -> QKSpectra:
        """One layer of spectra computed for several (a leading layer dimension)."""
        return QKSpectra(**{f.name: getattr(self, f.name)[index] for f in fields(self)})


def kv_heads(num_heads: int, num_kv_heads: int) -> list[int]:
    """KV head of each query head, g = h // (H/G), as `repeat_kv` lays them out."""
    if num_kv_heads < 1 or num_heads % num_kv_heads:
        raise ValueError(f"{num_heads} query heads cannot be grouped over {num_kv_heads} KV heads")
    return [h // (num_heads // num_kv_heads) for h in range(num_heads)]


def kv_head_index(num_heads: int, num_kv_heads: int) -> torch.Tensor:
    """`kv_heads` as a tensor [H]."""
    return torch.tensor(kv_heads(num_heads, num_kv_heads))


def qk_grams(q: torch.Tensor, k: torch.Tensor, compute_dtype: torch.dtype = torch.float32) -> QKGrams:
    """Q_hQ_hᵀ and K_gK_gᵀ of one checkpoint's layer, q: [H, r, d], k: [G, r, d],
    in `compute_dtype` on the weights' device."""
    q = q.to(compute_dtype)
    k = k.to(compute_dtype)
    return QKGrams(qq=q @ q.mT, kk=k @ k.mT)


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
    A scan computes `qk_gram_blocks` layer by layer and solves several layers
    at once (`qk_spectra_from_blocks`); this is the same for one layer.
    """
    num_heads, r, d = q_a.shape
    kv = kv_head_index(num_heads, k_a.shape[0]) if kv_index is None else kv_index.cpu()
    blocks = qk_gram_blocks(q_a, k_a, q_b, k_b, compute_dtype=compute_dtype, grams_a=grams_a, grams_b=grams_b)
    return qk_spectra_from_blocks(blocks[None], num_heads, kv, d).layer(0)


def qk_gram_blocks(
    q_a: torch.Tensor,
    k_a: torch.Tensor,
    q_b: torch.Tensor,
    k_b: torch.Tensor,
    *,
    compute_dtype: torch.dtype = torch.float32,
    grams_a: QKGrams | None = None,
    grams_b: QKGrams | None = None,
) -> torch.Tensor:
    """A layer's O(d) work, on the weights' device: every r × r Gram block its
    spectra need, brought to the CPU in float64 in one transfer (everything
    after them is small, and is solved there): [K, H + G, r, r], the query
    heads then the KV heads of kinds [ΔWΔWᵀ, ΔW W_aᵀ, W_aW_aᵀ] and, with
    `grams_b`, W_bW_bᵀ (K = 4; else 3 and it is assembled from the others)."""
    num_heads, r, d = q_a.shape
    if q_b.shape != q_a.shape or k_b.shape != k_a.shape or tuple(k_a.shape[1:]) != (r, d):
        raise ValueError(f"inconsistent head blocks: q {tuple(q_a.shape)}/{tuple(q_b.shape)}, "
                         f"k {tuple(k_a.shape)}/{tuple(k_b.shape)}")
    dq, qa = _difference(q_b, q_a, compute_dtype)
    dk, ka = _difference(k_b, k_a, compute_dtype)
    blocks = [dq @ dq.mT, dk @ dk.mT, dq @ qa.mT, dk @ ka.mT]
    blocks += [qa @ qa.mT, ka @ ka.mT] if grams_a is None else [grams_a.qq.to(compute_dtype),
                                                                 grams_a.kk.to(compute_dtype)]
    if grams_b is not None:
        blocks += [grams_b.qq.to(compute_dtype), grams_b.kk.to(compute_dtype)]
    return torch.cat(blocks).to("cpu", _F64).unflatten(0, (len(blocks) // 2, num_heads + k_a.shape[0]))


def qk_spectra_from_blocks(blocks: torch.Tensor, num_heads: int, kv_index: torch.Tensor, d: int) -> QKSpectra:
    """Every spectrum of L layers from their `qk_gram_blocks` stacked [L, K, H + G, r, r]
    (float64, CPU), in one batched Cholesky and one batched symmetric
    eigensolve however many layers and heads: QKSpectra fields with a leading
    layer dimension. `kv_index` [H]: each query head's KV head (a row of the G)."""
    layers, kinds, _, r, _ = blocks.shape
    heads = num_heads
    x = blocks
    if kinds == 3:  # W_bW_bᵀ = W_aW_aᵀ + ΔW W_aᵀ + W_aΔWᵀ + ΔWΔWᵀ
        x = torch.cat([x, (x[:, 2] + x[:, 1] + x[:, 1].mT + x[:, 0])[:, None]], 1)
    # Heads with non-finite inputs: solve on zeros, report NaN (LAPACK returns
    # finite garbage for NaN input rather than failing). A non-finite entry of
    # a factor shows on the diagonal of its Gram, and finite diagonals bound
    # every other entry (Cauchy–Schwarz), so the traces are a complete check.
    traces = x.diagonal(dim1=-2, dim2=-1).sum(-1)  # [L, 4, H + G]
    bad = ~torch.isfinite(traces.sum(1))  # [L, H + G]
    x = x.masked_fill(bad[:, None, :, None, None], 0.0)
    traces = traces.masked_fill(bad[:, None], 0.0)
    # Each query head's own blocks, then its KV head's: [L, 4, 2H, r, r].
    own_then_key = torch.tensor(list(range(heads)) + [heads + g for g in kv_index.tolist()])
    x_h = x[:, :, own_then_key]
    norms = traces[:, :, own_then_key].clamp_min(0).sqrt()
    bad_h2 = bad[:, own_then_key]
    bad_h = bad_h2[:, :heads] | bad_h2[:, heads:]

    # Balance the two blocks of each factor (monitors.md, "numerical trap"):
    # ‖ΔQ‖ can be 1e-6 of ‖Q‖, and an unbalanced Gram would bury the small
    # block in rounding error. A = [αΔQ; βQ_a], B = [K/α; ΔK/β] keeps AᵀB and
    # gives each term's two factors equal norms: α = √(‖K‖/‖ΔQ‖),
    # β = √(‖ΔK‖/‖Q‖) (1 where a side is zero). A term whose A block is zero
    # (ΔQ = 0, or Q_a = 0) is dropped exactly by scaling its B block to 0, and
    # the zero block stands in as an identity in coordinates of its own (B has
    # nothing there, so AᵀB is unchanged) so that G_A stays positive definite.
    numerator = norms[:, [2, 0], heads:]  # ‖K‖, ‖ΔK‖
    denominator = norms[:, [0, 2], :heads]  # ‖ΔQ‖, ‖Q‖
    zero = denominator == 0
    ratio = (numerator / denominator).masked_fill((numerator <= 0) | zero, 1.0).sqrt()  # α, β
    inverse = ratio.reciprocal().masked_fill(zero, 0.0)  # B's scales 1/α, 1/β, or 0
    scales = torch.cat([ratio, inverse, torch.ones_like(ratio)], 1)  # [L, 6, H]
    top, bottom = scales[:, [0, 4, 2, 2], :, None, None], scales[:, [1, 5, 3, 3], :, None, None]

    # Four 2r × 2r matrices per head, [[s_t² X, s_t s_b Z], [·ᵀ, s_b² Y]]:
    # G_A, the Gram of [αΔQ; βQ_a]; diag(ΔQΔQᵀ, Q_bQ_bᵀ), whose Cholesky
    # blocks factor the Δ3 and logit-bound cores; and the Grams of Δ1's
    # B = [K_b/α; ΔK/β] (Δ1 = ΔQᵀK_b + Q_aᵀΔK, K_bΔKᵀ = K_aΔKᵀ + ΔKΔKᵀ) and
    # of Δ2's B = [K_a/α; ΔK/β]: in this order, so that the two factored and
    # the two cored are slices, not copies. Blocks by (kind, side): kinds as
    # `qk_gram_blocks`, side 0 the query head's own, 1 its KV head's.
    flat = x_h.flatten(1, 2)

    def gather(flat: torch.Tensor, *spec: tuple[int, int]) -> torch.Tensor:
        return flat[:, torch.tensor([[kind * 2 * heads + side * heads + h for h in range(heads)]
                                     for kind, side in spec])]

    top_left = gather(flat, (0, 0), (0, 0), (3, 1), (2, 1))
    bottom_right = gather(flat, (2, 0), (3, 0), (0, 1), (0, 1))
    cross = gather(flat, (1, 0), (1, 1))  # ΔQQ_aᵀ, ΔKK_aᵀ
    key_cross = cross[:, 1].mT  # K_aΔKᵀ
    corner = torch.stack([cross[:, 0], torch.zeros_like(key_cross), key_cross + bottom_right[:, 3], key_cross], 1)
    zero_qb = traces[:, 3, :heads] == 0
    no = torch.zeros_like(zero_qb)
    identity = torch.eye(r, dtype=_F64)
    top_left = torch.where(torch.stack([zero[:, 0], zero[:, 0], no, no], 1)[..., None, None], identity, top_left)
    bottom_right = torch.where(torch.stack([zero[:, 1], zero_qb, no, no], 1)[..., None, None], identity,
                               bottom_right)
    corner = corner * (top * bottom)
    grams = torch.cat([torch.cat([top_left * top.square(), corner], -1),
                       torch.cat([corner.mT, bottom_right * bottom.square()], -1)], -2)  # [L, 4, H, 2r, 2r]
    del top_left, bottom_right, cross, key_cross, corner
    # What the narrow cores need of the blocks, taken now so that the blocks can go before the solves.
    keep = ~torch.stack([zero[:, 0], zero_qb], 1)  # Δ3 = 0 when ΔQ = 0; no logits when Q_b = 0
    narrow_inner = gather(flat, (0, 1), (3, 1)) * keep[..., None, None]
    own = gather(flat, (0, 0), (2, 0), (3, 0)).flatten(1, 2)
    key_updates = x[:, 0, heads:].clone()
    del x, x_h, flat

    factors = _cholesky(grams[:, :2], r)  # [L, 2, H, 2r, 2r]: L_A, diag(L_ΔQ, L_Qb)
    factor_a = factors[:, :1]
    wide = factor_a.mT @ grams[:, 2:] @ factor_a  # Δ1, Δ2 cores [L, 2, H, 2r, 2r]
    del grams
    narrow_factors = torch.stack([factors[:, 1, :, :r, :r], factors[:, 1, :, r:, r:]], 1)
    del factors, factor_a
    narrow = narrow_factors.mT @ narrow_inner @ narrow_factors
    del narrow_factors, narrow_inner
    # The Δ3 and logit-bound cores, and the Grams whose own spectra are wanted
    # (ΔQΔQᵀ, Q_aQ_aᵀ, Q_bQ_bᵀ per query head, ΔKΔKᵀ per KV head): [L, 5H + G, r, r].
    narrow = torch.cat([narrow.flatten(1, 2), own, key_updates], 1)
    del own, key_updates
    # The eigensolve copies its input and needs working memory of its own:
    # the blocks assembled before are gone (several times the cores).
    wide_values, narrow_values = eigvalsh_two_sizes(wide.flatten(0, 2), narrow)
    del wide, narrow
    core_rank, head_rank = min(2 * r, d), min(r, d)
    wide_sv = _singular_values(wide_values, core_rank).unflatten(0, (layers, 2, heads))
    wide_sv = wide_sv.masked_fill(bad_h[:, None, :, None], float("nan"))
    narrow_sv = _singular_values(narrow_values, head_rank)
    bad_q, bad_k = bad[:, :heads], bad[:, heads:]
    narrow_sv = narrow_sv.masked_fill(torch.cat([bad_h, bad_h, bad_q, bad_q, bad_q, bad_k], 1)[..., None],
                                      float("nan"))
    delta3, logit_bound, dwq, q_norm_a, q_norm_b = narrow_sv[:, :5 * heads].unflatten(1, (5, heads)).unbind(1)

    # Layer-wide values from the traces summed over heads, per side (query, key):
    # ‖ΔW‖², ⟨ΔW, W_a⟩, ‖W_a‖², ‖W_b‖²; NaN where a head of that side is non-finite.
    sums = torch.stack([traces[:, :, :heads].sum(-1), traces[:, :, heads:].sum(-1)], -1)  # [L, 4, 2]
    roots = sums[:, [0, 2]].clamp_min(0).sqrt()
    relative = (roots[:, 0] / roots[:, 1]).masked_fill(roots[:, 1] == 0, float("inf"))
    related = (sums[:, 2] > 0) & (sums[:, 3] > 0)
    cosine = ((sums[:, 2] + sums[:, 1]) / (sums[:, 2] * sums[:, 3]).sqrt()).masked_fill(~related, float("nan"))
    side_bad = torch.stack([bad_q.any(-1), bad_k.any(-1)], -1)
    relative, cosine = relative.masked_fill(side_bad, float("nan")), cosine.masked_fill(side_bad, float("nan"))
    return QKSpectra(
        delta1=wide_sv[:, 0],
        delta2=wide_sv[:, 1],
        delta3=delta3,
        dwq=dwq,
        dwk=narrow_sv[:, 5 * heads:],
        dwq_rel_norm=relative[:, 0],
        dwk_rel_norm=relative[:, 1],
        q_spectral_norm=q_norm_b[..., 0],
        q_spectral_norm_base=q_norm_a[..., 0],
        qk_logit_bound=logit_bound[..., 0],
        q_cosine=cosine[:, 0],
        k_cosine=cosine[:, 1],
    )


def _cholesky(grams: torch.Tensor, r: int) -> torch.Tensor:
    """Lower factors of [L, 2, H, 2r, 2r] Grams (G_A and diag(ΔQΔQᵀ, Q_bQ_bᵀ)), by
    Cholesky where positive definite; a rank-deficient one (ΔQ_h of rank < r,
    r > d) gets an eigendecomposition square root instead, the diagonal pair
    each block on its own so that the factor stays block diagonal."""
    factors, info = torch.linalg.cholesky_ex(grams)
    failed = info != 0
    if not bool(failed.any()):  # the one scalar read of a solve, on the host
        return factors
    factors = factors.clone()
    if bool(failed[:, 0].any()):
        factors[:, 0][failed[:, 0]] = _gram_factor(grams[:, 0][failed[:, 0]])
    if bool(failed[:, 1].any()):
        pair = grams[:, 1][failed[:, 1]]
        blocks = _gram_factor(torch.stack([pair[:, :r, :r], pair[:, r:, r:]]))
        rebuilt = torch.zeros_like(pair)
        rebuilt[:, :r, :r], rebuilt[:, r:, r:] = blocks
        factors[:, 1][failed[:, 1]] = rebuilt
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
    wide = _holding(new.dtype, old.dtype, compute_dtype)
    old_wide = old.to(wide)
    return (new.to(wide) - old_wide).to(compute_dtype), old_wide.to(compute_dtype)


def _holding(*dtypes: torch.dtype) -> torch.dtype:
    """The narrowest of `dtypes`' floating types that holds every value of each
    (bfloat16 and float16 together need float32): torch.promote_types without
    a dispatched call per layer."""
    widest = max(dtypes, key=lambda t: torch.finfo(t).bits)
    if {torch.bfloat16, torch.float16} <= set(dtypes) and torch.finfo(widest).bits <= 16:
        return torch.float32
    return widest


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
    return logit_scale_from_squares(
        logit_scale_squares(q, k, input_gain=input_gain, kv_index=kv_index, compute_dtype=compute_dtype), q.shape[1])


def logit_scale_squares(
    q: torch.Tensor,
    k: torch.Tensor,
    *,
    input_gain: torch.Tensor | None = None,
    kv_index: torch.Tensor | None = None,
    compute_dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """`logit_scale`'s O(d) part on the weights' device: tr((Q_h D_γ² Q_hᵀ)(K_g D_γ² K_gᵀ))
    per query head [H], float64; `logit_scale_from_squares` finishes it (a scan
    finishes several layers' at once, on the host)."""
    num_heads, r, _ = q.shape
    q, k = q.to(compute_dtype), k.to(compute_dtype)
    # Q D_γ² Qᵀ as (Q ⊙ γ²) Qᵀ: one scaled copy per projection.
    square = None if input_gain is None else input_gain.to(device=q.device, dtype=compute_dtype).square()
    qq = (q if square is None else q * square) @ q.mT
    kk = (k if square is None else k * square) @ k.mT
    if kv_index is None:  # every head, in repeat_kv's groups: a broadcast, not a gather
        kv_heads(num_heads, k.shape[0])  # checks the grouping
        products = qq.unflatten(0, (k.shape[0], -1)) * kk[:, None]
    else:
        products = qq * kk[kv_index.to(k.device)]
    return products.sum((-1, -2), dtype=_F64).reshape(num_heads)


def logit_scale_from_squares(squares: torch.Tensor, r: int) -> torch.Tensor:
    """The logit scales from `logit_scale_squares` (any shape), r the head dimension."""
    return squares.clamp_min(0).sqrt() / math.sqrt(r)


def qk_norm_logit_bound(q_norm_gain: torch.Tensor, k_norm_gain: torch.Tensor) -> float:
    """The largest attention logit a per-head QK-norm allows: q and k are
    normalised to norm √r before their gains (`q_norm_gain`, `k_norm_gain`
    [r], shared by the heads), so |q̃·k̃|/√r ≤ ‖γ_q‖_∞ ‖γ_k‖_∞ √r whatever the
    projections (attained when both put their norm on their largest gains,
    RoPE's rotation aligning them). Below ~100 softmax cannot be one-hot:
    what QK-norm is for (Wortsman et al. 2023)."""
    r = q_norm_gain.numel()
    return float(q_norm_gain.to(_F64).abs().max() * k_norm_gain.to(_F64).abs().max()) * math.sqrt(r)
