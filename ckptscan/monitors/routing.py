"""Per-token routing distribution of a MoE router on fixed probe inputs.

Router weights alone say how alike the experts' rows are; how tokens are
actually routed needs the router's inputs. For probe inputs X ∈ R^{T×d} (the
hidden states at the router for a fixed set of tokens) and a router
W ∈ R^{E×d}, each token gets a distribution over all E experts:

    softmax routers (Mixtral, Qwen-MoE, OLMoE):  p = softmax(W x)
    sigmoid routers (DeepSeek-V3):               s = sigmoid(W x), p = s / Σ_e s_e

Both are "normalise the scores", so one code path handles them in log space:
log p = log s − logsumexp(log s) with log s = W x or log σ(W x).

Per token, H(p) = −Σ_e p_e ln p_e (nats; ln E for uniform routing, 0 when one
expert takes everything). Routing collapse drives H down for most tokens at
once; healthy specialisation lowers it slowly. The top-k selection decides
the experts' load: each token picks the k experts with the largest
score + selection bias (DeepSeek-V3's `e_score_correction_bias`, Megatron's
`expert_bias`). The bias moves only the selection, never p, exactly as in
those models.

Using the same probe for every checkpoint isolates the effect of the weight
change from any change in the data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

_F64 = torch.float64
SCORINGS = ("softmax", "sigmoid")
# Tokens whose normalised entropy H/ln E falls below this count as "low
# entropy" (choice: at E = 8 it is H < 0.62 nats, an effective
# number of experts exp(H) below 1.9: the token is routed to about one expert).
LOW_ENTROPY_FLOOR = 0.3
ENTROPY_QUANTILE = 0.05


@dataclass
class RoutingStats:
    """Routing of T probe tokens by one router; floats are float64-exact.

    entropy_p05 is the 5th percentile over tokens (linear interpolation, as
    numpy's default). load_cv uses the population std over experts (the mean
    load is always 1/E): 0 is perfectly even load, √(E/k − 1) the most uneven
    (the same k experts take every token).
    """

    entropy: float  # mean over tokens of H(p), nats
    entropy_p05: float
    entropy_norm: float  # mean over tokens of H(p) / ln E
    low_entropy_share: float  # share of tokens with H(p) / ln E < floor
    load: torch.Tensor  # [E] float64: share of the T·k top-k selections per expert (sums to 1)
    load_cv: float
    dead_experts: int  # experts no probe token selects
    tokens: int
    top_k: int
    floor: float


def routing_log_probs(
    inputs: torch.Tensor,
    weight: torch.Tensor,
    scoring: str = "softmax",
    compute_dtype: torch.dtype = _F64,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Router logits W x and log p for every token: ([T, E], [T, E]) float64.

    The product runs in `compute_dtype`; everything after it in float64.
    """
    if scoring not in SCORINGS:
        raise ValueError(f"router scoring must be one of {SCORINGS}, not {scoring!r}")
    if inputs.ndim != 2 or weight.ndim != 2 or inputs.shape[1] != weight.shape[1]:
        raise ValueError(
            f"probe inputs {list(inputs.shape)} do not match router {list(weight.shape)} ([T, d] vs [E, d])"
        )
    logits = (inputs.to(compute_dtype) @ weight.to(compute_dtype).T).to(_F64)
    log_scores = logits if scoring == "softmax" else torch.nn.functional.logsigmoid(logits)
    return logits, log_scores - torch.logsumexp(log_scores, dim=-1, keepdim=True)


def selection_scores(
    logits: torch.Tensor, log_p: torch.Tensor, scoring: str, bias: torch.Tensor | None
) -> torch.Tensor:
    """What the model ranks for top-k: score + bias, score = p (softmax) or σ(W x) (sigmoid).

    Without a bias the ranking of either score is that of the logits, which
    never tie where a saturated p or σ would (e.g. p underflowing to 0).
    """
    if bias is None:
        return logits
    scores = log_p.exp() if scoring == "softmax" else torch.sigmoid(logits)
    return scores + bias.to(_F64)


def token_entropy(log_p: torch.Tensor) -> torch.Tensor:
    """H(p) = −Σ p ln p over the last dimension (an underflowed p contributes 0)."""
    return -(log_p.exp() * log_p).sum(-1)


def topk_load(scores: torch.Tensor, top_k: int) -> torch.Tensor:
    """Share of the T·k selections each expert receives when every token picks
    its `top_k` largest `scores` [T, E]: [E] float64, sums to 1."""
    tokens, num_experts = scores.shape
    chosen = scores.topk(top_k, dim=-1).indices
    counts = torch.bincount(chosen.reshape(-1), minlength=num_experts).to(_F64)
    return counts / (tokens * top_k)


def routing_stats(
    inputs: torch.Tensor,
    weight: torch.Tensor,
    top_k: int,
    *,
    scoring: str = "softmax",
    selection_bias: torch.Tensor | None = None,
    floor: float = LOW_ENTROPY_FLOOR,
    compute_dtype: torch.dtype = _F64,
) -> RoutingStats:
    """Entropy and load statistics of routing `inputs` [T, d] through `weight` [E, d]."""
    tokens, num_experts = inputs.shape[0], weight.shape[0]
    if tokens < 1:
        raise ValueError("the probe has no tokens")
    if num_experts < 2:
        raise ValueError(f"routing entropy needs at least two experts, the router has {num_experts}")
    if not 1 <= top_k <= num_experts:
        raise ValueError(f"top-k {top_k} is not in 1..{num_experts} (the router's experts)")
    logits, log_p = routing_log_probs(inputs, weight, scoring, compute_dtype)
    entropy = token_entropy(log_p)
    normalized = entropy / math.log(num_experts)
    load = topk_load(selection_scores(logits, log_p, scoring, selection_bias), top_k)
    # Every statistic in one readback (a host sync on a GPU), the load with them.
    values = torch.cat([torch.stack([
        entropy.mean(), torch.quantile(entropy, ENTROPY_QUANTILE), normalized.mean(),
        (normalized < floor).to(_F64).mean(), load.std(correction=0) / load.mean(), (load == 0).sum().to(_F64),
    ]), load]).cpu()
    mean, p05, norm, low, cv, dead = values[:6].tolist()
    return RoutingStats(
        entropy=mean,
        entropy_p05=p05,
        entropy_norm=norm,
        low_entropy_share=low,
        load=values[6:],
        load_cv=cv,
        dead_experts=int(dead),
        tokens=tokens,
        top_k=top_k,
        floor=floor,
    )
