"""Plain dataclasses the library returns; reports render them, nothing else.

Field names are the JSON report's keys (a public interface: add fields
freely, never rename or drop one without bumping SCHEMA_VERSION). Floats are
plain Python floats; a value that could not be computed is None, never NaN.
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Callable

SCHEMA_VERSION = 1

# Severity order used by every rule and the CI gate.
SEVERITIES = ("ok", "info", "warn", "alert")

# The status of a pair, a layer or a run that was not judged (warm-up, no baseline yet): never "ok".
NOT_JUDGED = "not_judged"
# The CI gate's order of verdicts (`--fail-on LEVEL` fails those at LEVEL or after it). A run that could
# not be judged comes after a warning, which is a judgement, and before an alert, which is evidence of a
# fault: the level not_judged fails an alert and an unjudged run and passes a warning.
GATE_ORDER = ("ok", "info", "warn", NOT_JUDGED, "alert")
# The levels `--fail-on` and the config's `fail_on` take, and the default. The default stays `alert`,
# what the gate failed on before the level existed (users' CI keeps its exit codes); the verdict of
# an unjudged run says NOT JUDGED, never HEALTHY, and `--fail-on not_judged` fails it.
FAIL_ON_LEVELS = ("warn", NOT_JUDGED, "alert")
DEFAULT_FAIL_ON = "alert"
# The kinds of skipped checkpoint (a skipped entry's "kind", a public JSON value).
IN_PROGRESS, CORRUPT, DUPLICATE, NO_STEP = "in_progress", "corrupt", "duplicate", "no_step"
SKIPPED_KINDS = (IN_PROGRESS, CORRUPT, DUPLICATE, NO_STEP)


@dataclass(frozen=True)
class ModelInfo:
    """The model a report describes (its "model" key): family and head geometry, as its layout read them."""

    family: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    num_experts: int | None = None
    top_k: int | None = None
    # "softmax" or "sigmoid" where the config or the architecture says; None when unknown.
    router_scoring: str | None = None
    # MLA (DeepSeek): rows of the rope key shared by all heads, monitored as
    # its own one-KV-head term (`LayerWeights.rope_q/rope_k`); head_dim is the
    # content ("nope") part then.
    rope_head_dim: int | None = None


def reaches(status: str, level: str) -> bool:
    """Whether a verdict or a finding's severity fails a gate at `level` (GATE_ORDER; "unchanged" never does)."""
    return status in GATE_ORDER and GATE_ORDER.index(status) >= GATE_ORDER.index(level)


def worst(statuses: list[str]) -> str:
    """The most severe of `statuses` in SEVERITIES' order; others ("unchanged") are ignored."""
    ranked = [s for s in statuses if s in SEVERITIES]
    return max(ranked, key=SEVERITIES.index, default="ok")


def counted(count: int, noun: str) -> str:
    """"1 pair", "2 pairs": a count with its noun (regular plurals only)."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def step_text(step: int | None) -> str:
    """A step as a sentence names it: "?" where it is not known."""
    return str(step) if step is not None else "?"


def status_word(status: str) -> str:
    """A status as a heading shows it: "ALERT", "NOT JUDGED"."""
    return status.upper().replace("_", " ")


@dataclass(slots=True)
class Finding:
    monitor: str  # metric name, e.g. "delta2_entropy_norm"
    family: str  # "attention" | "router" | "numeric"
    severity: str  # "info" | "warn" | "alert"
    value: float | None
    message: str
    baseline: float | None = None
    threshold: float | None = None
    # Which rule produced it, e.g. "nonfinite", "floor", "cross_layer", "trend", "level", "reference",
    # "cusum", "pooled_cusum" (for these two, score and threshold are the CUSUM statistic's) or
    # "layer_band" (a layer's mean departure from a band of references, in band sigmas) or "run_band"
    # (that mean over every layer).
    rule: str | None = None
    # Series rules: robust sigmas beyond the baseline on the alarm side, and
    # the step of the first pair of the consecutive run that raised the finding.
    score: float | None = None
    onset_step: int | None = None


@dataclass(slots=True)
class SeriesPoint:
    """What detection saw at one point of a (layer, monitor) series: the
    value, what it was judged against and by which rule. Renderers draw
    these; they never judge again."""

    state: str  # "warmup" | "baseline" | "ok" | "warn" | "alert"
    value: float | None = None
    expected: float | None = None  # the value the rule expected here
    warn_at: float | None = None  # where the point would reach warn (alarm side)
    alert_at: float | None = None  # likewise for alert
    rule: str | None = None  # "trend" | "level" | "reference": the rule that saw the largest departure
    score: float | None = None  # robust sigmas beyond `expected` on the alarm side
    onset_step: int | None = None  # newer step of the first pair of the current run of departures
    # The series' CUSUM of departures after this point (robust σ accumulated);
    # it is judged against report.thresholds' cusum_warn / cusum_alert.
    cusum: float | None = None


@dataclass(slots=True)
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
    logit_scale: float | None = None


@dataclass(slots=True)
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
    # Whole-matrix ΔW_q / ΔW_k spectra (H·r × d), only with --full-spectrum (O(d³)).
    dwq_full_entropy: float | None = None
    dwq_full_entropy_norm: float | None = None
    dwk_full_entropy: float | None = None
    dwk_full_entropy_norm: float | None = None
    # MLA (DeepSeek) only: the decoupled rope term, every query head's rope rows
    # against the one shared rope key; means over heads like the fields above.
    rope_delta2_entropy: float | None = None
    rope_delta2_entropy_norm: float | None = None
    rope_dwq_entropy: float | None = None
    rope_dwk_entropy: float | None = None
    rope_qk_logit_bound: float | None = None
    unchanged: bool = False
    # The newer checkpoint's attention logit scale, max over heads: the logits' standard deviation
    # for isotropic unit-RMS inputs (monitors.attention.logit_scale); None with a QK-norm, or where
    # the layout gives no input-norm gain.
    logit_scale: float | None = None
    # With a per-head QK-norm: the largest logit its gains allow (monitors.attention.qk_norm_logit_bound).
    qk_norm_logit_bound: float | None = None
    # cos(W(a), W(b)) of the layer's W_q and W_k: near 1 within a run, ≈ 0 for unrelated weights.
    q_weight_cosine: float | None = None
    k_weight_cosine: float | None = None


@dataclass(slots=True)
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
    # Probe routing (null without --probe): state at b, *_change is b − a.
    routing_entropy: float | None = None  # mean over probe tokens of H(p), nats
    routing_entropy_p05: float | None = None  # 5th percentile over tokens
    load_cv: float | None = None
    dead_experts: int | None = None
    routing_entropy_norm: float | None = None  # mean H(p) / ln E
    routing_entropy_change: float | None = None
    routing_entropy_p05_change: float | None = None
    low_entropy_share: float | None = None  # share of probe tokens with H(p)/ln E < 0.3 (monitors/routing.py)
    low_entropy_share_change: float | None = None
    load_cv_change: float | None = None
    expert_load: list[float] | None = None  # share of the T·k top-k selections per expert
    routing_top_k: int | None = None  # k used for load (config's, or 2 when the config has none)
    unchanged: bool = False


@dataclass(slots=True)
class LayerResult:
    layer: int
    attention: AttentionResult | None = None
    router: RouterResult | None = None
    status: str = "ok"
    findings: list[Finding] = field(default_factory=list)
    # Non-finite value counts per monitored tensor role, e.g. {"W_q": 3}.
    nonfinite: dict[str, int] = field(default_factory=dict)
    # Per monitored role: the dtype it is stored in at the newer checkpoint
    # (e.g. {"W_q": "BF16"}) and the fraction of its elements that differ
    # between the two checkpoints (detection/numerics.py reads both).
    stored_dtype: dict[str, str] = field(default_factory=dict)
    changed_fraction: dict[str, float] = field(default_factory=dict)
    # Per judged monitor (trend runs): detection's verdict on this pair.
    judgements: dict[str, SeriesPoint] = field(default_factory=dict)
    # Values of the families with their own `compute` (ckptscan/monitors/spec.py), family -> monitor -> value;
    # left out of the JSON report while empty (no such family is registered).
    families: dict[str, dict[str, float | None]] = field(default_factory=dict)


@dataclass(slots=True)
class PairResult:
    from_step: int | None
    to_step: int | None
    layers: list[LayerResult]
    from_path: str = ""
    to_path: str = ""
    status: str = "ok"
    # Mean training loss over the updates between the two checkpoints (logged
    # steps from_step … to_step − 1), when a loss log was given; None if any
    # of them was non-finite or none was logged.
    loss: float | None = None
    # Mean learning rate of those updates, where the run states it (a loss
    # log's `lr`, or the older checkpoint's saved scheduler state); None otherwise.
    lr: float | None = None
    # Why the pair was not judged (its status is then "not_judged" unless an absolute rule fired:
    # non-finite values, the hard floors); None when it was.
    not_judged_reason: str | None = None


@dataclass
class CheckpointRef:
    path: str
    step: int | None


# The words of a plan's reason (and a rejected candidate's "why") for a first checkpoint other than the
# initialisation, which is not proposed: written by detection/resume.py, shortened by report/resume.py.
UNMEASURED = ("its own signals were not measured: it is the older checkpoint of the first pair, and ckptscan "
              "measures a checkpoint as the newer one of a pair")


@dataclass
class Resume:
    """Where to resume training after an alert, and how (`summary.resume`;
    detection/resume.py, docs/guides/resume.md). Every checkpoint proposed was
    judged on its own: its absolute signals under the ceilings the report
    applies, and the update into it within the run's healthy history."""

    # The checkpoint to resume from; None when no saved checkpoint before the departure holds.
    checkpoint: CheckpointRef | None
    # Why it holds (its signals against their ceilings), or why none does, in one sentence.
    reason: str
    # The newer candidates passed over, newest first: [{"path", "step", "why"}] (why each fails its own check).
    rejected: list[dict[str, Any]] = field(default_factory=list)
    # The updates within which the departure began, from the resume point to the first alert: a trainer
    # may skip their batches. First and last update, both included; None when the steps are not named.
    skip_first_step: int | None = None
    skip_last_step: int | None = None
    # When a rise of the learning rate caused the first alert: {"current", "resume_with", "rise_from_step",
    # "rise_to_step", "source"}, back to the rate before the rise.
    lr: dict[str, Any] | None = None
    # The interventions already listed (summary.interventions), by their short names.
    interventions: list[str] = field(default_factory=list)
    # In the trainer's own words, where the run's folder naming names it: {"framework", "evidence",
    # "arguments": [str], "skip", "source"} (ckptscan/trainers.py); None elsewhere (the plan stays generic).
    trainer: dict[str, Any] | None = None


@dataclass
class LayerSummary:
    """One layer over a whole run: its worst status and its first alarm."""

    layer: int
    status: str
    first_alert_step: int | None = None
    first_alert_family: str | None = None
    first_alert_monitor: str | None = None
    first_warn_step: int | None = None
    # Headline monitors at the newest pair, and the baseline each is judged against.
    current: dict[str, float | None] = field(default_factory=dict)
    baseline: dict[str, float | None] = field(default_factory=dict)


@dataclass
class Summary:
    status: str
    flagged_layers: list[int]
    first_alert_step: dict[str, int | None]
    rollback_candidate: CheckpointRef | None = None
    first_warn_step: dict[str, int | None] = field(default_factory=dict)
    first_family: str | None = None
    message: str = ""
    first_alert_onset_step: int | None = None  # where the departure that raised the first alert began
    loss_divergence_step: int | None = None
    lead_steps: int | None = None  # loss_divergence_step − first alert step (positive: the alert came first)
    layers: list[LayerSummary] = field(default_factory=list)
    # What the literature does about each alerting family: [{family, action, source}]
    # (ckptscan/monitors/interventions.py).
    interventions: list[dict[str, str]] = field(default_factory=list)
    # Which mechanism came first (detection/summary.py): among the families alerting on the first alerting
    # pair, the one whose departure began earliest, then went furthest past its alert level; why, in one
    # sentence; and the other families that alerted, in the order they did. None / [] without an alert, and
    # when the first alert is that a pair is not an update of one run. first_family equals primary_family.
    primary_family: str | None = None
    primary_family_reason: str | None = None
    secondary_families: list[str] = field(default_factory=list)
    # What the verdict rests on: the pairs judged by every rule of their position (a run's pairs after its
    # warm-up once the series have a baseline, or a pair judged alone), and what was not judged and why
    # (warm-up pairs, pairs without a baseline yet, routing without a probe, an order no step tells).
    # status is "not_judged" when no pair was judged and no absolute rule fired; not_judged_reason then
    # says why, in one sentence.
    judged_pairs: int | None = None
    not_judged: list[str] = field(default_factory=list)
    not_judged_reason: str | None = None
    # After an alert: the checkpoint to resume from (verified on its own, or none), the steps to skip, the
    # learning rate to go back to and the trainer's arguments (`Resume`). None without an alert, and when
    # the input is not an update of one run.
    resume: Resume | None = None


# Keys of the summary added since reports were first written, which a report loaded from a file without one
# leaves out again when it writes that report (`document/plain.py`): absent says the version that wrote it
# did not compute it, where `null` says there is nothing (`resume`: no alert, or not one run). The loader
# (`document/reading.py`) names them on the loaded Summary under the attribute WRITTEN_WITHOUT, not a field.
ADDED_SUMMARY_KEYS = ("resume",)
WRITTEN_WITHOUT = "_written_without"


@dataclass
class ScanReport:
    command: str
    model: ModelInfo
    checkpoints: list[CheckpointRef]
    pairs: list[PairResult]
    summary: Summary
    thresholds: dict[str, Any] = field(default_factory=dict)
    skipped: list[dict[str, str]] = field(default_factory=list)
    # How the pairs were formed and judged (pairing, stride, reference run, loss log, warm-up).
    settings: dict[str, Any] = field(default_factory=dict)
    probe: str | None = None  # the --probe file whose router inputs gave the routing_* fields


def from_dict(cls: type, data: Any) -> Any:
    """Rebuild a result dataclass from `dataclasses.asdict` output (the
    incremental cache, a reference report). Keys this version does not know
    are ignored and missing keys take their defaults, so reports written by
    other versions still load."""
    names, builders = _field_plan(cls)
    # The whole dict at once where every key is a field (nearly always): a
    # re-run of a long trend rebuilds ~10⁵ objects, and a Python loop over
    # each one's fields was most of it.
    kwargs = dict(data) if data.keys() <= names else {k: v for k, v in data.items() if k in names}
    for name, build in builders:
        value = kwargs.get(name)
        if value is not None:
            kwargs[name] = build(value)
    return cls(**kwargs)


@functools.cache
def _field_plan(cls: type) -> tuple[frozenset[str], tuple[tuple[str, Callable[[Any], Any]], ...]]:
    """The class's field names, and the builder of each field whose JSON
    value is not already its value. Resolving string annotations costs ~1 ms
    a class: worked out once per class."""
    hints = typing.get_type_hints(cls)
    fields = dataclasses.fields(cls)
    builders = tuple((f.name, build) for f in fields if (build := _builder(hints[f.name])) is not None)
    return frozenset(f.name for f in fields), builders


@functools.cache
def _builder(hint: Any) -> Callable[[Any], Any] | None:
    """How to rebuild a non-None value of type `hint`; None where the JSON
    value is already it (numbers, strings, and lists and dicts of them)."""
    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        members = [a for a in typing.get_args(hint) if a is not type(None)]
        classes = [a for a in members if dataclasses.is_dataclass(a)]
        plain = _builder(members[0])
        if not classes:
            return plain
        nested = _dataclass_builder(classes[0])
        if plain is None:
            return lambda value: nested(value) if isinstance(value, dict) else value
        return lambda value: nested(value) if isinstance(value, dict) else plain(value)
    if origin is list:
        element = _builder(typing.get_args(hint)[0])
        if element is None:
            return list
        return lambda value: [None if v is None else element(v) for v in value]
    if origin is dict:
        item = _builder(typing.get_args(hint)[1])
        if item is None:
            return None
        return lambda value: {k: None if v is None else item(v) for k, v in value.items()}
    if dataclasses.is_dataclass(hint):
        return _dataclass_builder(hint)
    return None


def _dataclass_builder(cls: Any) -> Callable[[Any], Any]:
    """How to rebuild dataclass `cls` from its JSON object."""
    return lambda value: from_dict(cls, value)


@dataclass
class SweepRun:
    """One run of a sweep, judged against the others."""

    path: str
    rank: int  # 1: the healthiest
    status: str  # the run's verdict against the others ("ok", "warn", "alert", ...)
    first_alert_step: int | None  # the earliest step any family alerted at
    first_warn_step: int | None  # the earliest step any family warned at
    family: str | None  # the family that alerted (or warned) first: summary.primary_family, else first_family
    references: list[str]  # the runs it was judged against
    report: ScanReport  # its full report, judged against `references`

    @property
    def first_step(self) -> int | None:
        """The first step at the run's status: its first alert, or first warning."""
        return {"alert": self.first_alert_step, "warn": self.first_warn_step}.get(self.status)


@dataclass
class SweepReport:
    runs: list[SweepRun]  # ranked, healthiest first
    status: str  # the worst run's
    notes: list[str] = field(default_factory=list)  # how the runs were aligned, where references fell short
    fail_on: str = DEFAULT_FAIL_ON  # the config's gate level
    left_out: list[str] = field(default_factory=list)  # runs left out of the others' bands: they alert against all
