"""The second guard: an ``flock`` on each owned shard's folder.

The owner holds ``<shard folder>/.shard.lock`` exclusively while it owns the shard. A node
that claims a shard in etcd takes the lock before activating any character; if a previous
owner still holds it (it is passivating, or it is a paused process whose lease expired) the
new owner waits up to ``lock_wait`` seconds for it. Past that it goes on without the lock:
the paused process refuses every write once it wakes (its fencing deadline has passed), and
the shard must not stay unavailable for as long as a process is frozen.
"""

from __future__ import annotations

import fcntl
import logging
import os
import time
from pathlib import Path

from nekomem.stores.shard_layout import SHARD_LOCK_FILE

log = logging.getLogger("nekomem.cluster")


class ShardLocks:
    """The flocks this node holds, one per owned shard."""

    def __init__(self) -> None:
        self._fds: dict[int, int] = {}
        self.overrides = 0

    def acquire(self, shard: int, folder: Path, wait: float) -> bool:
        """Take shard ``shard``'s lock within ``wait`` seconds; True when held, False when
        another process still holds it (then this node goes on under the etcd fence alone).
        Raises OSError when the folder cannot be created."""
        if shard in self._fds:
            return True
        folder.mkdir(parents=True, exist_ok=True)
        end = time.monotonic() + wait
        while not self._take(shard, folder):
            if time.monotonic() >= end:
                self.overrides += 1
                log.warning("shard %d: its previous owner still holds the folder lock; relying on the etcd fence", shard)
                return False
            time.sleep(0.05)
        return True

    def try_acquire(self, shard: int, folder: Path) -> bool:
        """Take shard ``shard``'s lock if no process holds it, without waiting; True when
        held (taking it proves that the process which held it is gone or let it go)."""
        if shard in self._fds:
            return True
        return folder.is_dir() and self._take(shard, folder)

    def _take(self, shard: int, folder: Path) -> bool:
        """One attempt at the lock (no wait); True when taken."""
        fd = os.open(folder / SHARD_LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._fds[shard] = fd
        return True

    def release(self, shard: int) -> None:
        fd = self._fds.pop(shard, None)
        if fd is not None:
            os.close(fd)  # closing the only descriptor drops the flock

    def held(self) -> list[int]:
        return sorted(self._fds)

    def release_all(self) -> None:
        for shard in list(self._fds):
            self.release(shard)
