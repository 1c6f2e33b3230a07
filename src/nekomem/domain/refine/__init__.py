"""Refinement of near-duplicate reflections and persona entries (pure logic).

A pass groups entries into clusters by the cosine of their cached vectors: each entry's
nearest ``longterm_refine_topk_per_entry`` neighbours at or above
``longterm_refine_cosine_threshold`` are its edges; a cluster is the unassigned entry with
the strongest edge (the seed) plus its unassigned neighbours, strongest first, up to
``longterm_refine_cluster_size_max`` members. Clusters never overlap within a pass, and a
cluster whose exact member set was refined less than ``longterm_refine_revisit_after_days``
ago is skipped (its members stay assigned, so an unchanged store gives the same partition
on every pass and nothing is sent).

The ``refine_cluster`` answer is untrusted. :func:`parse_actions` keeps only the actions
that are well-formed over the ids of the cluster (each id in at most one action); then
:func:`refine_reflections` / :func:`refine_persona` turn them into new records:

- keep: unchanged (only the refine stamps move);
- modify: new text, old text kept in the history, vector and token caches cleared;
- merge: the strongest member survives with the merged text, the highest status and the
  max of each evidence side (``merge_evidence``); the other members become ``merged``
  (reflections, ``absorbed_into`` = survivor) or are removed (persona); source fact ids
  (reflections) or absorbed ids (persona ``merged_from_ids``) are kept on the survivor;
- split: one member becomes several new entries, each inheriting its evidence, sources,
  status and times; the original becomes ``merged`` into the first new one (reflections) or
  is removed (persona);
- discard: reflections become ``denied`` with reason ``refine_discard``; persona entries
  are removed. Discarding every member of a cluster is refused (they are kept).

Members that no action names count as kept. Every member gets the cluster hash, the time,
and ``refine_attempts`` reset to 0; a failed call instead adds 1 to ``refine_attempts``
(and stamps the time), and a member with ``longterm_refine_max_attempts`` failures is left
out of clustering until ``longterm_dead_letter_self_heal_seconds`` after its last try.

Every function is pure: records in, new records out, time passed in as ``now``. The
modules: :mod:`.clusters` (vectors and clusters), :mod:`.answer` (the model's answer),
:mod:`.apply` (one algorithm over both kinds of record); this package re-exports them.
"""

from __future__ import annotations

from nekomem.domain.refine.answer import OPS, Op, RefineOp, parse_actions
from nekomem.domain.refine.apply import (
    REASON_DISCARD,
    REASON_MERGE,
    REASON_MODIFY,
    REASON_SPLIT,
    PersonaRefine,
    RefineOutcome,
    ReflectionRefine,
    new_reflection_id,
    persona_failure,
    record_failure,
    refine_persona,
    refine_reflections,
)
from nekomem.domain.refine.apply import (
    _stamp as _stamp,  # the refine stamp, used by tests
)
from nekomem.domain.refine.clusters import (
    build_clusters,
    cached_vector,
    cluster_hash,
    cosine_matrix,
    neighbours,
    plan_clusters,
    recently_refined,
    refine_eligible,
)

__all__ = [
    "OPS",
    "REASON_DISCARD",
    "REASON_MERGE",
    "REASON_MODIFY",
    "REASON_SPLIT",
    "Op",
    "PersonaRefine",
    "RefineOp",
    "RefineOutcome",
    "ReflectionRefine",
    "build_clusters",
    "cached_vector",
    "cluster_hash",
    "cosine_matrix",
    "neighbours",
    "new_reflection_id",
    "parse_actions",
    "persona_failure",
    "plan_clusters",
    "recently_refined",
    "record_failure",
    "refine_eligible",
    "refine_persona",
    "refine_reflections",
]
