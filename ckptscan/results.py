"""Plain dataclasses the library returns; reports render them, nothing else.

Field names are the JSON report's keys (a public interface: add fields
freely, never rename or drop one without bumping SCHEMA_VERSION). Floats are
plain Python floats; a value that could not be computed is None, never NaN.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ckptscan.layouts.base import ModelInfo

SCHEMA_VERSION = 1

# Severity order used by every rule and the CI gate.
SEVERITIES = ("ok", "info", "warn", "alert")
FAMILIES = ("attention", "router", "numeric")


@dataclass
class Finding:
    monitor: str  # metric name, e.g. "delta2_entropy_norm"
    family: str  # "attention" | "router" | "numeric"
    severity: str  # "info" | "warn" | "alert"
    value: float | None
    message: str
    baseline: float | None = None
    threshold: float | None = None
    rule: str | None = None  # which rule produced it, e.g. "floor", "cross_layer"


@dataclass
class HeadResult:
    head: int
    kv_head: int
    delta2_entropy: float | None
    delta3_entropy: float | None
    dwq_entropy: float | None
    dwk_entropy: float | None
    delta1_entropy: float | None = None
    delta2_entropy_norm: float | None = None
    q_spectral_norm: float | None = None
    qk_logit_bound: float | None = None


@dataclass
class AttentionResult:
    """Layer-level values are means over heads (unchanged heads excluded)."""

    delta2_entropy: float | None
    delta2_entropy_min: float | None
    delta2_entropy_norm: float | None
    delta3_entropy: float | None
    dwq_entropy: float | None
    dwk_entropy: float | None
    dwq_rel_norm: float | None
    dwk_rel_norm: float | None
    qk_logit_bound: float | None  # max over heads, at the newer checkpoint
    heads: list[HeadResult] = field(default_factory=list)
    delta2_entropy_worst_head: int | None = None
    delta2_entropy_norm_min: float | None = None
    delta2_effective_rank: float | None = None
    delta1_entropy: float | None = None
    dwq_entropy_norm: float | None = None
    dwk_entropy_norm: float | None = None
    q_spectral_norm_max: float | None = None
    q_spectral_norm_growth: float | None = None  # max_h ‖Q_h(b)‖₂ / ‖Q_h(a)‖₂
    unchanged: bool = False


@dataclass
class RouterResult:
    """State metrics describe the newer checkpoint; *_change is b − a."""

    epsilon: float | None
    cosine_similarity: float | None
    dwr_entropy: float | None
    epsilon_change: float | None = None
    cosine_similarity_change: float | None = None
    dwr_entropy_norm: float | None = None
    dwr_rel_norm: float | None = None
    bias_spread: float | None = None
    bias_spread_change: float | None = None
    routing_entropy: float | None = None
    routing_entropy_p05: float | None = None
    load_cv: float | None = None
    dead_experts: int | None = None
    unchanged: bool = False


@dataclass
class LayerResult:
    layer: int
    attention: AttentionResult | None = None
    router: RouterResult | None = None
    status: str = "ok"
    findings: list[Finding] = field(default_factory=list)
    # Non-finite value counts per monitored tensor role, e.g. {"W_q": 3}.
    nonfinite: dict[str, int] = field(default_factory=dict)


@dataclass
class PairResult:
    from_step: int | None
    to_step: int | None
    layers: list[LayerResult]
    from_path: str = ""
    to_path: str = ""
    status: str = "ok"


@dataclass
class CheckpointRef:
    path: str
    step: int | None


@dataclass
class Summary:
    status: str
    flagged_layers: list[int]
    first_alert_step: dict[str, int | None]
    rollback_candidate: CheckpointRef | None = None
    first_warn_step: dict[str, int | None] = field(default_factory=dict)
    first_family: str | None = None
    message: str = ""


@dataclass
class ScanReport:
    command: str
    model: ModelInfo
    checkpoints: list[CheckpointRef]
    pairs: list[PairResult]
    summary: Summary
    thresholds: dict[str, Any] = field(default_factory=dict)
    skipped: list[dict[str, str]] = field(default_factory=list)
