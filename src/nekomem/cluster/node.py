"""One node of a nekomem cluster: its lease, its view of the cluster, and its shards.

A loop thread renews the node's lease every ``cluster_poll_seconds`` (at most a third of
the TTL). It reads the members, the drained nodes and the shard owners from etcd, and
reconciles, whenever its watch on the cluster's keys (:mod:`nekomem.cluster.watch`) reports
a change: a member joining, a lease expiring (etcd deletes the dead node's keys then, and
its shards are claimed at once), a hand-over. A full read also runs every
``cluster_resync_seconds`` while the watch is up, and every tick while it is down (the
poll the watch replaced, kept as the fallback). Reconciling: a shard whose rendezvous owner is this node and that has no owner is claimed
(a txn that succeeds only if the key does not exist, the put attached to this node's lease;
its revision is the shard's fencing token); a shard this node owns whose rendezvous owner
is another live node is handed over (see :mod:`nekomem.cluster.shards`); a shard this node
thought it owned but whose key is gone or someone else's is dropped at once (the fence is
revoked before anything else). Claims, hand-overs and drops run on a few worker threads, so
the loop keeps renewing the lease while characters passivate.

etcd unreachable: the node keeps its tables and serves reads; once its fencing deadline has
passed every write is refused (503), and when etcd answers again the lease is renewed (or,
if it expired meanwhile, a new one is granted and the shards are claimed again). No restart.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from nekomem.cluster.etcd import EtcdClient, EtcdError, EtcdUnavailable, LeaseLost, compare_revision, delete_op, put_op
from nekomem.cluster.fencing import Fence
from nekomem.cluster.keys import Keys, Member, decode_member, encode_member, tail
from nekomem.cluster.locks import ShardLocks
from nekomem.cluster.prepare import TakeoverPrep
from nekomem.cluster.ring import owner_of
from nekomem.cluster.shards import ShardWork
from nekomem.cluster.table import ClusterTable, Local
from nekomem.cluster.watch import KeyWatch
from nekomem.config import Settings
from nekomem.runtime.runtime import Runtime
from nekomem.stores import fence as store_fence

log = logging.getLogger("nekomem.cluster")

# Shards claimed in one etcd transaction (two operations each; etcd's default --max-txn-ops is 128).
_CLAIM_BATCH = 32


class ClusterCounters:
    """Counters for /metrics (thread-safe enough: each is written by one thread or under
    the GIL with +=; a lost increment would only undercount)."""

    def __init__(self) -> None:
        self.forwards: dict[str, int] = {}  # outcome -> count
        self.moves: dict[str, int] = {}  # claimed, released, lost
        self.unavailable = 0  # requests answered 503 for want of an owner
        self.etcd_errors = 0
        self.lease_losses = 0
        self.view_reads = 0  # full reads of the key space (watch wakes, resyncs, fallback polls)

    def forward(self, outcome: str) -> None:
        self.forwards[outcome] = self.forwards.get(outcome, 0) + 1

    def move(self, kind: str) -> None:
        self.moves[kind] = self.moves.get(kind, 0) + 1


def live_nodes(members: dict[str, Member], draining: set[str]) -> list[str]:
    """The nodes rendezvous gives shards to: the members not being drained (all of them
    when every one is)."""
    return [n for n in members if n not in draining] or list(members)


class ClusterNode:
    def __init__(self, settings: Settings, runtime: Runtime, *, node_id: str, url: str) -> None:
        c = settings.cluster
        self.settings = settings
        self.runtime = runtime
        self.node_id = node_id
        self.url = url
        self.shards = c.cluster_shards
        self.ttl = max(1, round(c.cluster_lease_ttl_seconds))
        self.period = min(c.cluster_poll_seconds, self.ttl / 3)
        self.resync = c.cluster_resync_seconds
        self.keys = Keys(c.cluster_key_prefix)
        self.etcd = EtcdClient(c.cluster_etcd_url, timeout=min(c.cluster_etcd_timeout_seconds, self.ttl / 3))
        self.fence = Fence(runtime.memory_root, self.ttl, c.cluster_fence_fraction, node_id=node_id)
        self.table = ClusterTable(node_id)
        self.locks = ShardLocks()
        self.counters = ClusterCounters()
        self.lease = 0
        self._tokens: dict[int, int] = {}  # shard -> revision of our claim (also after the fence is revoked)
        self._busy: set[int] = set()  # shards with a job queued or running
        self._busy_lock = threading.Lock()
        self._pool = ThreadPoolExecutor(max_workers=4, thread_name_prefix="nekomem-shards")
        # Characters of shards taken over are recovered here, so a shard claimed with many
        # others (a failover) is never left unserved behind another's recovery on _pool.
        self._recovery = ThreadPoolExecutor(max_workers=1, thread_name_prefix="nekomem-shard-recovery")
        self.work = ShardWork(self, runtime)
        # A dead owner's shards prepared while its lease runs out (nekomem.cluster.prepare).
        self.prep = TakeoverPrep(self, runtime, self.ttl)
        self._stop = threading.Event()
        self._wake = threading.Event()  # the watch saw a change: read the view now
        self.watch = KeyWatch(
            c.cluster_etcd_url,
            self.keys.root,
            self._wake.set,
            connect_timeout=min(c.cluster_etcd_timeout_seconds, self.ttl / 3),
            backoff_max=c.cluster_watch_backoff_max_seconds,
        )
        self._thread: threading.Thread | None = None
        self._etcd_down_since: float | None = None
        self._renewed_at = 0.0  # monotonic send time of the last acknowledged keepalive

    # -- life ----------------------------------------------------------------------------
    def start(self) -> None:
        """Install the write fence, take a lease, register, and start the loop. Raises
        EtcdError when etcd cannot be reached at start (the server does not start)."""
        store_fence.install(self.fence.guard, opener=self.fence.guard_open, probe=self.fence.permits)
        self._new_lease()
        self._thread = threading.Thread(target=self._run, name="nekomem-cluster", daemon=True)
        self._thread.start()
        self.watch.start()
        log.info("cluster node %s started (ttl %ds, %d shards)", self.node_id, self.ttl, self.shards)

    def stop(self, timeout: float = 20.0) -> None:
        """Hand every owned shard back (finish in-flight, passivate, delete the keys),
        revoke the lease, and remove the write fence."""
        self._stop.set()
        self._wake.set()
        self.watch.stop()
        if self._thread is not None:
            self._thread.join(timeout)
        # Prepared shards never claimed are let go while the fence still refuses their
        # writes: the runtime stops (and flushes) whatever is still active after this.
        self.prep.stop()
        for shard in self.prep.held():
            self.prep.abandon(shard)
        for shard in self.table.owned():
            self.table.set_local(shard, Local.LEAVING)
        jobs = [self._pool.submit(self.work.hand_over, shard) for shard in self.table.owned()]
        for job in jobs:
            try:
                job.result(timeout)
            except Exception:
                log.warning("a shard could not be handed over cleanly at stop", exc_info=True)
        try:
            if self.lease:
                self.etcd.revoke(self.lease)
        except EtcdError:
            log.warning("the lease could not be revoked at stop (it expires by itself)")
        self._pool.shutdown(wait=False)
        self._recovery.shutdown(wait=False, cancel_futures=True)
        self.locks.release_all()
        store_fence.install(None)
        self.etcd.close()

    def _new_lease(self) -> None:
        sent = time.monotonic()
        self.lease = self.etcd.grant(self.ttl)
        self.etcd.put(self.keys.node(self.node_id), encode_member(Member(self.node_id, self.url)), self.lease)
        self.fence.renewed(sent)
        self._renewed_at = sent

    def _run(self) -> None:
        read_at = float("-inf")  # when the key space was last read in full
        renew_at = float("-inf")  # when the last keepalive was sent (acknowledged or not)
        while not self._stop.is_set():
            woke = self._wake.is_set()
            self._wake.clear()  # before the read: a change during it wakes the next one
            now = time.monotonic()
            read = woke or not self.watch.healthy or now - read_at >= self.resync
            renew = now - renew_at >= self.period
            if renew:
                renew_at = now
            if read:
                read_at = now
            try:
                self.tick(renew=renew, read=read)
            except Exception:
                log.exception("cluster tick failed")
            # Sleep until the next keepalive is due, or until the watch reports a change.
            self._wake.wait(max(0.0, renew_at + self.period - time.monotonic()))

    # -- one tick ------------------------------------------------------------------------
    def tick(self, *, renew: bool = True, read: bool = True) -> None:
        """Renew the lease (``renew``), read the cluster and reconcile the shards (``read``)."""
        if not read and not renew:
            return
        sent = time.monotonic()
        try:
            if renew:
                self._renew()
            if not read:
                self._etcd_back(sent)
                return
            members, draining, owners = self._read_view()
        except LeaseLost:
            self._lease_lost()
            return
        except EtcdUnavailable as exc:
            self.counters.etcd_errors += 1
            if self._etcd_down_since is None:
                self._etcd_down_since = sent
                log.warning("etcd unreachable (%s); writes stop at the fencing deadline", exc)
            return
        self._etcd_back(sent)
        if self.node_id not in members:  # our key was lost while the lease lived (a manual delete)
            self.etcd.put(self.keys.node(self.node_id), encode_member(Member(self.node_id, self.url)), self.lease)
            members[self.node_id] = Member(self.node_id, self.url)
        self.table.set_view(members, draining, owners)
        self._reconcile(members, draining, owners)

    def _etcd_back(self, sent: float) -> None:
        if self._etcd_down_since is not None:
            log.info("etcd reachable again after %.1fs", sent - self._etcd_down_since)
            self._etcd_down_since = None

    def _renew(self) -> None:
        """One keepalive; once acknowledged, the fencing deadline runs from when it was
        sent. Raises LeaseLost or EtcdUnavailable."""
        sent = time.monotonic()
        self.etcd.keepalive(self.lease)
        self.fence.renewed(sent)
        self._renewed_at = sent

    def _renew_if_due(self) -> bool:
        """Renew in the middle of a long reconciliation (a tick claiming every shard of a
        starting cluster is one etcd transaction per shard, which on a busy disk can take
        longer than the fencing window: the shards claimed first would be READY with the
        deadline passed). False when the renewal failed: the reconciliation stops and the
        next tick handles the lost lease or the unreachable etcd."""
        if time.monotonic() - self._renewed_at < self.period:
            return True
        try:
            self._renew()
        except EtcdError as exc:
            log.warning("a keepalive during the reconciliation failed: %s", exc)
            return False
        return True

    def _read_view(self) -> tuple[dict[str, Member], set[str], dict[int, Member]]:
        # One range over the whole key space: one call per tick, and one revision for the
        # members, the drain marks and the owners alike.
        kvs, _ = self.etcd.range(self.keys.root, prefix=True)
        self.counters.view_reads += 1
        members: dict[str, Member] = {}
        draining: set[str] = set()
        owners: dict[int, Member] = {}
        for kv in kvs:
            if kv.key.startswith(self.keys.nodes):
                member = decode_member(kv.value)
                if member is not None:
                    members[member.node] = member
            elif kv.key.startswith(self.keys.drain):
                draining.add(tail(kv.key, self.keys.drain))
            elif kv.key.startswith(self.keys.shards):
                label = tail(kv.key, self.keys.shards)
                member = decode_member(kv.value)
                if label.isdigit() and member is not None:
                    owners[int(label)] = member
                    if member.node == self.node_id and int(label) not in self._tokens:
                        self._tokens[int(label)] = kv.mod_revision
        return members, draining, owners

    def _reconcile(self, members: dict[str, Member], draining: set[str], owners: dict[int, Member]) -> None:
        live = live_nodes(members, draining)
        for shard in self.prep.review(owners, live):
            self._submit(shard, self.prep.abandon)
        unowned: list[int] = []
        for shard in range(self.shards):
            state = self.table.state_of(shard)
            owner = owners.get(shard)
            mine = owner is not None and owner.node == self.node_id
            desired = owner_of(shard, live)
            if state in (Local.READY, Local.CLAIMING) and not mine:
                self._lose(shard)
            elif state is None and mine:
                self._submit(shard, self.work.give_back)  # a key of ours we do not serve
            elif state is None and owner is None and desired == self.node_id:
                unowned.append(shard)
            elif state is Local.READY and desired != self.node_id and owner is not None:
                self._submit(shard, self._leave)
        # Claimed together (a failover frees a dead node's every shard at once): one etcd
        # transaction per batch, each a commit etcd writes to its disk, instead of one per shard.
        for start in range(0, len(unowned), _CLAIM_BATCH):
            if not self._renew_if_due():
                return
            self._claim_batch(unowned[start : start + _CLAIM_BATCH])

    # -- shard transitions ---------------------------------------------------------------
    def _claim_batch(self, shards: list[int]) -> None:
        """Claim ``shards`` in one transaction that succeeds only if none of their keys
        exists; when another node was faster for one, each is claimed on its own."""
        if len(shards) == 1:
            self._claim(shards[0])
            return
        value = encode_member(Member(self.node_id, self.url))
        compares = [compare_revision(self.keys.shard(shard), "CREATE", 0) for shard in shards]
        puts = [put_op(self.keys.shard(shard), value, self.lease) for shard in shards]
        try:
            result = self.etcd.txn(compares, puts)
        except EtcdError as exc:
            log.warning("claim of %d shards failed: %s", len(shards), exc)
            return
        if not result.succeeded:
            for shard in shards:
                self._claim(shard)
            return
        for shard in shards:
            self._claimed(shard, result.revision)

    def _claim(self, shard: int) -> None:
        key = self.keys.shard(shard)
        value = encode_member(Member(self.node_id, self.url))
        try:
            result = self.etcd.txn([compare_revision(key, "CREATE", 0)], [put_op(key, value, self.lease)])
        except EtcdError as exc:
            log.warning("claim of shard %d failed: %s", shard, exc)
            return
        if not result.succeeded:
            return  # someone else was faster; the next tick reads who
        self._claimed(shard, result.revision)

    def _claimed(self, shard: int, revision: int) -> None:
        """etcd accepted our claim of ``shard`` at ``revision`` (its fencing token): take it over."""
        self._tokens[shard] = revision
        self.table.set_owner(shard, Member(self.node_id, self.url))
        self.table.set_local(shard, Local.CLAIMING)
        if self._begin(shard):
            self._pool.submit(self._take_over, shard)

    def _take_over(self, shard: int) -> None:
        """The claimed shard served (:meth:`ShardWork.take_over`), then its characters
        recovered on the recovery thread; the shard counts as busy until both end."""
        try:
            ready = self.work.take_over(shard)
        except Exception:
            log.exception("shard %d: the take-over failed", shard)
            ready = False
        if ready:
            try:
                self._recovery.submit(self._job, shard, self.work.recover)
                return
            except RuntimeError:
                pass  # the recovery thread is shut down: the node is stopping
        with self._busy_lock:
            self._busy.discard(shard)

    def _leave(self, shard: int) -> None:
        """Hand ``shard`` over to the node rendezvous now gives it, when its turn on the move
        pool comes. It is marked LEAVING (its requests wait for the new owner) only then, not
        when the move is queued: a join or a drain moves a third of the shards or more at
        once, and a shard queued behind the others' hand-overs goes on serving meanwhile
        instead of holding its requests for all of them. Nothing happens when, by then, the
        shard is no longer READY here or rendezvous keeps it here (the joiner left)."""
        state = self.table.state_of(shard)
        if state is Local.LEAVING and not self._stop.is_set():
            # Lost while queued (_lose): its drop could not be queued behind this job.
            self.work.drop(shard)
            return
        if state is not Local.READY:
            return  # stopping: stop() hands it over itself
        members, draining, owners = self.table.view()
        live = live_nodes(members, draining)
        owner = owners.get(shard)
        if owner is None or owner.node != self.node_id or owner_of(shard, live) == self.node_id:
            return
        self.table.set_local(shard, Local.LEAVING)
        self.work.hand_over(shard)

    def _lose(self, shard: int) -> None:
        """The key is gone or someone else's: stop writing now, then let the characters go."""
        self.fence.revoke(shard)
        self.table.set_local(shard, Local.LEAVING)
        self.counters.move("lost")
        log.warning("shard %d lost (its key expired or changed owner)", shard)
        self._submit(shard, self.work.drop)

    def _lease_lost(self) -> None:
        self.counters.lease_losses += 1
        self.fence.expire()
        log.warning("the lease expired; every shard of this node is dropped and a new lease taken")
        for shard in self.table.owned():
            if self.table.state_of(shard) is not Local.LEAVING:
                self._lose(shard)
        try:
            self._new_lease()
        except EtcdError as exc:
            log.warning("no new lease yet: %s", exc)

    def _begin(self, shard: int) -> bool:
        with self._busy_lock:
            if shard in self._busy:
                return False
            self._busy.add(shard)
            return True

    def _submit(self, shard: int, job: object) -> None:
        if self._begin(shard):
            self._pool.submit(self._job, shard, job)

    def _job(self, shard: int, job: object) -> None:
        try:
            assert callable(job)
            job(shard)
        except Exception:
            log.exception("shard %d: a move step failed", shard)
        finally:
            with self._busy_lock:
                self._busy.discard(shard)

    # -- used by the shard work ----------------------------------------------------------
    def suspect(self, peer: str) -> None:
        """A request could not reach ``peer``: prepare a take-over of what would be ours
        if it is gone (:mod:`nekomem.cluster.prepare`; returns at once)."""
        self.prep.suspect(peer)

    def adopt_prepared(self, shard: int) -> set[str]:
        return self.prep.adopt(shard)

    def token(self, shard: int) -> int | None:
        return self._tokens.get(shard)

    def delete_key(self, shard: int) -> bool:
        """Delete the shard's key if it still holds our claim (compares its revision)."""
        token = self._tokens.pop(shard, None)
        if token is None:
            return False
        key = self.keys.shard(shard)
        try:
            return self.etcd.txn([compare_revision(key, "MOD", token)], [delete_op(key)]).succeeded
        except EtcdError as exc:
            log.warning("shard %d: its key could not be deleted (%s); it expires with the lease", shard, exc)
            return False

    def forget_token(self, shard: int) -> None:
        self._tokens.pop(shard, None)

    # -- operations ----------------------------------------------------------------------
    def set_drain(self, node_id: str, on: bool) -> None:
        """Mark ``node_id`` drained (its shards move to the others) or not. Raises EtcdError."""
        if on:
            self.etcd.put(self.keys.drained(node_id), json.dumps({}).encode())
        else:
            self.etcd.delete(self.keys.drained(node_id))
