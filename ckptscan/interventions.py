"""What training teams do about each alert family, from the literature.

An alert says what failed (family, layers, heads, the rollback candidate);
these say what is usually done about that mechanism, each with the paper
that reports it. They are pointers for the person deciding, not
prescriptions: ckptscan does not know the model's recipe. Each source was
checked for the action attributed to it (arXiv ids;
docs/guides/alert-destinations.md, "What to do about an alert").

The judged report's summary lists them for its alerting families
(`summary.interventions`, filled by `interventions_for` at the end of
`judge`); the terminal table, the HTML report and `--notify` show them
after the rollback line.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from ckptscan.schema.results import Summary


@dataclass(frozen=True)
class Intervention:
    family: str  # "attention" | "router" | "numeric" | "update" | "output"
    short: str  # a few words, for one terminal line per family
    action: str
    source: str  # authors, year and arXiv id


# Any alert: the rollback the summary names, as PaLM restarts.
RESTART = ("restart from the rollback, skipping batches", "restart from the rollback candidate, skipping the batches "
           "seen since (PaLM: ~100 steps before the spike, 200-500 batches skipped)",
           "Chowdhery et al. 2022, arXiv:2204.02311")

_ACTIONS: dict[str, tuple[tuple[str, str, str], ...]] = {
    "attention": (
        ("QK-norm", "normalize queries and keys before their dot product (QK-layernorm / QK-norm)",
         "Wortsman et al. 2023, arXiv:2309.14322; OLMo 2, arXiv:2501.00656"),
        ("logit soft-capping", "cap the attention logits: tanh soft-capping (Gemma 2, cap 50), or softmax capping "
         "with QK-norm",
         "Gemma 2, arXiv:2408.00118; Rybakov et al. 2024, arXiv:2410.16682"),
        ("QK-Clip", "rescale a head's W_q and W_k after an update whose max attention logit exceeds a threshold "
         "(QK-Clip)",
         "Kimi K2, arXiv:2507.20534"),
        ("σReparam", "reparametrize the linear layers with spectral normalization and a learned scalar (sigmaReparam), "
         "which prevents attention entropy collapse", "Zhai et al. 2023, arXiv:2303.06296"),
        ("lower LR", "lower the learning rate: attention-logit growth is a high-learning-rate instability",
         "Wortsman et al. 2023, arXiv:2309.14322"),
        RESTART,
    ),
    "router": (
        ("router z-loss", "add the router z-loss, which penalizes large router logits (ST-MoE: coefficient "
         "1e-3)",
         "Zoph et al. 2022 (ST-MoE), arXiv:2202.08906"),
        ("float32 router, smaller init", "compute the router in float32 (selective precision) and initialize "
         "it smaller",
         "Fedus et al. 2021 (Switch Transformer), arXiv:2101.03961"),
        ("larger load-balancing coefficient", "raise the load-balancing loss coefficient (Switch Transformer: 1e-2)",
         "Fedus et al. 2021 (Switch Transformer), arXiv:2101.03961"),
        ("expert choice or capacity factor", "route by expert choice (balanced by construction, not causal) or "
         "change the capacity factor",
         "Zhou et al. 2022, arXiv:2202.09368"),
        RESTART,
    ),
    "update": (
        ("lower LR", "lower the learning rate (or restore the one the run had: check the LR a resumed job took from "
         "its flags against the scheduler state it saved)", "Wortsman et al. 2023, arXiv:2309.14322"),
        ("longer warm-up", "lengthen the learning-rate warm-up, which makes the loss less sensitive to the learning "
         "rate",
         "Wortsman et al. 2023, arXiv:2309.14322"),
        ("update clipping", "clip each update's RMS as Adafactor does (StableAdamW), for updates that outgrow a "
         "decayed second-moment estimate", "Wortsman et al. 2023, arXiv:2304.13013"),
        RESTART,
    ),
    # ---- Output family ----
    "output": (
        ("z-loss", "add the z-loss 1e-4·log²Z to the loss, which keeps log Z (the output logits' common shift) "
         "near 0", "Wortsman et al. 2023, arXiv:2309.14322; PaLM, arXiv:2204.02311"),
        ("weight decay on the head", "apply weight decay to the LM head (and a tied embedding): without it the "
         "output logits drift", "Wortsman et al. 2023, arXiv:2309.14322"),
        ("lower LR", "lower the learning rate: output-logit divergence appears at high learning rates",
         "Wortsman et al. 2023, arXiv:2309.14322"),
        RESTART,
    ),
    # ---- end output family ----
    # The optimizer family (detection/optimizer.py): second moments decayed below ε².
    "optimizer": (
        ("lower β₂", "lower β₂ so the second-moment estimate is not out of date when gradients return (loss spikes "
         "follow an out-of-date estimate)", "Wortsman et al. 2023, arXiv:2304.13013"),
        ("update clipping", "clip each update's RMS as Adafactor does (StableAdamW), for updates that outgrow a "
         "decayed second-moment estimate", "Wortsman et al. 2023, arXiv:2304.13013"),
        RESTART,
    ),
    "numeric": (
        RESTART,
        ("float32 softmax and router", "keep numerically sensitive parts (softmax, router) in float32 rather "
         "than bfloat16 (selective precision)",
         "Fedus et al. 2021 (Switch Transformer), arXiv:2101.03961"),
    ),
}
INTERVENTIONS: dict[str, tuple[Intervention, ...]] = {
    family: tuple(Intervention(family, short, action, source) for short, action, source in actions)
    for family, actions in _ACTIONS.items()
}


def interventions_for(summary: Summary) -> list[dict[str, str]]:
    """The interventions of the families that alerted, the first family to
    alert first (then by first alert step); an action shared by several
    families (the restart) is listed once, under the first."""
    if summary.first_family is None:  # no alert, or the input is not an update of one run: nothing to train differently
        return []
    alerted = [(step, family) for family, step in summary.first_alert_step.items() if step is not None]
    if summary.first_family not in {family for _, family in alerted}:  # named as the cause without alerting itself
        alerted.append((None, summary.first_family))
    order = sorted(alerted, key=lambda sf: (sf[1] != summary.first_family, sf[0] or 0))
    listed: list[dict[str, str]] = []
    seen: set[str] = set()
    for _, family in order:
        for intervention in INTERVENTIONS.get(family, ()):
            if intervention.action not in seen:
                seen.add(intervention.action)
                listed.append(asdict(intervention))
    return listed


def intervention_lines(summary: Summary) -> list[str]:
    """One line per intervention, with its source: the HTML report and notifications."""
    return [f"{i['family']}: {i['action']} [{i['source']}]" for i in summary.interventions]


def family_lines(summary: Summary) -> list[str]:
    """One short line per alerting family, for the terminal; the actions in
    full, with their sources, are in the JSON and the HTML report."""
    by_family: dict[str, list[str]] = {}
    for i in summary.interventions:
        by_family.setdefault(i["family"], []).append(i.get("short") or i["action"])
    return [f"{family}: {' · '.join(shorts)}" for family, shorts in by_family.items()]
