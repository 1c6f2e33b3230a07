"""The pieces of a take-over prepared while a dead owner's lease runs out
(:mod:`nekomem.cluster.prepare`), without a cluster: the folder lock as the proof that the
owner is gone, the fence that opens a prepared journal but commits nothing, the folder
stamp compared at the claim, and when a prepared shard is let go. The whole path, with real
nodes, etcd and HAProxy: tests/test_cluster_live.py."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import pytest

from nekomem.cluster.fencing import Fence
from nekomem.cluster.keys import Member
from nekomem.cluster.locks import ShardLocks
from nekomem.cluster.prepare import TakeoverPrep, _Prepared, folder_stamp
from nekomem.cluster.ring import owner_of
from nekomem.cluster.table import ClusterTable
from nekomem.domain.turns import Turn
from nekomem.runtime.runtime import Runtime
from nekomem.stores import fence as store_fence
from nekomem.stores.atomic import atomic_write_json
from nekomem.stores.fence import FencedWrite
from nekomem.stores.shard_layout import character_root, shard_folder, shard_of
from nekomem.stores.timeindex import TimeIndex


def test_a_folder_lock_is_taken_without_waiting_only_once_its_holder_let_it_go(tmp_path: Path) -> None:
    owner, heir = ShardLocks(), ShardLocks()
    folder = shard_folder(tmp_path, 3)
    assert owner.acquire(3, folder, wait=0)
    assert not heir.try_acquire(3, folder)  # the owner lives (or is paused): no proof
    assert heir.overrides == 0 and heir.held() == []
    owner.release(3)  # what the kernel does when the owner's process dies
    assert heir.try_acquire(3, folder) and heir.held() == [3]
    assert heir.try_acquire(3, folder)  # held already
    assert not heir.try_acquire(4, shard_folder(tmp_path, 4))  # no such folder: nothing to prepare
    heir.release_all()


@pytest.fixture
def fence(tmp_path: Path):
    fence = Fence(tmp_path, ttl=10, fraction=0.5, node_id="me")
    store_fence.install(fence.guard, opener=fence.guard_open, probe=fence.permits)
    yield fence
    store_fence.install(None)


def test_a_prepared_shard_opens_its_journal_and_commits_nothing_until_granted(tmp_path: Path, fence: Fence) -> None:
    name = "Lan"
    folder = character_root(tmp_path, name, 16) / name
    folder.mkdir(parents=True)
    shard = shard_of(name, 16)
    store_fence.install(None)  # the previous owner wrote it
    with TimeIndex(folder / "time_indexed.db") as index:
        index.append("s", [Turn(role="human", text="before", ts="2024-01-01T00:00:00Z")])
    store_fence.install(fence.guard, opener=fence.guard_open, probe=fence.permits)
    journal = folder / "time_indexed.db"
    with pytest.raises(FencedWrite):  # not prepared: not even opened
        TimeIndex(journal).max_row_id()
    fence.prepare(shard)
    index = TimeIndex(journal)
    assert index.max_row_id() == 1 and index.count() == 1  # opened, read
    refusals = fence.refusals
    with pytest.raises(FencedWrite):
        index.append("s", [Turn(role="human", text="early", ts="2024-01-01T00:00:01Z")])
    with pytest.raises(FencedWrite):
        atomic_write_json(folder / "recent.json", [])
    assert not store_fence.permits(folder / "outbox.ndjson") and fence.refusals == refusals + 2  # a look counts nothing
    assert index.count() == 1 and not (folder / "recent.json").exists()
    # A journal the open would create or convert is a write: refused while only prepared.
    with pytest.raises(FencedWrite):
        TimeIndex(folder / "another.db").max_row_id()
    fence.unprepare(shard)
    fence.grant(shard, token=9)
    fence.renewed(sent_at=time.monotonic())  # a keepalive acknowledged
    assert store_fence.permits(folder / "outbox.ndjson")
    index.append("s", [Turn(role="human", text="after", ts="2024-01-01T00:00:02Z")])
    assert index.count() == 2
    index.close()


def test_the_folder_stamp_moves_with_every_write_but_not_with_the_shared_memory_index(tmp_path: Path) -> None:
    folder = tmp_path / "Lan"
    folder.mkdir()
    (folder / "facts.json").write_text("[]")
    (folder / "time_indexed.db-wal").write_bytes(b"w" * 10)
    (folder / "archive").mkdir()
    stamp = folder_stamp(folder)
    (folder / "time_indexed.db-shm").write_bytes(b"s")  # SQLite rewrites it on a read
    assert folder_stamp(folder) == stamp
    with (folder / "time_indexed.db-wal").open("ab") as wal:
        wal.write(b"frame")  # a commit
    assert folder_stamp(folder) != stamp
    stamp = folder_stamp(folder)
    atomic_write_json(folder / "facts.json", [])  # same bytes, a new file
    assert folder_stamp(folder) != stamp
    stamp = folder_stamp(folder)
    atomic_write_json(folder / "archive" / "2024-01.json", [])  # an archived entry
    assert folder_stamp(folder) != stamp
    assert folder_stamp(tmp_path / "gone") == ()


@dataclass
class Holder:
    node_id: str
    table: ClusterTable
    locks: ShardLocks = field(default_factory=ShardLocks)
    fence: Fence = field(default_factory=lambda: Fence(Path("/nonexistent"), ttl=3, fraction=0.5))


def test_a_prepared_shard_is_let_go_when_it_goes_elsewhere_or_no_claim_comes() -> None:
    now = [100.0]
    table = ClusterTable("n1")
    holder = Holder("n1", table)
    # review() reads the table and the clock only; the runtime is needed to load and let go.
    prep = TakeoverPrep(holder, cast(Runtime, None), ttl=3, clock=lambda: now[0])
    live = ["n1", "n3"]
    shard = next(s for s in range(64) if owner_of(s, live) == "n1")
    elsewhere = next(s for s in range(64) if owner_of(s, live) == "n3")
    dead, other = Member("n2", "http://n2"), Member("n3", "http://n3")
    prep._shards.update({shard: _Prepared("n2", now[0]), elsewhere: _Prepared("n2", now[0])})
    # The dead node's lease still runs: both kept.
    assert prep.review({shard: dead, elsewhere: dead}, live) == []
    # Its keys expired: the shard that is ours by rendezvous waits for our claim; the other
    # one is let go at once, so its rightful owner never waits for our lock.
    assert prep.review({}, live) == [elsewhere]
    # Another node claimed it.
    assert prep.review({shard: other}, live) == [shard, elsewhere]
    # The owner's key stayed three TTLs: it lives after all.
    now[0] += 10
    assert prep.review({shard: dead, elsewhere: dead}, live) == [shard, elsewhere]
    prep.stop()
