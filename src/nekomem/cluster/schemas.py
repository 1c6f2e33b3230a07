"""Request bodies of the cluster routes (a module of its own: the OpenAPI document imports
it in single-node mode too, without loading cluster mode)."""

from __future__ import annotations

import msgspec


class DrainBody(msgspec.Struct):
    """``POST /cluster/drain``: the node to drain (its shards move to the others), or whose
    drain to end with ``undo``."""

    node: str
    undo: bool = False
