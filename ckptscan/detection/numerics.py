"""Updates the stored dtype cannot hold: the rule for weights kept in bf16.

A bf16 weight w is stored to about |w|·2⁻⁸ (7 explicit mantissa bits), so
an update smaller than half that spacing rounds back to the old value. When
training keeps its weights only in bf16 (no fp32 master copy), such updates
are lost for good, step after step: consecutive checkpoints come out
identical, or differ only in the few elements small enough in magnitude for
the update to register. With fp32 master weights the updates accumulate in
fp32 and a bf16 checkpoint differs from the previous one almost everywhere.

So the scan records, per monitored tensor, its stored dtype and the fraction
of elements that changed between the two checkpoints (`LayerResult.
stored_dtype`, `.changed_fraction`), and this rule reads them:

- a low-precision tensor with under MIN_CHANGED_FRACTION of its elements
  changed (but some) is a "numeric" warn: the update is mostly below the
  dtype's resolution, and the layer's spectral monitors measure rounding,
  not the update;
- a low-precision layer with nothing changed is "numeric" info (its status
  stays "unchanged"): a frozen layer looks the same, so it cannot be more.
"""

from __future__ import annotations

from typing import cast

from ckptscan.monitors.numeric_family import NAME as NUMERIC
from ckptscan.schema.results import Finding, LayerResult

# Explicit mantissa bits of each low-precision dtype: the spacing of values
# near w is |w|·2^-bits (up to a factor 2).
LOW_PRECISION = {"BF16": 7, "F16": 10, "F8_E4M3": 3, "F8_E5M2": 2}

# Updates above the stored resolution change essentially every element
# (healthy runs with fp32 master weights: > 90%); under half changed means
# most of the update was rounded away.
MIN_CHANGED_FRACTION = 0.5

FIX = "keep fp32 master weights (mixed precision) or use stochastic rounding"

# The stored tensors whose elements are exactly the monitored ones (fused or
# transposed, not multiplied: MLA's Q = q_b·q_a changes everywhere when one
# stored element does, so it says nothing about the stored resolution).
STORED_AS = {"W_q": ("W_q", "W_q^T", "W_qkv"), "W_k": ("W_k", "W_k^T", "W_qkv"), "router": ("router",)}


def precision_findings(layer: LayerResult) -> list[Finding]:
    dtypes = {role: _stored_dtype(layer, role) for role in layer.changed_fraction}
    fractions = {role: f for role, f in layer.changed_fraction.items() if dtypes[role] in LOW_PRECISION}
    if not fractions:
        return []
    role = min(fractions, key=fractions.__getitem__)
    fraction, dtype = fractions[role], cast(str, dtypes[role])  # a low-precision dtype: not None
    resolution = f"{dtype} resolution (spacing ≈ |w|·2^-{LOW_PRECISION[dtype]})"
    if fraction == 0 and all(f == 0 for f in fractions.values()):
        return [Finding(
            "changed_fraction", NUMERIC, "info", 0.0,
            f"{', '.join(sorted(fractions))} identical between the checkpoints, stored as {dtype}: the layer is "
            f"frozen, or every update fell below {resolution}; if it is trained, {FIX}",
            threshold=MIN_CHANGED_FRACTION, rule="precision",
        )]
    if fraction < MIN_CHANGED_FRACTION:
        return [Finding(
            "changed_fraction", NUMERIC, "warn", fraction,
            f"only {fraction:.1%} of {role} elements changed between the checkpoints, stored as {dtype}: most of "
            f"the update is below {resolution} and is lost if training keeps no higher-precision copy ({FIX}); "
            "this layer's monitors see rounding, not the update",
            threshold=MIN_CHANGED_FRACTION, rule="precision",
        )]
    return []


def _stored_dtype(layer: LayerResult, role: str) -> str | None:
    """The dtype a monitored role's elements are stored in, when stored as is."""
    return next((layer.stored_dtype[s] for s in STORED_AS.get(role, ()) if s in layer.stored_dtype), None)
