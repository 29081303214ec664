"""The thresholds of every rule (ckptscan.toml; JSON report "thresholds").

The general rules' (series, CUSUM, warm-up, baselines, references, bands,
cross-layer, loss) are fields here; each family's own are its section
(`FamilySpec.thresholds`, declared with the family), kept in `sections` and
read and set by their flat names as before: `Thresholds(epsilon_floor=0.2)`,
`t.epsilon_floor`, `dataclasses.replace(t, epsilon_floor=0.2)`, `--set
epsilon_floor=0.2`, and the JSON report's flat "thresholds"."""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields, replace
from typing import Any

from ckptscan.detection.catalog import judged_by_name
from ckptscan.detection.series import SeriesSettings
from ckptscan.errors import CkptScanError
from ckptscan.monitors import registry


@dataclass(frozen=True, init=False)
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
    band_state_scale_factor: float = 1.6
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
    # Each registered family's own section (`FamilySpec.thresholds`), as (family, section) in registry order;
    # their fields are read and set by their flat names too (`Thresholds(epsilon_floor=0.2)`, `t.epsilon_floor`).
    sections: tuple[tuple[str, Any], ...] = ()

    def __init__(self, sections: tuple[tuple[str, Any], ...] | None = None, **values: Any) -> None:
        """The general fields by name; a family's by its flat name, over `sections` (default: every
        registered family's defaults)."""
        own = {f.name: f for f in fields(self) if f.name != "sections"}
        for name, f in own.items():
            if name in values:
                value = values.pop(name)
            elif f.default_factory is not MISSING:
                value = f.default_factory()
            else:
                value = f.default
            object.__setattr__(self, name, value)
        found = dict(sections) if sections is not None else {}
        for family in registry.families():
            if family.thresholds is None:
                continue
            section = found.get(family.name) or family.thresholds()
            mine = {name: values.pop(name) for name in [f.name for f in fields(section)] if name in values}
            found[family.name] = replace(section, **mine) if mine else section
        if values:
            raise TypeError(f"Thresholds() got unexpected keyword argument(s) {sorted(values)}")
        object.__setattr__(self, "sections", tuple((family.name, found[family.name]) for family in registry.families()
                                                   if family.name in found))
        self.__post_init__()

    def __getattr__(self, name: str) -> Any:
        """A family's threshold by its flat name (`t.logit_scale_ceiling`)."""
        if name.startswith("__") or name == "sections":
            raise AttributeError(name)
        for _, section in self.sections:
            if name in section.__dataclass_fields__:
                return getattr(section, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def section(self, family: str) -> Any:
        """The family's section (None: it has none)."""
        return dict(self.sections).get(family)

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
        for _, section in self.sections:
            problems += section.problems()
        known = judged_by_name()
        unknown = sorted(set(self.disabled_monitors) - set(known))
        if unknown:
            problems.append(f"disabled_monitors: unknown monitor(s) {unknown}; known: {sorted(known)}")
        if problems:
            raise CkptScanError("invalid thresholds: " + "; ".join(problems))

    def at_width(self, hidden_size: int | None) -> Thresholds:
        """These thresholds for a model of d_model `hidden_size`: each section
        that depends on the width as its `at_width` says (the attention
        logit-scale ceiling × √(hidden_size / logit_scale_width) when wider,
        with the width it is now for, so applying it again changes nothing);
        itself where none changes."""
        sections = tuple((name, section.at_width(hidden_size) if hasattr(section, "at_width") else section)
                         for name, section in self.sections)
        if all(new is old for (_, new), (_, old) in zip(sections, self.sections)):
            return self
        return replace(self, sections=sections)

    def as_dict(self) -> dict[str, object]:
        """Every threshold by its flat name (the JSON report's "thresholds"), in `field_names` order."""
        values: dict[str, object] = {name: getattr(self, name) for name in self.field_names()}
        values["disabled_monitors"] = list(self.disabled_monitors)
        return values

    @classmethod
    def field_names(cls) -> list[str]:
        """Every threshold's flat name: the general ones in their order, each family's placed where its
        fields' metadata "after" says (the order the JSON report has always listed them in), else after them."""
        names = [f.name for f in fields(cls) if f.name != "sections"]
        general = set(names)
        for family in registry.families():
            if family.thresholds is None:
                continue
            at = len(names)
            for f in fields(family.thresholds):
                after = f.metadata.get("after")
                if after is not None:
                    at = names.index(after) + 1
                    while at < len(names) and names[at] not in general:  # after the sections placed there
                        at += 1
                names.insert(at, f.name)
                at += 1
        return names

    def series_settings(self, start: int) -> SeriesSettings:
        return SeriesSettings(self.warn_sigma, self.alert_sigma, self.consecutive, self.baseline_pairs,
                              self.min_baseline_pairs, start, self.cusum_drift, self.cusum_cap, self.cusum_warn,
                              self.cusum_alert)
