"""The micro-batcher of the embedding service, without a model or a server: concurrent
callers whose requests arrive while a batch runs share the next batch, bounded in size,
queries before passages, each caller gets its own rows, errors reach every caller of the
failed batch and the worker goes on. Timing is controlled with events, never sleeps."""

from __future__ import annotations

import threading
import time

import pytest

from nekomem.models.embedding_batcher import BatcherClosed, MicroBatcher, Pending, RequestExpired

WAIT = 30.0


class GatedRun:
    """A batch run that records each batch and blocks the first one until released."""

    def __init__(self) -> None:
        self.batches: list[list[list[int]]] = []
        self.first_started = threading.Event()
        self.release = threading.Event()
        self.fail_on: int | None = None

    def __call__(self, batch: list[Pending[int, list[int]]]) -> list[list[int]]:
        self.batches.append([p.items for p in batch])
        if len(self.batches) == 1:
            self.first_started.set()
            assert self.release.wait(WAIT)
        if self.fail_on is not None and any(self.fail_on in p.items for p in batch):
            raise ValueError("model failed")
        return [[item * 10 for item in p.items] for p in batch]


def start_blocked(batcher: MicroBatcher[int, list[int]], run: GatedRun) -> Pending[int, list[int]]:
    """Submit a first request and wait until its batch runs (and blocks)."""
    first = batcher.submit([0])
    assert run.first_started.wait(WAIT)
    return first


def test_requests_arriving_during_a_batch_share_the_next_one() -> None:
    run = GatedRun()
    batcher: MicroBatcher[int, list[int]] = MicroBatcher(run, max_items=32, name="test-batcher")
    first = start_blocked(batcher, run)
    results: dict[int, list[int]] = {}
    submitted = threading.Barrier(9)

    def caller(i: int) -> None:
        pending = batcher.submit([i, i + 100])
        submitted.wait(WAIT)
        results[i] = pending.wait()

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(1, 9)]
    for t in threads:
        t.start()
    submitted.wait(WAIT)  # all eight are queued behind the running batch
    assert batcher.waiting() == 8
    run.release.set()
    for t in threads:
        t.join(WAIT)
    assert first.wait() == [0]
    # One batch for the first request, one for the eight that waited behind it.
    assert len(run.batches) == 2
    assert sorted(items[0] for items in run.batches[1]) == list(range(1, 9))
    assert results == {i: [i * 10, (i + 100) * 10] for i in range(1, 9)}
    batcher.close()


def test_a_batch_is_bounded_and_a_request_is_never_split() -> None:
    run = GatedRun()
    batcher: MicroBatcher[int, list[int]] = MicroBatcher(run, max_items=5, name="test-batcher")
    start_blocked(batcher, run)
    waiting = [batcher.submit([i, i, i]) for i in range(1, 5)]  # 4 requests of 3 items
    big = batcher.submit(list(range(7)))  # larger than a batch: runs alone
    run.release.set()
    assert [p.wait() for p in waiting] == [[i * 10] * 3 for i in range(1, 5)]
    assert big.wait() == [i * 10 for i in range(7)]
    sizes = [sum(len(items) for items in batch) for batch in run.batches[1:]]
    assert sizes == [3, 3, 3, 3, 7]
    batcher.close()


def test_lower_priority_number_goes_first() -> None:
    run = GatedRun()
    batcher: MicroBatcher[int, list[int]] = MicroBatcher(run, max_items=1, name="test-batcher")
    start_blocked(batcher, run)
    passage = batcher.submit([1], priority=1)
    query = batcher.submit([2], priority=0)
    run.release.set()
    assert query.wait() == [20] and passage.wait() == [10]
    assert run.batches[1:] == [[[2]], [[1]]]
    batcher.close()


def test_a_failed_batch_fails_its_callers_only_and_the_worker_goes_on() -> None:
    run = GatedRun()
    run.fail_on = 7
    batcher: MicroBatcher[int, list[int]] = MicroBatcher(run, max_items=2, name="test-batcher")
    start_blocked(batcher, run)
    doomed = [batcher.submit([7]), batcher.submit([8])]  # one batch of two, which fails
    later = batcher.submit([9])
    run.release.set()
    for pending in doomed:
        with pytest.raises(ValueError, match="model failed"):
            pending.wait()
    assert later.wait() == [90]
    batcher.close()


def test_close_fails_the_queued_requests_and_refuses_new_ones() -> None:
    run = GatedRun()
    batcher: MicroBatcher[int, list[int]] = MicroBatcher(run, max_items=4, name="test-batcher")
    first = start_blocked(batcher, run)
    queued = batcher.submit([1])
    batcher.close()
    with pytest.raises(BatcherClosed):
        queued.wait()
    with pytest.raises(BatcherClosed):
        batcher.submit([2])
    run.release.set()
    assert first.wait() == [0]  # the running batch ends normally


def test_the_end_of_batch_hook_is_told_and_cannot_stop_the_worker() -> None:
    told: list[tuple[int, int]] = []

    def hook(requests: int, items: int) -> None:
        told.append((requests, items))
        raise RuntimeError("hook trouble")

    batcher: MicroBatcher[int, list[int]] = MicroBatcher(lambda batch: [p.items for p in batch], 8, "test-batcher", hook)
    assert batcher.call([1, 2]) == [1, 2]
    assert batcher.call([3]) == [3]
    assert told == [(1, 2), (1, 1)]
    batcher.close()


def test_a_request_that_expired_while_queued_is_dropped_not_run() -> None:
    run = GatedRun()
    batcher: MicroBatcher[int, list[int]] = MicroBatcher(run, max_items=8, name="test-batcher")
    start_blocked(batcher, run)
    stale = batcher.submit([1], expires=time.monotonic() - 1)  # its caller already gave up
    fresh = batcher.submit([2], expires=time.monotonic() + 3600)
    run.release.set()
    with pytest.raises(RequestExpired):
        stale.wait()
    assert fresh.wait() == [20]
    assert [1] not in [items for batch in run.batches for items in batch]
    assert batcher.expired == 1
    batcher.close()


def test_two_workers_run_two_batches_at_once() -> None:
    both_running = threading.Barrier(3)

    def run(batch: list[Pending[int, list[int]]]) -> list[list[int]]:
        both_running.wait(WAIT)  # passes only when two batches run at the same time
        return [p.items for p in batch]

    batcher: MicroBatcher[int, list[int]] = MicroBatcher(run, max_items=1, name="test-batcher", workers=2)
    first, second = batcher.submit([1]), batcher.submit([2])
    both_running.wait(WAIT)
    assert first.wait() == [1] and second.wait() == [2]
    batcher.close()


def test_an_exception_as_one_requests_answer_fails_that_request_alone() -> None:
    """A run may answer one request with an exception (the remote leg failed a passage
    request while its batch-mates, queries, got their rows): that caller gets the error."""

    def run(batch: list[Pending[int, list[int]]]) -> list[list[int] | BaseException]:
        return [ValueError("endpoint down") if 7 in p.items else [item * 10 for item in p.items] for p in batch]

    batcher: MicroBatcher[int, list[int]] = MicroBatcher(run, max_items=32, name="test-batcher")
    try:
        failing = batcher.submit([7])
        fine = batcher.submit([1, 2])
        with pytest.raises(ValueError, match="endpoint down"):
            failing.wait()
        assert fine.wait() == [10, 20]
        assert batcher.call([3]) == [30]  # the worker goes on
    finally:
        batcher.close()


def test_background_batches_leave_a_worker_free_for_urgent_requests() -> None:
    background_started = threading.Event()
    release_background = threading.Event()
    ran: list[list[int]] = []

    def run(batch: list[Pending[int, list[int]]]) -> list[list[int]]:
        ran.append([item for p in batch for item in p.items])
        if batch[0].priority > 0:
            background_started.set()
            assert release_background.wait(WAIT)
        return [p.items for p in batch]

    batcher: MicroBatcher[int, list[int]] = MicroBatcher(run, max_items=1, name="test-batcher", workers=2, reserve=1)
    first = batcher.submit([1], priority=1)
    assert background_started.wait(WAIT)
    second = batcher.submit([2], priority=2)  # background too: must wait, one worker stays free
    urgent = batcher.submit([3], priority=0)
    assert urgent.done.wait(WAIT) and urgent.wait() == [3]  # answered while the first background batch still runs
    assert ran == [[1], [3]]
    assert batcher.waiting() == 1
    release_background.set()
    assert first.wait() == [1] and second.wait() == [2]
    assert ran == [[1], [3], [2]]
    batcher.close()


def test_a_free_worker_takes_an_even_share_of_the_waiting_requests_not_all_of_them() -> None:
    """Two workers, both blocked, eight requests queued: the first to come free takes half
    of them, so the other takes the rest when it comes free instead of idling while one
    core runs all eight (the 32-client case of bench.recall_concurrency)."""
    gates = {-1: threading.Event(), -2: threading.Event()}
    started = {-1: threading.Event(), -2: threading.Event()}
    batches: list[list[int]] = []
    third = threading.Event()

    def run(batch: list[Pending[int, list[int]]]) -> list[list[int]]:
        items = [item for p in batch for item in p.items]
        batches.append(items)
        if len(batches) == 3:
            third.set()
        if items[0] in gates:
            started[items[0]].set()
            assert gates[items[0]].wait(WAIT)
        return [p.items for p in batch]

    batcher: MicroBatcher[int, list[int]] = MicroBatcher(run, max_items=32, name="test-batcher", workers=2, reserve=1)
    blocked = [batcher.submit([-1])]
    assert started[-1].wait(WAIT)
    blocked.append(batcher.submit([-2]))
    assert started[-2].wait(WAIT)  # both workers are busy
    queued = [batcher.submit([i]) for i in range(1, 9)]
    assert batcher.waiting() == 8
    gates[-1].set()  # one worker comes free; the other still runs its batch
    assert third.wait(WAIT)
    assert batches[2] == [1, 2, 3, 4]
    gates[-2].set()
    assert [p.wait() for p in queued] == [[i] for i in range(1, 9)]
    assert [p.wait() for p in blocked] == [[-1], [-2]]
    assert sorted(item for batch in batches[2:] for item in batch) == list(range(1, 9))
    assert max(len(batch) for batch in batches) <= 4
    batcher.close()
