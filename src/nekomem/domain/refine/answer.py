"""The refine_cluster answer (untrusted): the actions that are well-formed over a
cluster's ids (see :mod:`nekomem.domain.refine`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import msgspec

from nekomem.domain.records import (
    record_get,
)

Op = Literal["keep", "modify", "merge", "split", "discard"]
OPS: frozenset[str] = frozenset({"keep", "modify", "merge", "split", "discard"})


class RefineOp(msgspec.Struct, frozen=True):
    """One validated action of a refine_cluster answer."""

    op: Op
    ids: tuple[str, ...]
    texts: tuple[str, ...] = ()


def _clean_texts(raw: Any) -> list[str]:
    if not isinstance(raw, (list, tuple)):
        return []
    seen: list[str] = []
    for item in raw:
        if isinstance(item, str) and item.strip() and item.strip() not in seen:
            seen.append(item.strip())
    return seen


def parse_actions(output: Any, cluster_ids: Sequence[str]) -> list[RefineOp]:
    """The valid actions of a refine_cluster answer over ``cluster_ids``, in answer order.

    Ids outside the cluster (unknown, protected, from another cluster) and ids already named
    by an earlier action are dropped from an action; then an action is kept only when it
    still makes sense: keep/discard need one id, modify one id and a text, merge two ids
    and a text (the first), split one id and texts (a single text makes it a modify).
    Empty and repeated texts are ignored. Discarding every member is refused (dropped).
    Never raises: a malformed answer gives an empty list.
    """
    allowed = set(cluster_ids)
    raw_actions = record_get(output, "actions")
    if not isinstance(raw_actions, (list, tuple)):
        return []
    used: set[str] = set()
    ops: list[RefineOp] = []
    for item in raw_actions:
        op = record_get(item, "op")
        raw_ids = record_get(item, "ids")
        if op not in OPS or not isinstance(raw_ids, (list, tuple)):
            continue
        ids: list[str] = []
        for rid in raw_ids:
            if isinstance(rid, str) and rid in allowed and rid not in used and rid not in ids:
                ids.append(rid)
        texts = _clean_texts(record_get(item, "texts", []))
        action: RefineOp | None = None
        if op in ("keep", "discard") and ids:
            action = RefineOp(op, tuple(ids))
        elif op == "modify" and len(ids) == 1 and texts:
            action = RefineOp("modify", tuple(ids), (texts[0],))
        elif op == "merge" and len(ids) >= 2 and texts:
            action = RefineOp("merge", tuple(ids), (texts[0],))
        elif op == "split" and len(ids) == 1 and texts:
            action = RefineOp("split", tuple(ids), tuple(texts)) if len(texts) > 1 else RefineOp("modify", tuple(ids), (texts[0],))
        if action is None:
            continue
        used.update(action.ids)
        ops.append(action)
    discarded = {i for a in ops if a.op == "discard" for i in a.ids}
    if allowed and discarded >= allowed:
        ops = [a for a in ops if a.op != "discard"]
    return ops
