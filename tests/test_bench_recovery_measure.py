"""bench.cluster's failover measures on synthetic answer times: the sliding-window measure
finds when the rate came back to within its step, where whole-second buckets round up."""

from __future__ import annotations

import re
from collections import Counter

from bench.cluster import JoinRun, join_report, recovery, recovery_fine


def _answers(rate: int, back_at: float, kill: float = 5.0, end: float = 20.0) -> tuple[list[float], dict[int, list[int]]]:
    """``rate`` answers a second, none from ``kill`` until ``back_at``; answer times and
    the per-second timeline (bucketed by the second they were given: these requests are
    answered at once)."""
    times: list[float] = []
    t = 0.0
    while t < end:
        if not (kill <= t < back_at):
            times.append(t)
        t += 1.0 / rate
    timeline: dict[int, list[int]] = {}
    for x in times:
        timeline.setdefault(int(x), [0, 0])[0] += 1
    return times, timeline


def _took(line: str) -> float:
    found = re.search(r"so by ([0-9.]+) s", line) or re.search(r"([0-9.]+) s after the kill", line)
    assert found, line
    return float(found.group(1))


def test_the_sliding_measure_finds_the_return_within_its_step() -> None:
    times, timeline = _answers(400, back_at=8.3)
    fine = recovery_fine(times, 5.0, 3)
    # The first whole window at full rate starts at 8.3 s, so full by 8.3 + 1 - 5 = 4.3 s;
    # one a tenth earlier already has 90% of the rate.
    assert 4.1 <= _took(fine) <= 4.3 + 1e-9, fine
    assert "within" in fine and "NOT" not in fine
    # Whole seconds: second 8 is short, so second 9 is the first full one: 5.0 s.
    assert _took(recovery(timeline, 5.0, 3)) == 5.0


def test_a_late_return_is_reported_late() -> None:
    times, _ = _answers(400, back_at=10.5)
    fine = recovery_fine(times, 5.0, 3)
    assert 6.3 <= _took(fine) <= 6.5 + 1e-9 and "NOT within" in fine, fine


def test_a_short_run_says_so() -> None:
    times, _ = _answers(400, back_at=6.0, end=8.0)
    assert "too short" in recovery_fine(times, 5.0, 3)


def _join_run(stay_gap: tuple[float, float] | None, rate: int = 300, end: float = 12.0) -> JoinRun:
    """Staying characters answered ``rate`` a second but none within ``stay_gap``; moving
    ones a tenth as often; the node started at 3 s, ready at 4 s, settled at 7 s."""
    stay: list[float] = []
    move: list[float] = []
    t = 0.0
    while t < end:
        if stay_gap is None or not (stay_gap[0] <= t < stay_gap[1]):
            stay.append(t)
        if int(t * rate) % 10 == 0:
            move.append(t)
        t += 1.0 / rate
    return JoinRun(stay, move, [0.01] * len(stay), [0.02] * len(move), (0, 0), Counter(), 3.0, 4.0, 7.0)


def test_the_join_measure_tells_a_pause_in_the_others_traffic() -> None:
    steady = join_report(_join_run(None))
    assert "no pause" in steady[-1] and "rate kept" in steady[-1], steady
    paused = join_report(_join_run((5.0, 5.6)))
    # 0.6 s with no answer to a staying character: a pause, and a window short of 90%.
    assert "a PAUSE" in paused[-1] and "NOT kept" in paused[-1], paused
    found = re.search(r"([0-9]+) ms during it", paused[1])
    assert found is not None and 590 <= int(found.group(1)) <= 610, paused[1]


def test_the_join_measure_ignores_the_time_after_the_run() -> None:
    # Settled late (the run ended first): the windows stop at the last answer instead of
    # counting the seconds after it as empty.
    run = _join_run(None)._replace(settled=20.0)
    assert "no pause" in join_report(run)[-1] and "rate kept" in join_report(run)[-1]
