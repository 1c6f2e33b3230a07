"""Wakeup: an actor's one alarm, re-armed after every message with its next due time.

Driven by a ManualClock: its timers fire on ``advance`` on the calling thread, so every
assertion follows a deterministic step (no timer thread, no sleeping)."""

from __future__ import annotations

from datetime import datetime, timezone

from nekomem.runtime.clock import ManualClock
from nekomem.runtime.timers import Timers, Wakeup


def _wakeup() -> tuple[ManualClock, Timers, Wakeup, list[float]]:
    clock = ManualClock(datetime(2026, 5, 1, 12, 0, tzinfo=timezone.utc))
    timers = Timers(clock)
    fired: list[float] = []
    wake = Wakeup(timers, lambda: fired.append(clock.monotonic()), real=False, floor=0.5)
    return clock, timers, wake, fired


def test_the_same_due_time_wanted_after_every_message_arms_one_timer_and_wakes_once():
    clock, timers, wake, fired = _wakeup()
    due = clock.monotonic() + 10
    for _ in range(50):
        wake.want(due)
    assert timers.pending() == 1
    clock.advance(9)
    assert fired == []
    clock.advance(2)
    assert fired == [due + 1]
    clock.advance(60)
    assert len(fired) == 1  # fired once; nothing wanted since


def test_an_earlier_due_time_re_arms_and_a_later_one_does_not_wake_early():
    clock, _timers, wake, fired = _wakeup()
    start = clock.monotonic()
    wake.want(start + 10)
    wake.want(start + 4)  # earlier: must wake at 4
    clock.advance(5)
    assert fired == [start + 5]
    wake.want(start + 20)
    wake.want(start + 30)  # later than the armed timer: that timer re-arms instead of waking
    clock.advance(20)  # now start + 25
    assert fired == [start + 5]
    clock.advance(10)
    assert fired == [start + 5, start + 35]


def test_wanting_nothing_after_a_due_time_posts_nothing():
    clock, _timers, wake, fired = _wakeup()
    wake.want(clock.monotonic() + 3)
    wake.want(None)
    wake.want(None)
    clock.advance(10)
    assert fired == []


def test_work_already_due_waits_the_floor_on_real_time_and_is_not_armed_twice():
    clock, timers, wake, fired = _wakeup()
    past = clock.monotonic() - 1
    wake.want(past)
    assert wake.retrying
    wake.want(past)  # asked again after the next message: the floor timer stands
    assert timers.pending() == 1
    clock.advance(0)  # a manual-clock move does not fire a real-time floor early
    assert fired == []


def test_a_cancelled_timer_lets_go_of_its_callback_before_its_time():
    import gc
    import weakref

    clock = ManualClock(datetime(2026, 5, 1, 12, 0, tzinfo=timezone.utc))
    timers = Timers(clock)

    class Owner:
        def fire(self) -> None:
            raise AssertionError("cancelled")

    owner = Owner()
    handle = timers.call_later(3600, owner.fire)
    gone = weakref.ref(owner)
    handle.cancel()
    del owner
    gc.collect()
    assert gone() is None  # the handle is still in the heap
    assert timers.pending() == 1
    clock.advance(3601)
    assert timers.pending() == 0
