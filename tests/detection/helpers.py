"""Synthetic reports for detection tests: metrics chosen per pair, no I/O."""

import math
import random

from ckptscan.layouts.base import ModelInfo
from ckptscan.schema.results import AttentionResult, LayerResult, PairResult, RouterResult, ScanReport, Summary

MODEL = ModelInfo(family="mixtral", num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=2, head_dim=16,
                  num_experts=4, top_k=2)


def layer_result(layer, d2n=0.55, d2n_min=None, dwq=0.8, dwk=0.8, logit=3.0, routing=0.8, cos=-0.3, eps=5.0,
                 dwr=0.78, nonfinite=None, router=True, scale=None):
    attention = AttentionResult(
        delta2_entropy=None, delta2_entropy_min=None, delta2_entropy_norm=d2n, delta3_entropy=None,
        dwq_entropy=None, dwk_entropy=None, dwq_rel_norm=0.1, dwk_rel_norm=0.1, qk_logit_bound=logit,
        delta2_entropy_norm_min=d2n - 0.05 if d2n_min is None and d2n is not None else d2n_min,
        dwq_entropy_norm=dwq, dwk_entropy_norm=dwk, logit_scale=scale,
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


def random_metrics(seed, max_pairs=24):
    """A random run as `compute` would give it, for properties of judging:
    random walks with shifts (so every rule fires now and then), NaN and
    infinite values, layers without attention or router, pairs with an extra
    layer, unnamed checkpoints, a restart whose steps go back, non-finite
    tensors; and random thresholds that let the rules fire on a short run.
    Returns (metrics, thresholds, reference report or None)."""
    from ckptscan.detection.rules import Thresholds
    from ckptscan.pipeline.metrics import Metrics

    rng = random.Random(seed)
    # The attention logit scale from a stream of its own (the seeds pinned as examples keep their runs):
    # a walk that crosses logit_scale_ceiling and falls back under it.
    scales = random.Random(seed ^ 0x5CA1E)
    num_layers = rng.choice([1, 2, 3, 9])
    thresholds = Thresholds(
        warn_sigma=rng.choice([2.0, 3.0, 4.0]), alert_sigma=rng.choice([4.0, 6.0]), consecutive=rng.randint(1, 3),
        cusum_warn=(cusum := rng.choice([2.0, 4.9])), cusum_alert=cusum + rng.choice([0.0, 1.0]),
        pooled_cusum_warn=(pooled := rng.choice([1.5, 4.6])), pooled_cusum_alert=pooled + rng.choice([0.0, 1.0]),
        warmup_pairs=rng.randint(0, 3), warmup_steps=rng.choice([0, 0, 300]),
        baseline_pairs=rng.randint(3, 8), min_baseline_pairs=rng.randint(2, 3), reference_pairs=rng.randint(1, 4),
        cross_layer_min_layers=rng.choice([2, 8]),
        disabled_monitors=tuple(rng.sample(["load_cv", "qk_logit_bound", "epsilon"], rng.randint(0, 1))),
    )

    def run(num_pairs, restart):
        levels = {k: rng.uniform(0.3, 0.9) for k in ("d2n", "dwq", "dwk", "routing", "dwr")}
        levels.update(logit=rng.uniform(1, 5), eps=rng.uniform(0.05, 6), cos=rng.uniform(-0.9, 0.9))
        scale = scales.uniform(0.5, 2.5)
        pairs, step = [], rng.choice([0, 100])
        for i in range(num_pairs):
            if restart is not None and i == restart:
                step = max(0, step - rng.choice([200, 300, 500]))  # resumed from an older checkpoint
            if rng.random() < 0.15:  # a shift: a fault starting, or healthy drift
                key = rng.choice(sorted(levels))
                levels[key] *= rng.choice([0.5, 0.8, 1.2, 2.0])
            scale *= scales.choice([0.7, 1.0, 1.0, 1.5])
            results = []
            for n in range(num_layers + (rng.random() < 0.1)):
                values = {k: v * (1 + rng.gauss(0, 0.03)) for k, v in levels.items()}
                layer_scale = scale * (1 + scales.gauss(0, 0.1))
                if scales.random() < 0.04:
                    layer_scale = scales.choice([math.nan, math.inf, None])
                draw = rng.random()
                if draw < 0.04:
                    values[rng.choice(sorted(values))] = rng.choice([math.nan, math.inf, None])
                result = layer_result(n, router=rng.random() > 0.05, scale=layer_scale, **values,
                                      nonfinite={"W_q": 3} if draw > 0.98 else None)
                if rng.random() < 0.04:
                    result.attention = None
                results.append(result)
            unnamed = rng.random() < 0.05
            pairs.append(PairResult(None if unnamed else step, None if unnamed else step + 100, results,
                                    f"run/checkpoint-{step}", f"run/checkpoint-{step + 100}"))
            step += 100
        return pairs

    num_pairs = rng.randint(0, max_pairs)
    restart = rng.randint(1, num_pairs) if num_pairs > 2 and rng.random() < 0.3 else None
    metrics = Metrics("run", MODEL, [], run(num_pairs, restart), settings={"run": "run"})
    reference = None
    draw = rng.random()
    if draw < 0.3:
        reference = ScanReport("trend", MODEL, [], run(rng.randint(1, 12), None), Summary("ok", [], {}))
    elif draw < 0.5:  # a band of references, of different lengths
        reference = [ScanReport("trend", MODEL, [], run(rng.randint(1, 12), None), Summary("ok", [], {}))
                     for _ in range(rng.randint(2, 3))]
    return metrics, thresholds, reference
