"""Causal softmax attention with a flash-attention-style backward pass.

Flash attention never stores the T x T probability matrix P. Its backward
recomputes P and uses D = rowsum(dO * O) in place of rowsum(P * dP); the two
are equal in exact arithmetic. Flash attention computes D from the output O
as stored in low precision. Qiu & Yao (arXiv 2510.04212) trace bf16
flash-attention divergence to rounding error in that O which is biased (one
sign), so it accumulates instead of averaging out. The error it causes,
    dS_lp - dS = P * (D - D_lp) = diag(D - D_lp) P,
pushes every query toward (or away from) its attention-weighted mean key,
coherently across tokens and steps, so dW_q and dW_k gain a low-rank
component that grows step after step.

This module injects exactly that fault and nothing else: the forward pass
and dQ, dK, dV are exact float32, and only D is computed from the rounded O.
"""

from dataclasses import dataclass

import torch

from experiments.lowprec import round_mantissa


@dataclass(frozen=True)
class DRounding:
    """How the backward pass rounds O before it forms D = rowsum(dO * O)."""

    bits: int  # explicit mantissa bits kept (7 is bf16-like)
    mode: str  # "zero", "up", "down" (biased) or "nearest" (unbiased control)


class FlashStyleAttention(torch.autograd.Function):
    """softmax(Q K^T * scale + causal mask) V for q, k, v of shape [B, H, T, r]."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                scale: float, rounding: DRounding | None) -> torch.Tensor:
        p = _causal_probs(q, k, scale)
        o = p @ v
        # Flash attention recomputes P in the backward pass; keeping it is the
        # same numbers (the recomputation is bit-identical) and cheaper on CPU.
        ctx.save_for_backward(q, k, v, p, o)
        ctx.scale = scale
        ctx.rounding = rounding
        return o

    @staticmethod
    def backward(ctx, d_o: torch.Tensor):
        q, k, v, p, o = ctx.saved_tensors
        scale, rounding = ctx.scale, ctx.rounding
        d_v = p.transpose(-2, -1) @ d_o
        d_p = d_o @ v.transpose(-2, -1)
        o_used = o if rounding is None else round_mantissa(o, rounding.bits, rounding.mode)
        delta = (d_o * o_used).sum(dim=-1, keepdim=True)  # the only faulty term
        d_s = p * (d_p - delta)
        d_q = (d_s @ k) * scale
        d_k = (d_s.transpose(-2, -1) @ q) * scale
        return d_q, d_k, d_v, None, None


def _causal_probs(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    t = q.shape[-2]
    scores = (q @ k.transpose(-2, -1)) * scale
    mask = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)
    return scores.masked_fill(mask, float("-inf")).softmax(dim=-1)


def largest_causal_logit(q: torch.Tensor, k: torch.Tensor, scale: float) -> float:
    """max over batch, heads and causal (i ≥ j) positions of q_i·k_j * scale."""
    t = q.shape[-2]
    scores = (q @ k.transpose(-2, -1)) * scale
    mask = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)
    return float(scores.masked_fill(mask, float("-inf")).amax())


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float,
              rounding: DRounding | None = None) -> torch.Tensor:
    return FlashStyleAttention.apply(q, k, v, scale, rounding)
