"""The fencing deadline and the write guard of cluster mode.

A node may write to a shard only while (a) it holds the shard (a claim etcd accepted, whose
revision is the shard's fencing token) and (b) the fencing deadline has not passed: the
monotonic time at which its last *acknowledged* keepalive was sent, plus
``fence_fraction`` × TTL. etcd cannot have expired the lease before the TTL has run from
that send, so with a fraction well below 1 a node stops writing before anyone else can have
claimed its shards. The clock is ``time.monotonic``, which keeps running while a process is
stopped (SIGSTOP, a frozen VM), so a process that wakes past its deadline refuses every
write until a keepalive succeeds again, and by then its lost shards are no longer in its
table.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

from nekomem.stores.fence import FencedWrite
from nekomem.stores.shard_layout import shard_of_path, shards_root

# A character's side-file naming every node that wrote to it, once per ownership (token).
WRITERS_FILE = ".writers.ndjson"
# Placements remembered (file path -> its shard and character folder): pathlib's parsing in
# every guarded write was about a tenth of a node's interpreter time per /cache turn. A
# character has a handful of files; past this many the memory is dropped all at once.
_PLACEMENTS = 65536


class Fence:
    """The deadline plus the table of shards this node may write (thread-safe)."""

    def __init__(
        self, memory_root: Path, ttl: float, fraction: float, *, node_id: str = "", clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.memory_root = Path(memory_root)
        self.node_id = node_id
        self._shards_root = shards_root(memory_root)
        self._recorded: set[tuple[str, int]] = set()
        # str(path) -> (shard, the character's folder or None for a shard's own file), or
        # None outside every shard. Filled by any thread; a dict assignment is atomic.
        self._placements: dict[str, tuple[int, Path | None] | None] = {}
        self.window = ttl * fraction
        self._clock = clock
        self._lock = threading.Lock()
        self._deadline = 0.0  # nothing may be written before the first keepalive
        self._tokens: dict[int, int] = {}  # shard -> fencing token (the claim's revision)
        # Shards being prepared for a take-over (their folder lock held, no claim yet):
        # their journals may be opened, nothing may be committed.
        self._preparing: set[int] = set()
        self.refusals = 0

    # -- the deadline --------------------------------------------------------------------
    def renewed(self, sent_at: float) -> None:
        """A keepalive sent at monotonic ``sent_at`` was acknowledged."""
        with self._lock:
            self._deadline = max(self._deadline, sent_at + self.window)

    def expire(self) -> None:
        """The lease is gone: nothing may be written until a new one is renewed."""
        with self._lock:
            self._deadline = 0.0

    def remaining(self) -> float:
        """Seconds until the deadline (negative once passed)."""
        return self._deadline - self._clock()

    def live(self) -> bool:
        return self._clock() < self._deadline

    # -- the shards ----------------------------------------------------------------------
    def grant(self, shard: int, token: int) -> None:
        with self._lock:
            self._tokens[shard] = token

    def revoke(self, shard: int) -> None:
        with self._lock:
            self._tokens.pop(shard, None)

    def prepare(self, shard: int) -> None:
        """Let this node open ``shard``'s journals (no commit) before it may write it."""
        with self._lock:
            self._preparing.add(shard)

    def unprepare(self, shard: int) -> None:
        with self._lock:
            self._preparing.discard(shard)

    def token(self, shard: int) -> int | None:
        return self._tokens.get(shard)

    def owned(self) -> dict[int, int]:
        with self._lock:
            return dict(self._tokens)

    def may_write(self, shard: int) -> str | None:
        """None when a write to ``shard`` is allowed now, else why not."""
        if shard not in self._tokens:
            return "shard not owned"
        if self._clock() >= self._deadline:
            return "fencing deadline passed"
        return None

    def guard(self, path: Path) -> None:
        """The write guard installed in :mod:`nekomem.stores.fence`: raises FencedWrite for a
        file inside a shard this node may not write now. Files outside the shard folders
        (the root's core_config.json) are not fenced."""
        placement = self._placement(path)
        if placement is None:
            return
        shard, folder = placement
        why = self.may_write(shard)
        if why is not None:
            with self._lock:
                self.refusals += 1
            raise FencedWrite(path, why)
        if folder is not None:
            self._record_writer(folder, shard)

    def guard_open(self, path: Path) -> None:
        """The check before a writer connection opens (:func:`nekomem.stores.fence.check_open`):
        the write guard's, except that a shard being prepared may be opened."""
        placement = self._placement(path)
        if placement is not None and placement[0] in self._preparing:
            return
        self.guard(path)

    def permits(self, path: Path) -> bool:
        """Whether a write to ``path`` is allowed now (nothing counted, nothing recorded)."""
        placement = self._placement(path)
        return placement is None or self.may_write(placement[0]) is None

    def _placement(self, path: Path) -> tuple[int, Path | None] | None:
        """(shard, character folder or None) of ``path``, or None outside every shard."""
        key = os.fspath(path)
        try:
            return self._placements[key]
        except KeyError:
            pass
        shard = shard_of_path(self.memory_root, Path(path))
        placement: tuple[int, Path | None] | None = None
        if shard is not None:
            parts = Path(path).relative_to(self._shards_root).parts
            # A file of the shard folder itself has no character folder.
            placement = (shard, self._shards_root / parts[0] / parts[1] if len(parts) >= 3 else None)
        if len(self._placements) >= _PLACEMENTS:
            self._placements.clear()
        self._placements[key] = placement
        return placement

    def _record_writer(self, folder: Path, shard: int) -> None:
        """Append this node's id and token to the character's ``.writers.ndjson`` at its
        first write under each ownership: the audit trail that one character's files are
        written by one owner at a time (a side-file: no view or journal format changes)."""
        token = self._tokens.get(shard, 0)
        key = (str(folder), token)
        if key in self._recorded:
            return
        self._recorded.add(key)
        line = json.dumps({"node": self.node_id, "token": token, "pid": os.getpid(), "at": time.time()}) + "\n"
        try:
            fd = os.open(folder / WRITERS_FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                os.write(fd, line.encode())
            finally:
                os.close(fd)
        except OSError:
            self._recorded.discard(key)
