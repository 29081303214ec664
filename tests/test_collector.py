"""The collector is paused while caches rebuild a long run, and left as it
was; only in the command's own process is what they rebuilt frozen."""

import gc

import pytest

from ckptscan.system import collector
from ckptscan.system.collector import collector_paused


@pytest.fixture
def collector_restored():
    was = gc.isenabled()
    yield
    (gc.enable if was else gc.disable)()
    gc.unfreeze()


@pytest.mark.parametrize("enabled", [True, False])
def test_rebuilding_pauses_the_collector_and_leaves_it_as_it_was(enabled, collector_restored):
    (gc.enable if enabled else gc.disable)()
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled() == enabled
    with pytest.raises(KeyError):
        with collector_paused():
            raise KeyError("an unreadable entry")
    assert gc.isenabled() == enabled


def test_a_library_caller_s_objects_are_never_frozen(collector_restored):
    assert not collector.freeze_rebuilt  # only the console script sets it
    frozen = gc.get_freeze_count()
    with collector_paused():
        rebuilt = [[i] for i in range(1000)]
    assert gc.get_freeze_count() == frozen and gc.is_tracked(rebuilt)


def test_in_the_command_s_own_process_what_was_rebuilt_is_frozen(monkeypatch, collector_restored):
    monkeypatch.setattr(collector, "freeze_rebuilt", True)
    frozen = gc.get_freeze_count()
    with collector_paused():
        rebuilt = [[i] for i in range(1000)]
    assert gc.get_freeze_count() >= frozen + len(rebuilt)
    gc.collect()
    assert gc.get_freeze_count() >= frozen + len(rebuilt)  # not walked, so not moved by a collection


def test_the_console_script_s_claim_on_its_process_is_what_sets_it(monkeypatch):
    from ckptscan.cli import process

    monkeypatch.setattr(process, "_own_process", False)
    monkeypatch.setattr(collector, "freeze_rebuilt", False)
    process.claim_process()
    assert collector.freeze_rebuilt
