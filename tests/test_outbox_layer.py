"""The outbox layer as a plain object over FakePorts (a real outbox.ndjson, no actor, no
runtime): records dispatched to their layer, retried with backoff, dead-lettered, and the
group fsync's acknowledgements."""

from __future__ import annotations

from pathlib import Path

from nekomem.actors.messages import Enqueue, OpFinished, OutboxAck, OutboxAcks, RunOp, Tick
from nekomem.layers.outbox.layer import OutboxLayer
from nekomem.runtime.clock import ManualClock
from nekomem.stores.outbox import Outbox
from tests.support.fake_ports import FakePorts
from tests.support.live import make_settings


def outbox_over(tmp_path: Path, clock: ManualClock | None = None, **overrides: object) -> tuple[OutboxLayer, FakePorts]:
    ports = FakePorts(make_settings(tmp_path, **overrides), tmp_path, "outbox", clock=clock)
    layer = OutboxLayer(ports)
    layer.load()
    return layer, ports


def test_a_cache_record_runs_at_once_and_is_acknowledged_with_the_group_write(tmp_path: Path) -> None:
    layer, ports = outbox_over(tmp_path, outbox_sync_seconds=60.0)
    ack = OutboxAck(row=2, write_id=0)
    layer.on_Enqueue(Enqueue(op_type="extract_facts", payload={"rows": [1, 2]}, reply_value=ack))

    [run] = ports.sent_to("facts")
    assert isinstance(run, RunOp) and run.attempt == 1 and run.payload == {"rows": [1, 2]}
    assert ports.sent_to("recent") == []  # held for the group fsync
    assert layer.real_due_at() is not None
    assert not Outbox(ports.paths.outbox).records()  # its line is held in memory

    layer.flush()  # the group write now (as on Flush)
    assert ports.sent_to("recent") == [OutboxAcks(acks=[ack])]
    assert [r.op_id for r in Outbox(ports.paths.outbox).pending()] == [run.op_id]
    assert ports.outbox_tally.snapshot() == (1, 0)


def test_a_failed_record_is_retried_after_its_backoff_then_dead_lettered(tmp_path: Path) -> None:
    clock = ManualClock()
    layer, ports = outbox_over(tmp_path, clock, outbox_max_attempts=2, outbox_sync_seconds=0.0)
    layer.on_Enqueue(Enqueue(op_type="extract_facts", payload={"note": "x"}))
    [run] = ports.sent_to("facts")

    layer.on_OpFinished(OpFinished(op_id=run.op_id, ok=False, error="model down"))
    due = layer.due_at()
    assert due is not None and due > ports.clock.monotonic()  # not before its backoff
    assert len(ports.sent_to("facts")) == 1

    clock.advance(due - clock.monotonic())
    layer.on_Tick(Tick(monotonic=clock.monotonic()))  # what the actor gets at due_at
    [_first, again] = ports.sent_to("facts")
    assert isinstance(again, RunOp) and again.op_id == run.op_id and again.attempt == 2

    layer.on_OpFinished(OpFinished(op_id=run.op_id, ok=False, error="model down"))
    assert layer.records.pending == {}
    assert ports.outbox_tally.snapshot() == (0, 1)
    assert Outbox(ports.paths.outbox).pending() == []


def test_records_of_a_character_this_node_may_not_write_wait_for_the_fence(tmp_path: Path) -> None:
    """Cluster mode, a take-over being prepared: the records found at load are not sent to
    their handlers (they would write); they are looked at again after
    cluster_fenced_retry_seconds, and the first look after the claim sends them."""
    from nekomem.stores import fence as store_fence
    from nekomem.stores.fence import FencedWrite

    clock = ManualClock()
    layer, ports = outbox_over(tmp_path, clock, outbox_sync_seconds=0.0, cluster_fenced_retry_seconds=2.0)
    layer.on_Enqueue(Enqueue(op_type="extract_facts", payload={"note": "x"}))
    [run] = ports.sent_to("facts")  # the previous owner's record, left pending by its crash
    allowed = [False]

    def guard(path: Path) -> None:
        if not allowed[0]:
            raise FencedWrite(path, "shard not owned")

    store_fence.install(guard, probe=lambda path: allowed[0])
    try:
        ports.sent.clear()
        layer.load()  # the heir's activation while the lease runs out
        assert ports.sent_to("facts") == [] and list(layer.records.pending) == [run.op_id]
        assert layer.due_at() == clock.monotonic() + 2.0
        clock.advance(2.0)
        layer.on_Tick(Tick(monotonic=clock.monotonic()))
        assert ports.sent_to("facts") == []
        allowed[0] = True  # claimed
        clock.advance(2.0)
        layer.on_Tick(Tick(monotonic=clock.monotonic()))  # the next look (due_at)
        [again] = ports.sent_to("facts")
        assert isinstance(again, RunOp) and again.op_id == run.op_id and layer.due_at() is None
    finally:
        store_fence.install(None)
