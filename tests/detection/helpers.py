"""Synthetic reports for detection tests: metrics chosen per pair, no I/O."""

import random

from ckptscan.layouts.base import ModelInfo
from ckptscan.results import AttentionResult, LayerResult, PairResult, RouterResult, ScanReport, Summary

MODEL = ModelInfo(family="mixtral", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16,
                  num_experts=4, top_k=2)


def layer_result(layer, d2n=0.55, d2n_min=None, dwq=0.8, dwk=0.8, logit=3.0, routing=0.8, cos=-0.3, eps=5.0,
                 dwr=0.78, nonfinite=None, router=True):
    attention = AttentionResult(
        delta2_entropy=None, delta2_entropy_min=None, delta2_entropy_norm=d2n, delta3_entropy=None,
        dwq_entropy=None, dwk_entropy=None, dwq_rel_norm=0.1, dwk_rel_norm=0.1, qk_logit_bound=logit,
        delta2_entropy_norm_min=d2n - 0.05 if d2n_min is None and d2n is not None else d2n_min,
        dwq_entropy_norm=dwq, dwk_entropy_norm=dwk,
    )
    router_result = RouterResult(epsilon=eps, cosine_similarity=cos, dwr_entropy=None, dwr_entropy_norm=dwr,
                                 routing_entropy_norm=routing) if router else None
    return LayerResult(layer, attention, router_result, nonfinite=nonfinite or {})


def run_report(num_pairs, interval=100, layers=2, seed=0, noise=0.01, **per_pair):
    """A run of `num_pairs` consecutive pairs. Each keyword is a function
    (pair index, layer) -> value for that metric, noise added to entropies."""
    rng = random.Random(seed)
    pairs = []
    for i in range(num_pairs):
        results = []
        for n in range(layers):
            values = {k: f(i, n) for k, f in per_pair.items()}
            for k in ("d2n", "dwq", "dwk", "routing"):
                if k in values and values[k] is not None:
                    values[k] += rng.gauss(0, noise)
                elif k not in values:
                    values[k] = {"d2n": 0.55, "dwq": 0.8, "dwk": 0.8, "routing": 0.8}[k] + rng.gauss(0, noise)
            results.append(layer_result(n, **values))
        pairs.append(PairResult(i * interval, (i + 1) * interval, results,
                                f"run/checkpoint-{i * interval}", f"run/checkpoint-{(i + 1) * interval}"))
    return ScanReport("trend", MODEL, [], pairs, Summary("ok", [], {}))


def alerts(report, family=None):
    return [(p.to_step, layer.layer, f) for p in report.pairs for layer in p.layers for f in layer.findings
            if f.severity == "alert" and (family is None or f.family == family)]
