"""Preparing a take-over while a dead owner's lease runs out.

After a ``kill -9`` the dead node's shards wait for its lease to expire (up to the TTL)
before anyone may claim them, and their clients wait with them. This node spends that wait
loading the characters it will own, so that after the claim they serve at once instead of
being activated one by one under the restored load.

* **Trigger.** A request forwarded to the owner could not reach it (``Unreachable``:
  nothing was sent). The node then looks at the owner's shards whose rendezvous owner
  without it would be this node.
* **Proof.** It takes each of those shards' folder locks without waiting. The owner holds
  them while it lives (even paused), so taking all of them shows its process is gone; if
  one is held, nothing is prepared.
* **Load, no write.** The characters with work left over are activated. The fence lets a
  prepared shard's journals be opened, and refuses every commit until etcd gives the shard
  to this node; the outbox holds back its records (:meth:`Fence.guard_open`,
  ``stores.fence.permits``). Requests are not routed here: the shard is not READY.
* **Adopt.** At the claim, before writes are allowed, each prepared character's files are
  compared with what they were when it was activated (every entry's inode, size and
  mtime, ``-shm`` left out). One that changed is stopped (writing nothing, the fence
  still refusing) and activated afresh; the rest are served as loaded. After the claim the
  previous owner writes nothing (its fencing deadline has passed), so the comparison is
  final.
* **Abandon.** A prepared shard that another node claims, that goes to another node by
  rendezvous, or that no one claims within a few TTLs, is let go: its characters stopped
  without a write, its lock released, so the rightful owner never waits for it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from nekomem.cluster.fencing import Fence
from nekomem.cluster.keys import Member
from nekomem.cluster.locks import ShardLocks
from nekomem.cluster.ring import owner_of
from nekomem.cluster.table import ClusterTable
from nekomem.runtime.runtime import Runtime
from nekomem.stores.layout import list_characters
from nekomem.stores.shard_layout import shard_folder

log = logging.getLogger("nekomem.cluster")

# What a folder's files looked like: (name, inode, size, mtime_ns) of every entry, sorted.
Stamp = tuple[tuple[str, int, int, int], ...]


def folder_stamp(folder: Path) -> Stamp:
    """The identity of every entry of a character folder (the ``-shm`` index left out:
    SQLite rewrites it on a read). Sub-folders count by their own entry, whose mtime moves
    when a file in them is added, replaced or removed."""
    entries: list[tuple[str, int, int, int]] = []
    try:
        with os.scandir(folder) as it:
            for entry in it:
                if entry.name.endswith("-shm"):
                    continue
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue
                entries.append((entry.name, st.st_ino, st.st_size, st.st_mtime_ns))
    except FileNotFoundError:
        return ()
    return tuple(sorted(entries))


class PrepHolder(Protocol):
    """What preparing needs of the node (so this module does not import it)."""

    node_id: str
    table: ClusterTable
    locks: ShardLocks
    fence: Fence


@dataclass
class _Prepared:
    peer: str
    started: float
    stamps: dict[str, Stamp] = field(default_factory=dict)


class TakeoverPrep:
    """The shards this node prepares for a take-over (see the module); thread-safe."""

    def __init__(self, node: PrepHolder, runtime: Runtime, ttl: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.node = node
        self.runtime = runtime
        self.ttl = ttl
        self._clock = clock
        self._lock = threading.Lock()
        self._shards: dict[int, _Prepared] = {}
        self._looked: dict[str, float] = {}  # peer -> when it was last suspected
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nekomem-prepare")
        self.prepared = 0  # characters activated ahead of a claim
        self.adopted = 0  # of those, served as loaded after the claim
        self.stale = 0  # of those, activated afresh (their files changed meanwhile)
        self.abandoned = 0  # shards let go unclaimed

    # -- trigger -------------------------------------------------------------------------
    def suspect(self, peer: str) -> None:
        """A request could not reach ``peer``: prepare its shards that would be this node's
        (once per TTL per peer; returns at once)."""
        if peer == self.node.node_id:
            return
        now = self._clock()
        with self._lock:
            if now - self._looked.get(peer, float("-inf")) < self.ttl:
                return
            self._looked[peer] = now
        try:
            self._pool.submit(self._prepare, peer)
        except RuntimeError:
            pass  # stopping

    def _heirs(self, peer: str) -> list[int]:
        """The shards ``peer`` owns that would be this node's without it."""
        table = self.node.table
        members, draining, owners = table.view()
        live = [n for n in members if n != peer and n not in draining]
        mine = self.node.node_id
        if mine not in live:
            return []
        with self._lock:
            prepared = set(self._shards)
        return sorted(
            shard
            for shard, owner in owners.items()
            if owner.node == peer and shard not in prepared and table.state_of(shard) is None and owner_of(shard, live) == mine
        )

    def _prepare(self, peer: str) -> None:
        shards = self._heirs(peer)
        if not shards:
            return
        node = self.node
        taken: list[int] = []
        for shard in shards:
            folder = shard_folder(self.runtime.memory_root, shard)
            if not folder.is_dir():
                continue  # no character yet: nothing to load, no lock to prove anything
            if not node.locks.try_acquire(shard, folder):
                # Its owner's process still holds the folder (alive, or paused): not ours to load.
                for held in taken:
                    node.locks.release(held)
                log.info("not preparing the shards of %s: it still holds its folders", peer)
                return
            taken.append(shard)
        started = self._clock()
        with self._lock:
            for shard in taken:
                self._shards[shard] = _Prepared(peer, started)
                node.fence.prepare(shard)
        count = 0
        for shard in taken:
            folder = shard_folder(self.runtime.memory_root, shard)
            try:
                names = list_characters(folder)
            except OSError:
                continue
            for name in names:
                try:
                    count += self._prepare_one(shard, name)
                except Exception as exc:  # noqa: BLE001 - the claim activates it as usual
                    log.warning("shard %d: a character could not be prepared: %s", shard, type(exc).__name__)
        log.info("prepared %d characters of %d shards of %s ahead of their claim", count, len(taken), peer)

    def _prepare_one(self, shard: int, name: str) -> int:
        """Activate one character of a prepared shard if it has work left over; 1 when it was."""
        paths = self.runtime.character_paths(name)
        # Under the lock: adopt() sees either no stamp (not activated here) or the stamp
        # taken before this activation read anything.
        with self._lock:
            prepared = self._shards.get(shard)
            if prepared is None or self.runtime.registry.is_active(name):
                return 0  # claimed (adopted) or let go meanwhile; or loaded before, not from these files
            stamp = folder_stamp(paths.folder)
            if not self.runtime.actors.has_unfinished(paths):
                return 0
            self.runtime.registry.activate(name)
            prepared.stamps[name] = stamp
            self.prepared += 1
        return 1

    # -- the claim -----------------------------------------------------------------------
    def adopt(self, shard: int) -> set[str]:
        """This node's claim of ``shard`` was accepted and its lock is held; called before
        its writes are allowed. Characters prepared from files that changed since are
        stopped (writing nothing) to be activated afresh; returns the names kept as loaded."""
        with self._lock:
            prepared = self._shards.pop(shard, None)
            self.node.fence.unprepare(shard)
        if prepared is None:
            return set()
        registry = self.runtime.registry
        storage = self.runtime.services.storage
        kept: set[str] = set()
        for name, stamp in prepared.stamps.items():
            # A layer that met the fence while loading (it tried to write: a view rebuilt, a
            # record replayed into the outbox) loads again too, now that it may write.
            faulted = storage is not None and storage.has_fault(name)
            if not faulted and registry.is_active(name) and folder_stamp(self.runtime.character_paths(name).folder) == stamp:
                kept.add(name)
                continue
            self.stale += 1
            self._let_go(name)
        self.adopted += len(kept)
        if len(kept) < len(prepared.stamps):
            log.info("shard %d: %d prepared characters changed before the claim and load again", shard, len(prepared.stamps) - len(kept))
        return kept

    # -- letting go ----------------------------------------------------------------------
    def review(self, owners: dict[int, Member], live: list[str]) -> list[int]:
        """The prepared shards to let go now: claimed by another node, going to another
        node by rendezvous, or unclaimed for three TTLs."""
        now = self._clock()
        gone: list[int] = []
        with self._lock:
            for shard, prepared in self._shards.items():
                if self.node.table.state_of(shard) is not None:
                    continue  # ours now: adopt() takes it
                owner = owners.get(shard)
                if owner is not None and owner.node == prepared.peer:
                    stale = now - prepared.started > 3 * self.ttl
                elif owner is not None:
                    stale = True
                else:
                    stale = owner_of(shard, live) != self.node.node_id
                if stale:
                    gone.append(shard)
        return gone

    def abandon(self, shard: int) -> None:
        """Let a prepared shard go: its characters stopped without a write, its lock released."""
        with self._lock:
            prepared = self._shards.pop(shard, None)
        if prepared is None:
            return
        for name in prepared.stamps:  # the characters activated here for this shard
            self._let_go(name)
        with self._lock:
            self.node.fence.unprepare(shard)
        self.node.locks.release(shard)
        self.abandoned += 1
        log.info("shard %d: prepared for a take-over that did not come; let go", shard)

    def _let_go(self, name: str) -> None:
        """Stop a prepared character without a write (the fence still refuses its shard's
        commits) and forget the faults its fenced writes reported."""
        self.runtime.registry.release(name)
        storage = self.runtime.services.storage
        if storage is not None:
            storage.forget_character(name)

    def held(self) -> list[int]:
        with self._lock:
            return sorted(self._shards)

    def stop(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
