"""Moving a single-node memory root into cluster mode's layout.

A single node keeps a character in ``<root>/<name>/``; cluster mode reads it from
``<root>/shards/<NNNN>/<name>/`` and never looks at the first place. A root that served one
node must therefore be moved before the first cluster node starts on it, or its characters
would be invisible to the cluster (the server's start-up in cluster mode refuses a root
where :func:`nekomem.stores.layout.list_characters` still finds any).

The move renames each character folder into its shard's folder: the files themselves are
not rewritten, and a rename within one file system is atomic, so an interrupted move
leaves every character whole in one place or the other, and running it again moves the
rest. It runs under the root's exclusive lock (no server may hold the root meanwhile).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import NamedTuple

from nekomem.stores import rootlock
from nekomem.stores.atomic import fsync_dir
from nekomem.stores.layout import DEFAULT_NAME_MAX_LENGTH, list_characters
from nekomem.stores.shard_layout import SHARDS_DIR, character_root, shard_of, shards_root

# Where a character named like the shards folder waits while that folder is created.
_PARKED = ".nkatmp-shards-character"


class Move(NamedTuple):
    """One character folder and where it goes."""

    name: str
    shard: int
    source: Path
    target: Path


class ShardMigrationError(Exception):
    """The move cannot be done as asked; nothing was moved by the call that raised it."""


def plan(root: Path, shards: int, *, max_length: int = DEFAULT_NAME_MAX_LENGTH) -> list[Move]:
    """The moves that would put every single-node character of ``root`` into its shard
    among ``shards``. Raises :class:`ShardMigrationError` when a character is already in
    the cluster layout too (two copies: the user must choose), OSError on I/O."""
    moves = [
        Move(name, shard_of(name, shards), root / name, character_root(root, name, shards) / name)
        for name in list_characters(root, max_length=max_length)
    ]
    both = [m.name for m in moves if m.target.exists()]
    if both:
        shown = ", ".join(both[:5]) + (f" and {len(both) - 5} more" if len(both) > 5 else "")
        raise ShardMigrationError(
            f"{len(both)} character(s) are in both layouts ({shown}): keep one copy of each "
            "(move or delete the other folder), then run the move again"
        )
    return moves


def move_into_shards(
    root: Path,
    shards: int,
    *,
    max_length: int = DEFAULT_NAME_MAX_LENGTH,
) -> list[Move]:
    """Move every single-node character of ``root`` into its shard's folder, under the
    root's exclusive lock; the moves made, each durable.

    Raises :class:`rootlock.RootLocked` while a server holds the root,
    :class:`ShardMigrationError` as :func:`plan` does (before anything moves), and
    OSError on I/O (the moves made so far stay made; running it again moves the rest).
    """
    root = Path(root)
    with rootlock.acquire(root, "exclusive", role="cluster shard-root"):
        moves = plan(root, shards, max_length=max_length)
        # A character named like the shards folder *is* that folder today: it waits under
        # a reserved name (one the temp-file sweep does not match) while the real shards
        # folder is made, and an earlier run that stopped after parking it is finished.
        parked = root / _PARKED
        if parked.is_dir():
            target = character_root(root, SHARDS_DIR, shards) / SHARDS_DIR
            if target.exists():
                raise ShardMigrationError(
                    f"{parked} and {target} both hold the character {SHARDS_DIR!r}: keep one, then run the move again"
                )
            moves.append(Move(SHARDS_DIR, shard_of(SHARDS_DIR, shards), parked, target))
        for i, move in enumerate(moves):
            if move.source == shards_root(root):
                os.rename(move.source, parked)
                fsync_dir(root)
                moves[i] = move._replace(source=parked)
        for move in moves:
            created = not move.target.parent.is_dir()
            move.target.parent.mkdir(parents=True, exist_ok=True)
            if created:
                fsync_dir(move.target.parent.parent)
                fsync_dir(root)
            os.rename(move.source, move.target)
            fsync_dir(move.target.parent)
            fsync_dir(move.source.parent)
        return moves
