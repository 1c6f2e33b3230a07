"""A node's shards that rendezvous gives to a joining node: each is marked LEAVING (its
requests wait for the new owner) only when its hand-over starts, so that the shards queued
behind the others' hand-overs go on serving. The node's own methods run on a stand-in
holding a real ClusterTable (no etcd: what is tested is the order of the node's steps)."""

from __future__ import annotations

import threading
from types import SimpleNamespace

from nekomem.cluster.keys import Member
from nekomem.cluster.node import ClusterNode
from nekomem.cluster.ring import owner_of
from nekomem.cluster.table import ClusterTable, Local

SHARDS = 32
OLD = ["n1", "n2"]
NEW = ["n1", "n2", "n3"]


def _member(node: str) -> Member:
    return Member(node, f"http://{node}")


class _Work:
    def __init__(self) -> None:
        self.handed: list[int] = []
        self.dropped: list[int] = []

    def hand_over(self, shard: int) -> None:
        self.handed.append(shard)

    def drop(self, shard: int) -> None:
        self.dropped.append(shard)


def _node(members: list[str]) -> SimpleNamespace:
    """n1 owning (READY, in etcd) the shards rendezvous gave it among OLD, with the view
    of ``members``; _submit only queues (the move pool has not reached the jobs)."""
    table = ClusterTable("n1")
    mine = [s for s in range(SHARDS) if owner_of(s, OLD) == "n1"]
    owners = {s: _member(owner_of(s, OLD)) for s in range(SHARDS)}
    table.set_view({n: _member(n) for n in members}, set(), owners)
    for shard in mine:
        table.set_local(shard, Local.READY)
    node = SimpleNamespace(
        node_id="n1",
        shards=SHARDS,
        table=table,
        work=_Work(),
        _stop=threading.Event(),
        prep=SimpleNamespace(review=lambda owners, live: []),
        queued=[],
    )
    node._submit = lambda shard, job: node.queued.append((shard, job))
    node._leave = lambda shard: ClusterNode._leave(node, shard)  # type: ignore[arg-type]
    return node


def _moving() -> list[int]:
    return [s for s in range(SHARDS) if owner_of(s, OLD) == "n1" and owner_of(s, NEW) == "n3"]


def test_shards_queued_for_a_hand_over_keep_serving_until_their_turn() -> None:
    node = _node(NEW)
    moving = _moving()
    assert len(moving) >= 2  # rendezvous gives the joiner some of n1's shards
    members, draining, owners = node.table.view()
    ClusterNode._reconcile(node, members, draining, owners)  # type: ignore[arg-type]
    assert sorted(shard for shard, _ in node.queued) == moving
    # Queued, not started: every one still serves here.
    assert all(node.table.state_of(s) is Local.READY for s in moving)
    # The first job runs: only its shard waits for the new owner.
    first, job = node.queued[0]
    job(first)
    assert node.table.state_of(first) is Local.LEAVING
    assert node.work.handed == [first]
    assert all(node.table.state_of(s) is Local.READY for s, _ in node.queued[1:])


def test_a_queued_hand_over_does_nothing_once_rendezvous_keeps_the_shard_here() -> None:
    node = _node(NEW)
    members, draining, owners = node.table.view()
    ClusterNode._reconcile(node, members, draining, owners)  # type: ignore[arg-type]
    shard, job = node.queued[0]
    # The joiner left before this shard's turn came.
    node.table.set_view({n: _member(n) for n in OLD}, set(), owners)
    job(shard)
    assert node.table.state_of(shard) is Local.READY
    assert node.work.handed == [] and node.work.dropped == []


def test_a_shard_lost_while_its_hand_over_was_queued_is_dropped_by_that_job() -> None:
    node = _node(NEW)
    members, draining, owners = node.table.view()
    ClusterNode._reconcile(node, members, draining, owners)  # type: ignore[arg-type]
    shard, job = node.queued[0]
    # Its key expired meanwhile: _lose marked it LEAVING, and could not queue its drop
    # behind this job (the shard was busy).
    node.table.set_local(shard, Local.LEAVING)
    job(shard)
    assert node.work.dropped == [shard] and node.work.handed == []


def test_a_queued_hand_over_leaves_a_stopping_node_to_stop() -> None:
    node = _node(NEW)
    members, draining, owners = node.table.view()
    ClusterNode._reconcile(node, members, draining, owners)  # type: ignore[arg-type]
    shard, job = node.queued[0]
    node._stop.set()
    node.table.set_local(shard, Local.LEAVING)  # stop() marks every shard and hands each over itself
    job(shard)
    assert node.work.dropped == [] and node.work.handed == []
