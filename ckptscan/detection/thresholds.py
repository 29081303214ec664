"""The thresholds of every rule (`[thresholds]` in ckptscan.toml; JSON report "thresholds")."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace

from ckptscan.detection.catalog import judged_by_name
from ckptscan.detection.series import SeriesSettings
from ckptscan.errors import CkptScanError


@dataclass(frozen=True)
class Thresholds:
    # Series rule: a departure of ≥ warn_sigma (alert_sigma) robust sigmas
    # toward a monitor's alarm side, on `consecutive` pairs in a row.
    warn_sigma: float = 4.0
    alert_sigma: float = 6.0
    consecutive: int = 2
    # Sequential rule (CUSUM of each series' departures, robust sigmas): each
    # pair adds min(departure, cusum_cap) − cusum_drift, the sum floored at 0;
    # warn/alert when it reaches cusum_warn/cusum_alert. pooled_cusum_*: the
    # same on the departures of one monitor summed over layers / √layers.
    # Calibrated on healthy runs to ≤ 1 alert (10 warnings) per 100 healthy
    # run-lengths: experiments/calibrate.py, docs/calibration.md. cusum_warn
    # lies between the specific monitors' 10 % quantile (4.03) and the alert;
    # the warn-only monitors' 10 % quantile (8.4, generation 3) is above the
    # alert level, so they warn more often than that on such runs.
    cusum_drift: float = 1.0
    cusum_cap: float = 6.0
    cusum_warn: float = 4.9
    cusum_alert: float = 5.0
    pooled_cusum_warn: float = 4.6
    pooled_cusum_alert: float = 4.6
    # Warm-up: pairs starting before this step, and at least the first
    # `warmup_pairs` pairs, are not judged (except for non-finite values).
    warmup_steps: int = 0
    warmup_pairs: int = 2
    # Baselines: the last `baseline_pairs` healthy pairs; none before `min_baseline_pairs`.
    baseline_pairs: int = 8
    min_baseline_pairs: int = 5
    # Reference run (--reference): the `reference_pairs` reference pairs nearest
    # in step give the expected value; their sigma is widened by
    # `reference_scale_factor` for the spread between runs (seeds, data order).
    # Calibrated like the CUSUM thresholds (experiments/calibrate.py): each
    # healthy calibration run against the healthy run of its recipe with
    # another seed departs by at most 11.3 of the reference's sigmas on two
    # pairs in a row; the Gumbel 1 % quantile, 15.35, over alert_sigma is 2.56.
    reference_pairs: int = 5
    reference_scale_factor: float = 2.6
    # Several references (a band, detection/reference.py): the band's sigma
    # (spread between the references and their jitter) is scaled by
    # `band_scale_factor` for the monitors of an update (Δ2 and ΔW entropies)
    # and by `band_state_scale_factor` for those of one checkpoint (the logit
    # bound, whose level each seed sets for good). Calibrated leave-one-out:
    # each of the 30 healthy calibration runs (generation 2: four seeds per
    # recipe; generation 3: three) against the band of the other healthy runs
    # of its recipe, warm-up pairs included, departs by at most 3.6 (update
    # monitors; Gumbel 1 % quantile 4.06 / alert_sigma → 0.68, rounded up) and
    # 8.6 band sigmas (logit bound; 9.26 / 6 → 1.55) on two pairs in a row.
    band_scale_factor: float = 0.7
    # Attention logit scale (monitors.attention.logit_scale, the logits'
    # standard deviation for unit-RMS inputs): its healthy level grows with
    # the model, so the ceiling does, as √(d_model / logit_scale_width)
    # above logit_scale_width (`at_width`: 2 at d_model 64, 2.83 at 128, 4 at
    # 256). Healthy calibration runs reach at most 0.65 of it at every width
    # (1.19 at d_model 64, 1.08 at 128, 2.60 at 256: generation 3's seeds);
    # at one recipe the width controls double from d_model 128 to 256 (0.63 →
    # 1.22), at generation 4's the healthy level grows ×1.15 from 64 to 128:
    # √d lies between. Runs whose logged attention logits pass 100 are at
    # 1.29 times it or more (median 2.9) by their first checkpoint after
    # (experiments/natural.py --calibrate, docs/calibration.md). With a
    # per-head QK-norm the gains bound every logit (qk_norm_logit_bound):
    # above qk_norm_logit_ceiling softmax can be one-hot (e^100 between two keys).
    logit_scale_ceiling: float = 2.0
    logit_scale_width: int = 64
    qk_norm_logit_ceiling: float = 100.0
    band_state_scale_factor: float = 1.6
    # ---- Output family (detection/output.py) ----
    # The output logit scale ‖W_head D_γ‖_F/√V and the log Z shift scale
    # ‖D_γ w̄‖ (monitors/output.py), logits' standard deviations for unit-RMS
    # inputs. Not calibrated against an output-logit divergence: no run of
    # generation 4 had one (the no-weight-decay runs' logged mean log Z rises
    # like the healthy runs', to 7.3, never drifting negative). Ceilings at
    # twice the largest value of the 9 healthy calibration runs across the
    # four recipes (4.37 and 3.52, a 2,000-step MoE run's last checkpoint;
    # held-out healthy runs: 4.31 and 3.50; the unstable runs: at most 4.73
    # and 3.89; experiments/natural.py --calibrate), rounded up to a half:
    # they may miss a divergence, not alarm on these runs.
    output_logit_scale_ceiling: float = 9.0
    output_shift_ceiling: float = 7.5
    # ---- end output family ----
    # A layer's attention update monitors together against a band (rule
    # "layer_band", detection/layer_band.py): their mean departure in band
    # sigmas on two pairs in a row. Calibrated on the same 30 leave-one-out
    # bands: healthy maxima at most 2.2, Gumbel 10 % / 1 % quantiles.
    layer_band_warn: float = 2.2
    layer_band_alert: float = 2.9
    # The same mean over every layer (rule "run_band"): healthy maxima at
    # most 1.02 on the same bands, Gumbel 10 % / 1 % quantiles 1.02 / 1.31.
    run_band_warn: float = 1.1
    run_band_alert: float = 1.4
    # Hard floors (alerts whatever the history): a normalised Δ2 entropy this
    # low means the update of every head concentrates on ~1 direction.
    delta2_entropy_norm_floor: float = 0.2
    # ε this small bounds every pair of router rows to cosine ≥ ~0.65.
    epsilon_floor: float = 0.1
    # Mean normalised routing entropy this low: tokens go to about one expert.
    routing_entropy_norm_floor: float = 0.1
    # Cross-layer rule: robust z-score of a layer's normalised Δ2 entropy
    # against the other layers of the same pair (one-sided, low side).
    cross_layer_z_warn: float = 4.0
    cross_layer_z_alert: float = 6.0
    cross_layer_min_layers: int = 8
    # A MAD below this (normalised-entropy units) is treated as this: layers
    # that agree to 3 decimals should not turn rounding noise into alarms.
    cross_layer_min_scale: float = 0.01
    # Loss divergence (--loss-log): trailing mean over `loss_window` logged
    # steps rising `loss_margin` nats above its running minimum for good.
    loss_window: int = 50
    loss_margin: float = 0.5
    # Monitors whose series are not judged (names as in the JSON report).
    disabled_monitors: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        problems = []
        if not 0 < self.warn_sigma <= self.alert_sigma:
            problems.append(f"need 0 < warn_sigma ≤ alert_sigma (got {self.warn_sigma}, {self.alert_sigma})")
        if self.consecutive < 1:
            problems.append(f"consecutive must be ≥ 1 (got {self.consecutive})")
        if self.min_baseline_pairs < 2 or self.baseline_pairs < self.min_baseline_pairs:
            problems.append("need 2 ≤ min_baseline_pairs ≤ baseline_pairs "
                            f"(got {self.min_baseline_pairs}, {self.baseline_pairs})")
        if self.warmup_steps < 0 or self.warmup_pairs < 0 or self.reference_pairs < 1 or self.loss_window < 1:
            problems.append("warmup_steps and warmup_pairs must be ≥ 0, reference_pairs and loss_window ≥ 1")
        if not (self.cusum_drift >= 0 and self.cusum_cap > self.cusum_drift
                and 0 < self.cusum_warn <= self.cusum_alert and 0 < self.pooled_cusum_warn <= self.pooled_cusum_alert):
            problems.append("need cusum_drift ≥ 0, cusum_cap > cusum_drift, 0 < cusum_warn ≤ cusum_alert and "
                            "0 < pooled_cusum_warn ≤ pooled_cusum_alert")
        if self.reference_scale_factor < 1 or min(self.band_scale_factor, self.band_state_scale_factor) <= 0:
            problems.append("need reference_scale_factor ≥ 1 (one run cannot show the spread between runs), "
                            "band_scale_factor > 0 and band_state_scale_factor > 0 "
                            f"(got {self.reference_scale_factor}, {self.band_scale_factor}, "
                            f"{self.band_state_scale_factor})")
        if not 0 < self.layer_band_warn <= self.layer_band_alert:
            problems.append(f"need 0 < layer_band_warn ≤ layer_band_alert (got {self.layer_band_warn}, "
                            f"{self.layer_band_alert})")
        if not 0 < self.run_band_warn <= self.run_band_alert:
            problems.append(f"need 0 < run_band_warn ≤ run_band_alert (got {self.run_band_warn}, "
                            f"{self.run_band_alert})")
        if self.logit_scale_ceiling <= 0 or self.logit_scale_width < 1:
            problems.append(f"need logit_scale_ceiling > 0 and logit_scale_width ≥ 1 (got {self.logit_scale_ceiling}, "
                            f"{self.logit_scale_width})")
        if min(self.output_logit_scale_ceiling, self.output_shift_ceiling) <= 0:
            problems.append("need output_logit_scale_ceiling > 0 and output_shift_ceiling > 0")
        known = judged_by_name()
        unknown = sorted(set(self.disabled_monitors) - set(known))
        if unknown:
            problems.append(f"disabled_monitors: unknown monitor(s) {unknown}; known: {sorted(known)}")
        if problems:
            raise CkptScanError("invalid thresholds: " + "; ".join(problems))

    def at_width(self, hidden_size: int | None) -> Thresholds:
        """These thresholds for a model of d_model `hidden_size`: the logit-scale
        ceiling × √(hidden_size / logit_scale_width) when wider, with the
        width it is now for (so applying it again changes nothing)."""
        if hidden_size is None or hidden_size <= self.logit_scale_width:
            return self
        scaled = self.logit_scale_ceiling * math.sqrt(hidden_size / self.logit_scale_width)
        return replace(self, logit_scale_ceiling=scaled, logit_scale_width=hidden_size)

    def as_dict(self) -> dict[str, object]:
        values = asdict(self)
        values["disabled_monitors"] = list(self.disabled_monitors)
        return values

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in fields(cls)]

    def series_settings(self, start: int) -> SeriesSettings:
        return SeriesSettings(self.warn_sigma, self.alert_sigma, self.consecutive, self.baseline_pairs,
                              self.min_baseline_pairs, start, self.cusum_drift, self.cusum_cap, self.cusum_warn,
                              self.cusum_alert)
