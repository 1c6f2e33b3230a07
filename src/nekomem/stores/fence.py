"""The write fence: the last check before a store commits a write.

In cluster mode a node may write to a shard's files only while it owns the shard and its
fencing deadline (see ``nekomem.cluster.fencing``) has not passed. Every store write
helper calls :func:`check` right before its commit point (the rename of an atomic write,
the append of an ndjson batch, the COMMIT of an SQLite transaction), so a process that was
paused past its lease writes nothing once it wakes. In single-node mode no guard is
installed and :func:`check` costs one global read.

A refused write raises :class:`FencedWrite`, a :class:`~nekomem.stores.faults.StorageError`
with the ``shard_fenced`` fault: the actors treat it as any storage fault (the write is
refused, the in-memory state stays equal to the disk) and the HTTP layer answers 503 with
``Retry-After``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from nekomem.stores.faults import FENCED, StorageError

# The installed guard: raises FencedWrite for a path this process may not write now.
WriteGuard = Callable[[Path], None]
_guard: WriteGuard | None = None


class FencedWrite(StorageError):
    """A write refused because this node does not own the file's shard (or its fencing
    deadline passed)."""

    def __init__(self, path: Path, why: str) -> None:
        super().__init__(FENCED, PermissionError(f"{why}: {Path(path).name}"))
        self.why = why


def install(guard: WriteGuard | None) -> None:
    """Install ``guard`` as the process-wide write fence (None removes it)."""
    global _guard
    _guard = guard


def installed() -> WriteGuard | None:
    return _guard


def allowed(path: Path) -> bool:
    """Whether a write to ``path`` would pass :func:`check` now (a refusal is counted as
    one by check would be)."""
    guard = _guard
    if guard is None:
        return True
    try:
        guard(path)
    except FencedWrite:
        return False
    return True


def check(path: Path) -> None:
    """Raise :class:`FencedWrite` when the installed guard refuses a write to ``path``;
    nothing happens when no guard is installed (single-node mode)."""
    guard = _guard
    if guard is not None:
        guard(path)
