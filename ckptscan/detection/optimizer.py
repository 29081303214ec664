"""Why the optimizer family's rule: a layer whose W_q/W_k parameters have
mostly lost Adam's gradient history (declared with the family, its
`pair_rule`: monitors/optimizer_family.py).

A parameter whose second moment v fell below ε² has had no gradient of
scale ε for ~log(v₀/ε²)/log(1/β₂) steps: its update is no longer damped by
its own history, and when a gradient comes back it moves by about the
learning rate, sign-like, whatever its scale — what Molybog et al. 2023
(arXiv 2304.09871) find before loss spikes. In healthy training no W_q/W_k
parameter gets there: real AdamW runs of the tiny live-mode model (ε 1e-8,
LR 3e-3 to 1e-1, β₂ 0.95 and 0.999, 300 steps) keep every v ≥ 3.6e-13,
share 0 (docs/monitors.md). A quarter of a layer's projection parameters —
a whole head of four in the smallest models — is the warning level: no run
that reached it was available to calibrate an alert, so it warns, and says
what is done about it."""

from __future__ import annotations

from ckptscan.monitors.optimizer_family import ACTIONS, DECAYED_SHARE, RULE_DECAYED, decayed_moment_findings

__all__ = ["ACTIONS", "DECAYED_SHARE", "RULE_DECAYED", "decayed_moment_findings"]
