"""Pinned held-out results: every run whose verdict moved is listed, and the
moves for the worse are the ones a commit must explain."""

import hashlib

from experiments import pinned
from experiments.pinned import Held, Move


def test_an_alarm_later_or_lost_and_a_false_alarm_gained_are_worse():
    was = {"late": Held(700, None, "attention", 0.8), "lost": Held(700, None, "attention", 0.8),
           "fa": Held(None, None, None, None), "early": Held(900, None, "attention", 0.3)}
    now = {"late": Held(1200, None, "attention", 0.4), "lost": Held(None, None, None, 0.0),
           "fa": Held(None, 300, "attention", None), "early": Held(600, None, "attention", 0.7)}
    found = {(m.run, m.what): m for m in pinned.moves(was, now)}
    assert found[("late", "later")] == Move("late", "later", 700, 1200, True)
    assert found[("lost", "lost alarm")].worse
    assert found[("fa", "gained false alarm")] == Move("fa", "gained false alarm", None, 300, True)
    assert found[("early", "earlier")] == Move("early", "earlier", 900, 600, False)
    assert not found[("fa", "family")].worse  # a healthy run's family: the false alarm is what counts


def test_a_family_changed_away_from_the_right_one_is_worse_and_back_is_not():
    was = {"a": Held(700, None, "update", 0.5, True), "b": Held(700, None, "attention", 0.5, False)}
    now = {"a": Held(700, None, "attention", 0.5, False), "b": Held(700, None, "update", 0.5, True)}
    assert pinned.moves(was, now) == [Move("a", "family", "update", "attention", True),
                                      Move("b", "family", "attention", "update", False)]


def test_unchanged_runs_and_runs_only_one_side_holds_are_not_moves():
    same = Held(700, None, "attention", 0.5)
    assert pinned.moves({"a": same, "gone": same}, {"a": same, "new": Held(None, 100, "router", None)}) == []


def test_a_pin_round_trips_and_is_compared_only_under_its_own_options(tmp_path, capsys):
    path = tmp_path / "pin.json"
    held = {"a": Held(700, None, "attention", 0.5), "b": Held(None, None, None, None)}
    pinned.save(path, held, {"split": "heldout", "references": "none", "legacy": False})
    assert pinned.load(path)[1] == held
    worse = pinned.report(path, {"a": Held(800, None, "attention", 0.4), "b": held["b"]},
                          {"split": "heldout", "references": "none", "legacy": False})
    assert worse == 1
    assert "a: later (700 → 800) [worse]" in capsys.readouterr().out
    assert pinned.report(path, {}, {"split": "heldout", "references": "healthy-seeds", "legacy": False}) == 0
    assert "not compared" in capsys.readouterr().out


def test_a_run_trained_differently_moves_with_its_data_and_is_never_worse(tmp_path, capsys):
    was = {"same": Held(700, None, "attention", 0.5, trained="aaaa"),
           "retrained": Held(700, None, "attention", 0.5, trained="bbbb"),
           "unrecorded": Held(700, None, "attention", 0.5)}
    now = {"same": Held(900, None, "attention", 0.3, trained="aaaa"),
           "retrained": Held(900, 100, "attention", 0.3, trained="cccc"),
           "unrecorded": Held(900, None, "attention", 0.3, trained="dddd")}
    found = {(m.run, m.what): m for m in pinned.moves(was, now)}
    assert found[("same", "later")].worse and not found[("same", "later")].retrained
    assert found[("unrecorded", "later")].worse  # a pin without digests cannot excuse a move
    assert found[("retrained", "later")] == Move("retrained", "later", 700, 900, False, retrained=True)
    assert found[("retrained", "gained false alarm")].retrained
    path = tmp_path / "pin.json"
    options = {"split": "heldout", "references": "none"}
    pinned.save(path, was, options)
    assert pinned.report(path, now, options) == 2
    out = capsys.readouterr().out
    assert "1 of them trained differently" in out
    assert "retrained: later (700 → 900) [trained differently: the data moved, not the rules]" in out


def test_the_training_digest_is_the_logs_and_a_view_has_its_sources(tmp_path):
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "train_log.jsonl").write_text('{"step": 0, "loss": 5.5}\n')
    digest = pinned.training_digest(tmp_path, {"name": "run"})
    assert digest == hashlib.sha256(b'{"step": 0, "loss": 5.5}\n').hexdigest()[:16]
    assert pinned.training_digest(tmp_path, {"name": "view", "view_of": "run"}) == digest
    assert pinned.training_digest(tmp_path, {"name": "missing"}) is None
    held = pinned.with_training({"run": Held(None, None, None, None)}, tmp_path, [{"name": "run"}])
    assert held["run"].trained == digest
