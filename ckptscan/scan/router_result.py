"""A pair's router result: the router weights' change (`ckptscan.monitors.router`)
and, with a probe, the routing it produces at each checkpoint."""

from __future__ import annotations

from ckptscan.layouts import LayerWeights
from ckptscan.monitors.router import router_metrics
from ckptscan.monitors.routing import RoutingStats
from ckptscan.schema.results import RouterResult
from ckptscan.scan.summaries import finite_or_none


def router_result(
    a: LayerWeights, b: LayerWeights, routing_a: RoutingStats | None, routing_b: RoutingStats | None
) -> RouterResult:
    m = router_metrics(a.router, b.router, a.router_bias, b.router_bias)
    unchanged = bool(m.dwr.unchanged)
    result = RouterResult(
        epsilon=finite_or_none(m.epsilon),
        cosine_similarity=finite_or_none(m.cosine_similarity),
        dwr_entropy=None if unchanged else float(m.dwr.entropy),
        epsilon_change=finite_or_none(m.epsilon - m.epsilon_base),
        cosine_similarity_change=finite_or_none(m.cosine_similarity - m.cosine_similarity_base),
        dwr_entropy_norm=None if unchanged else float(m.dwr.normalized_entropy),
        dwr_rel_norm=finite_or_none(m.dwr_rel_norm),
        bias_spread=m.bias_spread,
        bias_spread_change=None if m.bias_spread is None else m.bias_spread - (m.bias_spread_base or 0.0),
        unchanged=unchanged,
    )
    if routing_b is not None:
        _fill_routing(result, routing_a, routing_b)
    return result


def _fill_routing(result: RouterResult, a: RoutingStats | None, b: RoutingStats) -> None:
    """Probe routing state at the newer checkpoint and its change from the older."""
    result.routing_entropy = finite_or_none(b.entropy)
    result.routing_entropy_p05 = finite_or_none(b.entropy_p05)
    result.routing_entropy_norm = finite_or_none(b.entropy_norm)
    result.low_entropy_share = b.low_entropy_share
    result.load_cv = finite_or_none(b.load_cv)
    result.dead_experts = b.dead_experts
    result.expert_load = b.load.tolist()
    result.routing_top_k = b.top_k
    if a is not None:
        result.routing_entropy_change = finite_or_none(b.entropy - a.entropy)
        result.routing_entropy_p05_change = finite_or_none(b.entropy_p05 - a.entropy_p05)
        result.low_entropy_share_change = b.low_entropy_share - a.low_entropy_share
        result.load_cv_change = finite_or_none(b.load_cv - a.load_cv)
