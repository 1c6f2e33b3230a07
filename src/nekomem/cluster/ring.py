"""Rendezvous (highest random weight) hashing of shards over the live nodes.

Each (shard, node) pair gets a stable score; the shard belongs to the node with the highest.
When a node joins it takes about 1/N of the shards, from every node alike; when one leaves,
only its shards move. No state is kept: every node computes the same answer from the same
membership.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable


def _score(shard: int, node: str) -> int:
    digest = hashlib.blake2b(f"{shard}\x00{node}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def owner_of(shard: int, nodes: Iterable[str]) -> str | None:
    """The node that should own ``shard`` among ``nodes`` (None when there is none)."""
    best: tuple[int, str] | None = None
    for node in nodes:
        candidate = (_score(shard, node), node)
        if best is None or candidate > best:
            best = candidate
    return None if best is None else best[1]


def assignment(shards: int, nodes: Iterable[str]) -> dict[int, str]:
    """Every shard's desired owner (empty when there is no node)."""
    members = sorted(set(nodes))
    if not members:
        return {}
    return {shard: owner_of(shard, members) or members[0] for shard in range(shards)}
