"""The evaluation's oracle, family verdict and reference choice, on synthetic reports.

The oracle is checked against a dense numpy computation of its definition
(experiments/evaluate.py docstring): per layer and monitor, the twin's jitter
from its successive differences, the run's departure from the twin at each
step in jitters, the first two consecutive departing pairs after onset.
"""

import math

import numpy as np
import pytest
from detection.helpers import run_report

from ckptscan.detection.catalog import judged_by_name
from ckptscan.schema.results import Summary
from experiments.corpus import healthy_seed_references, load_manifest
from experiments.evaluate import ORACLE_MONITORS, family_verdict, main, oracle_step

FIELDS = {"delta2_entropy_norm": "d2n", "qk_logit_bound": "logit", "routing_entropy_norm": "routing",
          "epsilon": "eps"}


def numpy_oracle(run, twin, families, onset):
    """The oracle's definition, written out with numpy over dense arrays."""
    steps = np.array([p.to_step for p in run.pairs])
    best = math.inf
    for family in families:
        for name in ORACLE_MONITORS[family]:
            monitor = judged_by_name()[name]
            for number in range(len(run.pairs[0].layers)):
                r = np.array([monitor.read(p.layers[number]) for p in run.pairs], dtype=float)
                t = np.array([monitor.read(p.layers[number]) for p in twin.pairs], dtype=float)
                if monitor.spec.log:
                    r, t = np.log(r), np.log(t)
                d = np.diff(t)
                sigma = max(1.4826 * np.median(np.abs(d - np.median(d))) / math.sqrt(2), monitor.spec.min_scale)
                sides = {"low": [-1], "high": [1], "both": [1, -1]}[monitor.spec.bad]
                for side in sides:
                    departs = (side * (r - t) / sigma > 3) & (steps > onset)
                    both = np.flatnonzero(departs[1:] & departs[:-1])
                    if both.size:
                        best = min(best, steps[both[0] + 1])
    return None if best == math.inf else int(best)


def pair(num_pairs=30, layers=3, seed=0, **fault):
    """A healthy twin and a run equal to it except where `fault` changes a metric:
    `fault[field] = f(i, layer) -> value or None (the twin's)`."""
    healthy = dict(
        d2n=lambda i, n: 0.55 + 0.002 * i,
        logit=lambda i, n: 3.0 * math.exp(0.01 * i) * (1 + 0.01 * math.sin(7 * i + n)),
        routing=lambda i, n: 0.8 - 0.003 * i,
        eps=lambda i, n: 5.0 * (1 + 0.02 * math.cos(3 * i + n)),
    )
    twin = run_report(num_pairs, layers=layers, seed=seed, **healthy)
    faulty = {k: (lambda i, n, f=f, g=fault.get(k): (g(i, n) if g and g(i, n) is not None else 0) + f(i, n))
              for k, f in healthy.items()}
    run = run_report(num_pairs, layers=layers, seed=seed, **faulty)
    return run, twin


def test_a_fault_from_step_0_is_seen_on_the_second_departing_pair():
    # Layer 2's Δ2 entropy falls from the start, 0.005 more per pair: a few jitters by the 4th pair.
    run, twin = pair(d2n=lambda i, n: -0.005 * i if n == 2 else None)
    step = oracle_step(run, twin, {"attention"}, 0)
    assert step == numpy_oracle(run, twin, ["attention"], 0)
    assert step is not None and step <= 1000


def test_a_single_departing_pair_is_not_enough():
    run, twin = pair(d2n=lambda i, n: -0.5 if i == 12 and n == 0 else None)
    assert oracle_step(run, twin, {"attention"}, 0) is None
    assert numpy_oracle(run, twin, ["attention"], 0) is None
    run, twin = pair(d2n=lambda i, n: -0.5 if i in (12, 13) and n == 0 else None)
    assert oracle_step(run, twin, {"attention"}, 0) == numpy_oracle(run, twin, ["attention"], 0) == 1400


def test_departures_toward_the_healthy_side_do_not_count():
    # Δ2 entropy alarms low and the logit bound high: a rise and a fall are no departure.
    run, twin = pair(d2n=lambda i, n: 0.3, logit=lambda i, n: -1.0)
    assert oracle_step(run, twin, {"attention"}, 0) is None
    assert numpy_oracle(run, twin, ["attention"], 0) is None


def test_a_mid_run_fault_counts_only_after_onset():
    # A departure from pair 5 on, onset at 1000: the first two departing pairs
    # after onset end at 1200, not at 700.
    run, twin = pair(logit=lambda i, n: 2.0 if i >= 5 and n == 1 else None)
    assert oracle_step(run, twin, {"attention"}, 1000) == numpy_oracle(run, twin, ["attention"], 1000) == 1200
    assert oracle_step(run, twin, {"attention"}, 0) == numpy_oracle(run, twin, ["attention"], 0) == 700


def test_router_epsilon_departs_on_either_side_but_one_side_for_both_pairs():
    up, twin = pair(eps=lambda i, n: 3.0 if i >= 10 and n == 0 else None)
    assert oracle_step(up, twin, {"router"}, 0) == numpy_oracle(up, twin, ["router"], 0) == 1200
    down, twin = pair(eps=lambda i, n: -2.5 if i >= 15 and n == 2 else None)
    assert oracle_step(down, twin, {"router"}, 0) == numpy_oracle(down, twin, ["router"], 0) == 1700
    zigzag, twin = pair(eps=lambda i, n: (3.0 if i % 2 else -2.5) if n == 0 else None)
    assert oracle_step(zigzag, twin, {"router"}, 0) is None
    assert numpy_oracle(zigzag, twin, ["router"], 0) is None


def test_only_the_faults_family_is_compared():
    run, twin = pair(routing=lambda i, n: -0.3 if i >= 4 else None)
    assert oracle_step(run, twin, {"attention"}, 0) is None
    assert oracle_step(run, twin, {"router"}, 0) == numpy_oracle(run, twin, ["router"], 0) == 600
    assert oracle_step(run, twin, {"attention", "router"}, 0) == 600


@pytest.mark.parametrize("seed", range(8))
def test_random_faults_agree_with_numpy(seed):
    rng = np.random.default_rng(seed)
    shifts = {k: rng.normal(0, scale, (40, 3)) * (rng.random((40, 3)) < 0.3)
              for k, scale in (("d2n", 0.05), ("logit", 0.5), ("routing", 0.05), ("eps", 1.0))}
    run, twin = pair(num_pairs=40, seed=seed, **{k: (lambda i, n, s=s: float(s[i, n])) for k, s in shifts.items()})
    onset = int(rng.choice([0, 800, 2000]))
    for families in (["attention"], ["router"], ["attention", "router"]):
        assert oracle_step(run, twin, set(families), onset) == numpy_oracle(run, twin, families, onset)


def test_a_faulty_twin_of_itself_never_departs():
    run, twin = pair()
    assert oracle_step(run, twin, {"attention", "router"}, 0) is None


def summary(first_alert_step, first_family, **primary):
    s = Summary("alert", [], first_alert_step, first_family=first_family)
    for name, value in primary.items():
        object.__setattr__(s, name, value)
    return s


def test_without_a_primary_family_a_tie_with_another_family_is_wrong():
    tie = summary({"attention": 1100, "router": 1100}, "attention")
    assert family_verdict(tie, "router") == ("attention", True)
    assert family_verdict(tie, "attention") == ("attention", True)  # the router tied: no mechanism named
    assert family_verdict(tie, "both") == ("attention", False)
    first = summary({"attention": 1200, "router": 1100}, "router")
    assert family_verdict(first, "router") == ("router", False)
    assert family_verdict(first, "attention") == ("router", True)
    assert family_verdict(summary({}, None), "attention") == (None, False)
    assert family_verdict(first, "none") == ("router", False)  # a healthy run's alert is a false alarm, not this


def test_a_primary_family_decides_a_tie():
    tie = summary({"attention": 1100, "router": 1100}, "attention", primary_family="router")
    assert family_verdict(tie, "router") == ("router", False)
    assert family_verdict(tie, "attention") == ("router", True)
    assert family_verdict(tie, "none") == ("router", False)


def test_healthy_seed_references_are_the_other_calibration_seeds():
    manifest = load_manifest()
    by_name = {r["name"]: r for r in manifest["runs"]}
    assert healthy_seed_references(manifest, by_name["mx2-fp32-const-s2-attn0-b2"]) == [
        f"mx2-fp32-const-s{s}-healthy" for s in (0, 1, 3, 4)]
    assert healthy_seed_references(manifest, by_name["mx2-fp32-const-s0-healthy"]) == [
        f"mx2-fp32-const-s{s}-healthy" for s in (1, 3, 4)]
    assert healthy_seed_references(manifest, by_name["g3-ll6-bf16-cos-i50-s3-attn0-b2"]) == [
        f"g3-ll6-bf16-cos-i50-s{s}-healthy" for s in (0, 1, 2)]
    assert healthy_seed_references(manifest, by_name["g3-ll6-bf16-cos-i200-s1-healthy"]) == [
        "g3-ll6-bf16-cos-i200-s0-healthy", "g3-ll6-bf16-cos-i200-s2-healthy"]


@pytest.fixture
def partial_corpus(tmp_path, corpus_run):
    """Generation 3's ll6 recipe in part: healthy seeds 0, 1 and 3, and seed 3's
    attention fault from step 0 (layer 1's Δ2 entropy 0.15 low); seed 2 not yet trained."""
    recipe = "g3-ll6-bf16-cos-i50"
    for seed in (0, 1, 3):
        corpus_run(tmp_path, f"{recipe}-s{seed}-healthy", run_report(20, seed=10 + seed), {})
    faulty = run_report(20, seed=13, d2n=lambda i, n: 0.55 - (0.15 if n == 1 else 0.0))
    corpus_run(tmp_path, f"{recipe}-s3-attn0-b2", faulty, {"attention": {"from_step": 0}})
    return tmp_path


def row(out, name):
    return next(line.split() for line in out.splitlines() if line.startswith(name + " "))


def test_partial_evaluates_the_runs_generated_so_far(partial_corpus, capsys):
    main(["--corpus", str(partial_corpus), "--partial"])
    out = capsys.readouterr().out
    # generation 4 is experiments.natural's to judge, not evaluate's
    heldout = sum(r["split"] == "heldout" and r.get("generation") != 4 for r in load_manifest()["runs"])
    assert "split: heldout (2 runs)" in out
    assert f"--partial: {heldout - 2} run(s) of the split left out" in out
    assert "-- faults from step 0" in out and "mid-run --" not in out
    assert "generation 3" in out and "generation 1/2" not in out
    # The self-baseline learns the fault present from the start as normal; the
    # twin shows it on the second pair.
    faulty = row(out, "g3-ll6-bf16-cos-i50-s3-attn0-b2")
    assert faulty[6] == "ok" and faulty[-4] == "200"
    assert row(out, "ckptscan")[1] == "0/1" and row(out, "oracle")[1] == "1/1"


def test_a_band_of_the_other_seeds_sees_a_fault_from_step_0(partial_corpus, corpus_run, capsys):
    main(["--corpus", str(partial_corpus), "--partial", "--references", "healthy-seeds"])
    assert "split: heldout (0 runs)" in capsys.readouterr().out  # seed 2 of the band is not trained yet
    corpus_run(partial_corpus, "g3-ll6-bf16-cos-i50-s2-healthy", run_report(20, seed=12), {})
    main(["--corpus", str(partial_corpus), "--partial", "--references", "healthy-seeds"])
    out = capsys.readouterr().out
    assert "split: heldout (2 runs)" in out
    assert row(out, "g3-ll6-bf16-cos-i50-s3-attn0-b2")[6] == "alert"
    assert row(out, "g3-ll6-bf16-cos-i50-s3-healthy")[6] == "ok"
    assert row(out, "ckptscan")[1:3] == ["1/1", "0/1"]


def test_without_partial_an_incomplete_corpus_is_refused(partial_corpus, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["--corpus", str(partial_corpus)])
    assert exit_.value.code == 2
    assert "run(s) of the manifest missing" in capsys.readouterr().err
