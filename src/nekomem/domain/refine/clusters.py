"""Refinement clusters: near-duplicate entries grouped by the cosine of their cached
vectors (see :mod:`nekomem.domain.refine`)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, TypeVar

import numpy as np

from nekomem.config.longterm import LongTermSettings
from nekomem.domain.records import (
    PersonaEntry,
    Reflection,
    age_days,
    text_sha256,
)
from nekomem.domain.vector_codec import try_decode

_HASH_CHARS = 16

R = TypeVar("R", Reflection, PersonaEntry)


def cached_vector(entry: Any, model_id: str | None, dim: int | None) -> np.ndarray | None:
    """The entry's cached vector, decoded and unit-length, if it was computed by
    ``model_id`` for the entry's current text; None otherwise (missing, stale or corrupt)."""
    if not model_id or not dim or entry.embedding is None:
        return None
    if entry.embedding_model_id != model_id or entry.embedding_text_sha256 != text_sha256(entry.text):
        return None
    return try_decode(entry.embedding, int(dim))


def cosine_matrix(vectors: Sequence[np.ndarray]) -> np.ndarray:
    """Pairwise cosine of unit vectors as an [n, n] float matrix (n may be 0).

    Raises ValueError when the vectors do not all have the same length."""
    if not vectors:
        return np.zeros((0, 0), dtype=np.float32)
    matrix = np.vstack([np.asarray(v, dtype=np.float32) for v in vectors])
    return matrix @ matrix.T


def neighbours(similarity: np.ndarray, threshold: float, topk: int) -> list[list[int]]:
    """Per row, the indexes of its ``topk`` most similar other rows with similarity at
    or above ``threshold``, most similar first (ties: lower index first)."""
    sim = np.asarray(similarity, dtype=np.float64)
    n = sim.shape[0]
    result: list[list[int]] = []
    for i in range(n):
        row = sim[i].copy()
        row[i] = -np.inf
        order = np.argsort(-row, kind="stable")
        result.append([int(j) for j in order[:topk] if row[j] >= threshold])
    return result


def build_clusters(
    ids: Sequence[str],
    similarity: np.ndarray,
    *,
    threshold: float,
    topk: int,
    size_max: int,
    limit: int,
    skip: Callable[[list[str]], bool] | None = None,
) -> list[list[str]]:
    """Disjoint clusters of near-duplicates among ``ids`` (see the module docstring).

    ``similarity`` is the [n, n] similarity of ``ids`` (any symmetric score, usually the
    cosine). At most ``limit`` clusters come back, each of 2..``size_max`` ids, seed first,
    then by similarity to the seed. A cluster for which ``skip(ids)`` is true is not
    returned and does not count towards ``limit``; its members are not reused. Raises
    ValueError when the matrix does not match ``ids``.
    """
    n = len(ids)
    sim = np.asarray(similarity, dtype=np.float64)
    if sim.shape != (n, n):
        raise ValueError(f"similarity has shape {sim.shape}, expected {(n, n)}")
    if limit <= 0 or size_max < 2 or n < 2:
        return []
    edges: list[dict[int, float]] = [{} for _ in range(n)]
    for i, near in enumerate(neighbours(sim, threshold, topk)):
        for j in near:
            weight = float(max(sim[i, j], sim[j, i]))
            edges[i][j] = max(edges[i].get(j, weight), weight)
            edges[j][i] = max(edges[j].get(i, weight), weight)
    seeds = sorted((i for i in range(n) if edges[i]), key=lambda i: (-max(edges[i].values()), i))
    assigned: set[int] = set()
    clusters: list[list[str]] = []
    for seed in seeds:
        if seed in assigned:
            continue
        near = sorted((j for j in edges[seed] if j not in assigned), key=lambda j: (-edges[seed][j], j))
        members = [seed, *near[: size_max - 1]]
        if len(members) < 2:
            continue
        assigned.update(members)
        cluster = [ids[i] for i in members]
        if skip is not None and skip(cluster):
            continue
        clusters.append(cluster)
        if len(clusters) >= limit:
            break
    return clusters


def cluster_hash(ids: Iterable[str]) -> str:
    """Identity of a cluster's member set: 16 hex of SHA-256 over the sorted ids, each
    followed by a NUL byte (order does not matter)."""
    digest = hashlib.sha256()
    for item in sorted(set(ids)):
        digest.update(item.encode("utf-8"))
        digest.update(b"\x00")
    return digest.hexdigest()[:_HASH_CHARS]


def refine_eligible(entry: Reflection | PersonaEntry, now: datetime, settings: LongTermSettings) -> bool:
    """False for an entry whose refinement failed ``longterm_refine_max_attempts`` times,
    until ``longterm_dead_letter_self_heal_seconds`` after its last try (then one probe)."""
    if entry.refine_attempts < settings.longterm_refine_max_attempts:
        return True
    age = age_days(entry.last_refine_at, now)
    return age is None or age * 86400.0 >= settings.longterm_dead_letter_self_heal_seconds


def recently_refined(members: Sequence[Reflection | PersonaEntry], now: datetime, settings: LongTermSettings) -> bool:
    """True when this exact member set was refined successfully less than
    ``longterm_refine_revisit_after_days`` ago (every member carries its hash)."""
    if not members:
        return False
    wanted = cluster_hash(m.id for m in members)
    for member in members:
        if member.last_refine_cluster_hash != wanted or member.refine_attempts:
            return False
        age = age_days(member.last_refine_at, now)
        if age is None or age >= settings.longterm_refine_revisit_after_days:
            return False
    return True


def _refined_lately(
    by_id: Mapping[str, Reflection | PersonaEntry], now: datetime, settings: LongTermSettings
) -> Callable[[Sequence[str]], bool]:
    """Whether a cluster of these ids was refined lately (see :func:`recently_refined`)."""
    return lambda ids: recently_refined([by_id[i] for i in ids], now, settings)


def plan_clusters(
    groups: Iterable[Sequence[R]],
    vector_of: Callable[[R], np.ndarray | None],
    now: datetime,
    settings: LongTermSettings,
) -> list[list[str]]:
    """The clusters of one pass over ``groups`` (entries never cluster across groups),
    at most ``longterm_refine_clusters_per_pass`` in all.

    Entries without a vector (``vector_of`` gives None) or not :func:`refine_eligible` are
    left out; recently refined clusters are skipped. Raises nothing for mismatched vector
    lengths: such a group is skipped.
    """
    limit = settings.longterm_refine_clusters_per_pass
    result: list[list[str]] = []
    for group in groups:
        if len(result) >= limit:
            break
        pool: list[R] = []
        vectors: list[np.ndarray] = []
        for entry in group:
            if not refine_eligible(entry, now, settings):
                continue
            vec = vector_of(entry)
            if vec is None:
                continue
            pool.append(entry)
            vectors.append(vec)
        if len(pool) < 2:
            continue
        try:
            sim = cosine_matrix(vectors)
        except ValueError:
            continue
        result.extend(
            build_clusters(
                [e.id for e in pool],
                sim,
                threshold=settings.longterm_refine_cosine_threshold,
                topk=settings.longterm_refine_topk_per_entry,
                size_max=settings.longterm_refine_cluster_size_max,
                limit=limit - len(result),
                skip=_refined_lately({e.id: e for e in pool}, now, settings),
            )
        )
    return result
