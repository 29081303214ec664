"""Why the output family's rule (declared with the family, its `ceilings`:
monitors/output_family.py): the output logit scale a checkpoint allows
(monitors/output.py) over its ceiling. Like the attention logit scale it is
absolute, so it is judged from the first pair, without a baseline: a head
whose logits have grown past what healthy runs reach is that whatever the
run's own history.

Two ceilings (thresholds.py): the logits' RMS standard deviation over the
vocabulary for unit-RMS inputs, ‖W D_γ‖_F/√V, and the standard deviation of
the shift every logit (and log Z) takes together, ‖D_γ w̄‖: the part of the
head that only Adam's normalisation, weight decay and z-loss move
(docs/monitors.md, "Output family"), the drift of Wortsman et al. 2023 §3.2.
"""

from __future__ import annotations

from ckptscan.monitors.output_family import output_findings

__all__ = ["output_findings"]
