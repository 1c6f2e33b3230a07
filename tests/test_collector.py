"""Scheduled full garbage collections (runtime/collector.py), driven by a ManualClock."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from nekomem.runtime.clock import ManualClock
from nekomem.runtime.collector import FullCollections
from nekomem.runtime.timers import Timers


class Activity:
    def __init__(self) -> None:
        self.value = False
        self.asked = 0

    def __call__(self) -> bool:
        self.asked += 1
        return self.value


@pytest.fixture
def thresholds() -> Iterator[tuple[int, int, int]]:
    saved = gc.get_threshold()
    yield saved
    gc.set_threshold(*saved)


def full_collections() -> int:
    return int(gc.get_stats()[2]["collections"])


def test_start_switches_automatic_full_collections_off_and_stop_restores(thresholds: tuple[int, int, int]) -> None:
    collector = FullCollections(Timers(ManualClock()), 60.0)
    collector.start()
    young, middle, old = gc.get_threshold()
    assert (young, middle) == thresholds[:2]
    assert old > 1_000_000
    collector.stop()
    assert gc.get_threshold() == thresholds


def test_runs_every_interval_only_after_activity(thresholds: tuple[int, int, int]) -> None:
    clock = ManualClock()
    activity = Activity()
    collector = FullCollections(Timers(clock), 60.0, activity=activity)
    collector.start()
    try:
        before = full_collections()
        clock.advance(59.0)
        assert activity.asked == 0
        clock.advance(1.0)  # due: nothing happened, so no collection
        assert activity.asked == 1
        assert collector.runs == 0
        activity.value = True
        clock.advance(60.0)
        assert collector.runs == 1
        assert full_collections() == before + 1
        clock.advance(30.0)  # the next one is a whole interval later
        assert collector.runs == 1
    finally:
        collector.stop()


def test_stopped_characters_bring_the_collection_forward(thresholds: tuple[int, int, int]) -> None:
    clock = ManualClock()
    timers = Timers(clock)
    collector = FullCollections(timers, 600.0, activity=Activity())
    collector.start()
    try:
        collector.characters_stopped(1, 100)  # 1 of 100: wait for the interval
        timers.run_due()
        assert collector.runs == 0
        collector.characters_stopped(24, 100)  # 25 of 100: a quarter
        timers.run_due()
        assert collector.runs == 1
        collector.characters_stopped(1, 100)  # counted afresh after a collection
        timers.run_due()
        assert collector.runs == 1
        clock.advance(600.0)  # the stopped one is enough activity at the interval
        assert collector.runs == 2
    finally:
        collector.stop()


def test_nothing_runs_after_stop(thresholds: tuple[int, int, int]) -> None:
    clock = ManualClock()
    activity = Activity()
    activity.value = True
    collector = FullCollections(Timers(clock), 10.0, activity=activity)
    collector.start()
    collector.stop()
    collector.characters_stopped(5, 1)
    clock.advance(100.0)
    assert collector.runs == 0


def test_interval_must_be_positive() -> None:
    with pytest.raises(ValueError, match="every_seconds"):
        FullCollections(Timers(ManualClock()), 0.0)


def test_thresholds_come_back_only_when_the_last_collector_stops(thresholds: tuple[int, int, int]) -> None:
    first = FullCollections(Timers(ManualClock()), 60.0)
    second = FullCollections(Timers(ManualClock()), 60.0)
    first.start()
    second.start()
    first.stop()
    assert gc.get_threshold()[2] > 1_000_000
    second.stop()
    assert gc.get_threshold() == thresholds
