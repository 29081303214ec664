"""Directed rounding of float32 values to fewer mantissa bits.

bf16 keeps 7 explicit mantissa bits, fp16 keeps 10, fp32 keeps 23. Qiu & Yao
(arXiv 2510.04212) trace bf16 flash-attention divergence to rounding that is
*biased*: the errors share a sign across tokens and steps, so they add up
instead of averaging out. Round-to-nearest is unbiased and is offered only as
a control.
"""

import torch

MODES = ("zero", "up", "down", "nearest")


def round_mantissa(x: torch.Tensor, bits: int, mode: str) -> torch.Tensor:
    """Round float32 `x` to `bits` explicit mantissa bits.

    mode: "zero" truncates toward zero (|x| only ever shrinks), "up" rounds
    toward +inf, "down" toward -inf, "nearest" is round-half-to-even.
    The exponent range stays float32's, so only precision is lost, never range.
    """
    if x.dtype != torch.float32:
        raise TypeError("round_mantissa expects float32")
    if not 0 <= bits <= 23:
        raise ValueError("bits must be in [0, 23]")
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}")
    drop = 23 - bits
    if drop == 0:
        return x.clone()
    raw = x.contiguous().view(torch.int32)
    low = raw & ((1 << drop) - 1)
    truncated = raw - low  # clears the dropped bits: rounds |x| toward zero
    ulp = 1 << drop
    if mode == "zero":
        out = truncated
    elif mode == "nearest":
        half = 1 << (drop - 1)
        odd = (truncated >> drop) & 1
        up = (low > half) | ((low == half) & (odd == 1))
        out = truncated + up.to(torch.int32) * ulp
    else:
        # One ulp of the kept mantissa away from zero rounds a positive x up and
        # a negative x down. Adding to the raw bits carries into the exponent
        # exactly as a float increment would.
        away_from_zero = (raw >= 0) if mode == "up" else (raw < 0)
        out = truncated + ((low != 0) & away_from_zero).to(torch.int32) * ulp
    result = out.view(torch.float32)
    # Infinities and NaNs have no mantissa to round; pass them through.
    return torch.where(torch.isfinite(x), result, x)
