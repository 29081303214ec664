"""Dense float64 numpy references of the output family's monitors, written
from their definitions (docs/monitors.md, "Output family") without ckptscan
code: the logits' covariance over the whole vocabulary and numpy's SVD."""

from __future__ import annotations

import math

import numpy as np
import torch


def brute_scales(w, gain) -> dict[str, float]:
    """From the logits' covariance for h ~ N(0, I): z = W D h, Cov(z) = W D² Wᵀ (V × V);
    the common shift is mean_v z_v, of variance 1ᵀ Cov 1 / V²."""
    w = np.asarray(w.to(torch.float64), dtype=np.float64)
    d2 = np.diag(np.ones(w.shape[1]) if gain is None else np.asarray(gain, dtype=np.float64) ** 2)
    cov = w @ d2 @ w.T
    v = w.shape[0]
    ones = np.ones(v)
    rms = math.sqrt(np.trace(cov) / v)
    shift = math.sqrt(ones @ cov @ ones) / v
    return {"output_logit_rms": rms, "output_logit_max": math.sqrt(np.max(np.diag(cov))), "output_shift": shift,
            "output_mean_row_share": shift / rms}


def brute_update(a, b) -> dict[str, float]:
    a = np.asarray(a.to(torch.float64), dtype=np.float64)
    delta = np.asarray(b.to(torch.float64), dtype=np.float64) - a
    s = np.linalg.svd(delta, compute_uv=False)
    p = s**2 / np.sum(s**2)
    entropy = -sum(x * math.log(x) for x in p if x > 0)
    return {"dw_head_entropy_norm": entropy / math.log(min(delta.shape)),
            "dw_head_rel_norm": np.linalg.norm(delta) / np.linalg.norm(a),
            "dw_head_mean_coherence": np.linalg.norm(delta.sum(0)) / np.linalg.norm(delta)}
