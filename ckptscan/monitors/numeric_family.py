"""The numeric family: what a finding names when a monitored tensor holds a
non-finite value, an update is mostly lost below the stored dtype's
resolution, or a pair is not an update of one run (detection/numerics.py,
detection/provenance.py). It has no monitors of its own: its rules are the
judge's, applied to every layer whatever the families registered, so it is
not registered with them; `registry.finding_specs()` lists it after them.
"""

from __future__ import annotations

from ckptscan.monitors.spec import RESTART, FamilySpec

NAME = "numeric"

# What training teams do about an alert of the family, from the literature (ckptscan/monitors/interventions.py).
INTERVENTIONS = (
    RESTART,
    ("float32 softmax and router", "keep numerically sensitive parts (softmax, router) in float32 rather "
     "than bfloat16 (selective precision)",
     "Fedus et al. 2021 (Switch Transformer), arXiv:2101.03961"),
)

# Non-finite values are the plainest evidence, and move every family's monitors: first in the tie-break.
NUMERIC = FamilySpec(NAME, (), headline=(), interventions=INTERVENTIONS, mechanism_rank=0,
                     present=lambda layer: True)  # every layer may hold a non-finite value
