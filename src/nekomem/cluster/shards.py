"""The steps of a shard changing hands, run on the node's worker threads.

* take over (a claim etcd accepted): take the folder lock, allow writes, serve, then
  recover the characters with work left over (the journal reconciler and the outbox replay
  run as after a restart, as they do at any character's activation, so a request that
  activates one first gets the same recovery). Other characters activate on demand.
* hand over (a node joined, this node is drained or stops): new requests wait (the shard is
  LEAVING), the in-flight ones finish, every active character of the shard is passivated
  (its views flushed and fsync'd, its files closed), writes are refused, the lock is
  released, then the key is deleted in a txn comparing its revision: the next owner claims.
* drop (the key expired or changed owner): writes are already refused; the characters are
  stopped and the lock released.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Protocol

from nekomem.cluster.fencing import Fence
from nekomem.cluster.locks import ShardLocks
from nekomem.cluster.table import ClusterTable, Local
from nekomem.runtime.runtime import Runtime
from nekomem.stores.layout import list_characters
from nekomem.stores.shard_layout import shard_folder, shard_of

log = logging.getLogger("nekomem.cluster")


class ShardHolder(Protocol):
    """What a shard's hand-over needs of the node that holds it (the node's own keys in
    etcd, its table, locks and fence), so this module does not import the node."""

    shards: int
    table: ClusterTable
    locks: ShardLocks
    fence: Fence

    @property
    def counters(self) -> ShardCounters: ...

    def token(self, shard: int) -> int | None: ...
    def adopt_prepared(self, shard: int) -> set[str]: ...
    def delete_key(self, shard: int) -> bool: ...
    def forget_token(self, shard: int) -> None: ...


class ShardCounters(Protocol):
    def move(self, kind: str) -> None: ...


class ShardWork:
    def __init__(self, node: ShardHolder, runtime: Runtime) -> None:
        self.node = node
        self.runtime = runtime
        # shard -> characters loaded while the previous owner's lease ran out and kept at
        # the claim: active already, their recovery replayed in memory (see recover()).
        self._adopted: dict[int, set[str]] = {}

    def _names(self, shard: int) -> list[str]:
        registry = self.runtime.registry
        return [name for name in registry.active_names() if shard_of(name, self.node.shards) == shard]

    def _passivate(self, shard: int) -> None:
        for name in self._names(shard):
            self.runtime.registry.release(name)

    def take_over(self, shard: int) -> bool:
        """Take the claimed shard's folder lock, allow its writes and serve it; whether it
        is READY now (False: dropped meanwhile). Its characters are recovered afterwards
        (:meth:`recover`, on the node's recovery thread)."""
        node = self.node
        token = node.token(shard)
        if token is None or node.table.state_of(shard) is not Local.CLAIMING:
            return False
        folder = shard_folder(self.runtime.memory_root, shard)
        node.locks.acquire(shard, folder, self.runtime.settings.cluster.cluster_lock_wait_seconds)
        if node.table.state_of(shard) is not Local.CLAIMING:  # dropped while waiting
            node.locks.release(shard)
            return False
        # Characters loaded while the previous owner's lease ran out are kept when their
        # files did not change; checked before any write is allowed.
        self._adopted[shard] = node.adopt_prepared(shard)
        node.fence.grant(shard, token)
        # Serve first, then recover: a character's activation runs its own recovery (the
        # journal reconciler, the outbox replay) before its first message, whether a
        # request or the recovery activates it. Recovering every character before serving
        # kept the whole shard waiting for the slowest (on a failover, seconds after the
        # lease expired).
        if node.table.state_of(shard) is not Local.CLAIMING:
            return False
        node.table.set_local(shard, Local.READY)
        node.counters.move("claimed")
        return True

    def recover(self, shard: int) -> None:
        """Activate (and flush) each character of a shard taken over that has work left
        over, while the shard stays READY here."""
        node = self.node
        folder = shard_folder(self.runtime.memory_root, shard)
        recovered = 0
        adopted = self._adopted.pop(shard, set())
        for name in list_characters(folder):
            if node.table.state_of(shard) is not Local.READY:
                break  # lost or handed over meanwhile: its characters are someone else's
            if name in adopted and self.runtime.registry.is_active(name):
                # Loaded (its recovery replayed in memory) while the lease ran out: its layers
                # write what the recovery changed at their next flush, and its withheld outbox
                # records go out at the outbox's next look (cluster_fenced_retry_seconds).
                recovered += 1
                continue
            try:
                # The look's journal connection is held until the activation has loaded:
                # the activation then finds the WAL indexed (see TimeIndex.rows_after_cursor).
                with contextlib.ExitStack() as held:
                    if self.runtime.actors.has_unfinished(self.runtime.character_paths(name), hold=held):
                        self.runtime.registry.activate(name)
                        self.runtime.registry.flush(name)
                        recovered += 1
            except Exception as exc:  # noqa: BLE001 - retried at the character's next activation
                log.warning("shard %d: recovery of a character failed: %s", shard, type(exc).__name__)
        log.info("shard %d taken over (token %s, %d characters recovered)", shard, node.token(shard), recovered)

    def hand_over(self, shard: int) -> None:
        node = self.node
        settings = self.runtime.settings.cluster
        if not node.table.wait_drained(shard, settings.cluster_move_timeout_seconds):
            log.warning("shard %d: requests still in flight after %.0fs; passivating anyway", shard, settings.cluster_move_timeout_seconds)
        try:
            self._passivate(shard)
        finally:
            node.fence.revoke(shard)
            node.locks.release(shard)
            node.delete_key(shard)
            node.table.set_local(shard, None)
        node.counters.move("released")
        log.info("shard %d handed over", shard)

    def drop(self, shard: int) -> None:
        node = self.node
        try:
            self._passivate(shard)  # writes are refused already: nothing reaches the files
        finally:
            node.locks.release(shard)
            node.forget_token(shard)
            node.table.set_local(shard, None)

    def give_back(self, shard: int) -> None:
        """A key of this node's lease for a shard it does not serve: delete it."""
        if self.node.table.state_of(shard) is None:
            self.node.delete_key(shard)
