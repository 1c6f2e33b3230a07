"""What one node knows about the cluster: live members, shard owners, and its own shards'
states, with the in-flight count per owned shard (thread-safe; read by the HTTP layer on
every request, written by the node's loop and its move worker)."""

from __future__ import annotations

import enum
import threading
from dataclasses import dataclass

from nekomem.cluster.keys import Member


class Local(enum.Enum):
    READY = "ready"  # owned, writable: requests are served here
    CLAIMING = "claiming"  # claimed in etcd, waiting for the folder lock / recovery
    LEAVING = "leaving"  # being handed over: new requests wait, in-flight ones finish


@dataclass(frozen=True)
class Route:
    """Where a request for one shard goes now: ``local`` (serve it), ``forward`` to
    ``url``, or ``wait`` (moving, or no owner yet)."""

    kind: str
    url: str = ""
    node: str = ""


WAIT = Route("wait")
LOCAL = Route("local")


class ClusterTable:
    def __init__(self, node_id: str) -> None:
        self.node_id = node_id
        self._lock = threading.Lock()
        self.members: dict[str, Member] = {}
        self.draining: set[str] = set()
        self.owners: dict[int, Member] = {}  # from etcd, as last read
        self.local: dict[int, Local] = {}  # this node's shards
        self.inflight: dict[int, int] = {}
        self.version = 0  # bumped on every change, for waiters
        self.changed = threading.Condition(self._lock)

    # -- reads ---------------------------------------------------------------------------
    def route(self, shard: int, *, forwarded: bool) -> Route:
        """Where a request for ``shard`` goes. ``forwarded``: it came from another node,
        which must not be sent on again (that node's view was stale, or ours is)."""
        with self._lock:
            state = self.local.get(shard)
            if state is Local.READY:
                return LOCAL
            if state is not None:
                return WAIT
            owner = self.owners.get(shard)
            if owner is None or owner.node == self.node_id or forwarded or owner.node not in self.members:
                return WAIT
            return Route("forward", owner.url, owner.node)

    def enter(self, shard: int) -> bool:
        """Count one request in flight on ``shard`` if it is READY here (else False)."""
        with self._lock:
            if self.local.get(shard) is not Local.READY:
                return False
            self.inflight[shard] = self.inflight.get(shard, 0) + 1
            return True

    def leave(self, shard: int) -> None:
        with self._lock:
            left = self.inflight.get(shard, 0) - 1
            if left > 0:
                self.inflight[shard] = left
            else:
                self.inflight.pop(shard, None)
            self.changed.notify_all()

    def wait_drained(self, shard: int, timeout: float) -> bool:
        """Wait until no request is in flight on ``shard``; False on timeout."""
        with self._lock:
            return self.changed.wait_for(lambda: self.inflight.get(shard, 0) == 0, timeout)

    def snapshot(self) -> dict[str, object]:
        with self._lock:
            return {
                "node_id": self.node_id,
                "nodes": sorted(self.members),
                "shards_owned": sum(1 for s in self.local.values() if s is Local.READY),
                "moving": sorted(s for s, state in self.local.items() if state is not Local.READY),
                "draining": sorted(self.draining),
            }

    def view(self) -> tuple[dict[str, Member], set[str], dict[int, Member]]:
        """Copies of the members, the drained nodes and the shard owners, as last read."""
        with self._lock:
            return dict(self.members), set(self.draining), dict(self.owners)

    def state_of(self, shard: int) -> Local | None:
        with self._lock:
            return self.local.get(shard)

    def owned(self, state: Local | None = None) -> list[int]:
        with self._lock:
            return sorted(s for s, st in self.local.items() if state is None or st is state)

    def member_urls(self) -> dict[str, str]:
        with self._lock:
            return {m.node: m.url for m in self.members.values()}

    # -- writes --------------------------------------------------------------------------
    def set_view(self, members: dict[str, Member], draining: set[str], owners: dict[int, Member]) -> None:
        with self._lock:
            self.members, self.draining, self.owners = members, draining, owners
            self._bump()

    def set_local(self, shard: int, state: Local | None) -> None:
        with self._lock:
            if state is None:
                self.local.pop(shard, None)
                self.owners.pop(shard, None)
            else:
                self.local[shard] = state
            self._bump()

    def set_owner(self, shard: int, member: Member) -> None:
        with self._lock:
            self.owners[shard] = member
            self._bump()

    def _bump(self) -> None:
        self.version += 1
        self.changed.notify_all()
