"""Which layer-loads `ReadAhead` starts, and when: the next ones each worker
needs, at most `depth` ahead per worker, each load once, none after close."""

from __future__ import annotations

import threading

from ckptscan.storage.readahead import ReadAhead


class Recorder:
    """A starter that records the loads started and the ones abandoned."""

    def __init__(self):
        self.started: list[tuple[int, int]] = []
        self.abandoned: list[tuple[int, int]] = []

    def __call__(self, layer: int, checkpoint: int):
        self.started.append((layer, checkpoint))
        return lambda: self.abandoned.append((layer, checkpoint))


def test_one_worker_starts_its_load_then_the_next_two_in_scan_order():
    start = Recorder()
    ahead = ReadAhead([0, 1, 2], [0, 1], start, depth=2)
    ahead.reach(0, 0)
    assert start.started == [(0, 0), (0, 1), (1, 0)]  # its own load first: its requests queue first
    ahead.reach(0, 1)
    assert start.started[3:] == [(1, 1)]
    ahead.reach(1, 0)
    assert start.started[4:] == [(2, 0)]
    ahead.reach(1, 1)
    ahead.reach(2, 0)
    ahead.reach(2, 1)
    assert start.started == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]  # each load once
    ahead.close()
    assert start.abandoned == []  # everything started was taken


def test_a_trend_reads_ahead_within_its_layer_first():
    start = Recorder()
    ahead = ReadAhead([3, 4], [0, 2, 5, 7], start, depth=2)
    ahead.reach(3, 0)
    assert start.started == [(3, 0), (3, 2), (3, 5)]
    ahead.reach(3, 2)
    assert start.started[3:] == [(3, 7)]


def test_two_workers_each_read_ahead_without_starting_a_load_twice():
    start = Recorder()
    ahead = ReadAhead([0, 1, 2, 3], [0, 1], start, depth=2)
    first_done, second_done = threading.Event(), threading.Event()

    def first_worker():
        ahead.reach(0, 0)
        first_done.set()
        second_done.wait()  # alive while the second works, as a layer worker is for the whole scan

    def second_worker():  # begins layer 1, whose first load the first worker already started
        first_done.wait()
        ahead.reach(1, 0)
        ahead.reach(1, 1)
        second_done.set()

    workers = [threading.Thread(target=first_worker), threading.Thread(target=second_worker)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert sorted(start.started) == sorted(set(start.started))
    # First worker: (0,0) + (0,1), (1,0) ahead. Second: (1,1), then (2,0), (2,1) ahead of it.
    assert start.started == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]


def test_at_most_depth_loads_per_worker_are_ahead_of_it():
    start = Recorder()
    ahead = ReadAhead(list(range(10)), [0, 1, 2], start, depth=2)
    ahead.reach(0, 0)
    assert len(start.started) == 1 + 2
    ahead = ReadAhead(list(range(10)), [0, 1, 2], Recorder(), depth=0)  # depth 0: as without read-ahead
    ahead.reach(0, 0)
    assert ahead._start.started == [(0, 0)]


def test_close_abandons_what_was_not_taken_and_stops_reading_ahead():
    start = Recorder()
    ahead = ReadAhead([0, 1, 2], [0, 1], start, depth=2)
    ahead.reach(0, 0)
    ahead.close()
    assert sorted(start.abandoned) == [(0, 1), (1, 0)]
    ahead.reach(0, 1)  # a worker still running after an error elsewhere: nothing more is started
    assert len(start.started) == 3
