"""The optimizer family's rule: a layer whose W_q/W_k parameters have mostly
lost Adam's gradient history (monitors/optimizer_family.py).

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

from ckptscan.monitors.optimizer_family import FAMILY, V_BELOW_EPS2
from ckptscan.schema.results import Finding, PairResult

# The share of a layer's projection parameters with v < ε² that warns.
DECAYED_SHARE = 0.25
RULE_DECAYED = "v_below_eps2"
ACTIONS = ("a larger ε (1e-6 and above where v decays)", "a lower β₂ (0.95)",
           "clipping each update's RMS (StableAdamW, Wortsman et al. 2023, arXiv 2304.13013)")


def decayed_moment_findings(pair: PairResult) -> None:
    """A warning on each layer of the pair whose newer checkpoint's share of
    W_q/W_k parameters with v < ε² is DECAYED_SHARE or more. Layers without
    an optimizer state read (none saved, or not by name) are not judged."""
    for layer in pair.layers:
        share = layer.families.get(FAMILY, {}).get(V_BELOW_EPS2)
        if share is None or share < DECAYED_SHARE:
            continue
        message = (f"{share:.0%} of the layer's W_q/W_k parameters have an Adam second moment below ε² at step "
                   f"{pair.to_step} (≥ {DECAYED_SHARE:.0%}): their gradient history has decayed, and a returning "
                   f"gradient moves them by the full learning rate; consider {', '.join(ACTIONS[:-1])} or "
                   f"{ACTIONS[-1]}")
        layer.findings.append(Finding(RULE_DECAYED, FAMILY, "warn", share, message, threshold=DECAYED_SHARE,
                                      rule=RULE_DECAYED))
