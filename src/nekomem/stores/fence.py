"""The write fence: the last check before a store commits a write.

In cluster mode a node may write to a shard's files only while it owns the shard and its
fencing deadline (see ``nekomem.cluster.fencing``) has not passed. Every store write
helper calls :func:`check` right before its commit point (the rename of an atomic write,
the append of an ndjson batch, the COMMIT of an SQLite transaction), so a process that was
paused past its lease writes nothing once it wakes. In single-node mode no guard is
installed and :func:`check` costs one global read.

Opening a journal's writer connection is checked separately (:func:`check_open`): a node
preparing a shard whose owner is gone may open it, and still commit nothing, before etcd
gives it the shard (``nekomem.cluster.prepare``).

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
# The check before a writer connection opens (None: the guard's), and a look that counts no
# refusal (None: :func:`allowed`).
_opener: WriteGuard | None = None
_probe: Callable[[Path], bool] | None = None


class FencedWrite(StorageError):
    """A write refused because this node does not own the file's shard (or its fencing
    deadline passed)."""

    def __init__(self, path: Path, why: str) -> None:
        super().__init__(FENCED, PermissionError(f"{why}: {Path(path).name}"))
        self.why = why


def install(guard: WriteGuard | None, *, opener: WriteGuard | None = None, probe: Callable[[Path], bool] | None = None) -> None:
    """Install ``guard`` as the process-wide write fence (None removes it, with the rest).
    ``opener``: the check of :func:`check_open` (default: ``guard``); ``probe``: the look of
    :func:`permits` (default: :func:`allowed`)."""
    global _guard, _opener, _probe
    _guard = guard
    _opener = opener if guard is not None else None
    _probe = probe if guard is not None else None


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


def permits(path: Path) -> bool:
    """Whether a write to ``path`` would pass :func:`check` now, counting no refusal: for
    work that waits until it may write (the outbox's dispatch)."""
    probe = _probe
    if probe is not None:
        return probe(path)
    return allowed(path)


def check_open(path: Path) -> None:
    """Raise :class:`FencedWrite` when this process may not open a writer connection on
    ``path`` now. Opening commits nothing of its own (the commits are checked by
    :func:`check`); a node preparing a take-over may open what it may not yet write."""
    opener = _opener or _guard
    if opener is not None:
        opener(path)


def check(path: Path) -> None:
    """Raise :class:`FencedWrite` when the installed guard refuses a write to ``path``;
    nothing happens when no guard is installed (single-node mode)."""
    guard = _guard
    if guard is not None:
        guard(path)
