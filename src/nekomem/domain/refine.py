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

Every function is pure: records in, new records out, time passed in as ``now``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Literal, TypeVar

import msgspec
import numpy as np

from nekomem.config.longterm import LongTermSettings
from nekomem.domain.evidence import merge_evidence, net_score
from nekomem.domain.records import (
    TERMINAL_STATUSES,
    Persona,
    PersonaEntry,
    Reflection,
    VersionRecord,
    age_days,
    manual_entry_id,
    record_get,
    text_sha256,
    to_iso,
)
from nekomem.recall.vector_codec import try_decode

Op = Literal["keep", "modify", "merge", "split", "discard"]
OPS: frozenset[str] = frozenset({"keep", "modify", "merge", "split", "discard"})

REASON_MODIFY = "refine_modify"
REASON_MERGE = "refine_merge"
REASON_SPLIT = "refine_split"
REASON_DISCARD = "refine_discard"

_HASH_CHARS = 16
_REF_ID_CHARS = 16
# Reflections that are "more settled" win a merge; pending is the floor.
_STATUS_RANK = {"pending": 0, "confirmed": 1}

R = TypeVar("R", Reflection, PersonaEntry)


class RefineOp(msgspec.Struct, frozen=True):
    """One validated action of a refine_cluster answer."""

    op: Op
    ids: tuple[str, ...]
    texts: tuple[str, ...] = ()


class RefineOutcome(msgspec.Struct, frozen=True):
    """What applying a refine answer changed.

    ``counts`` maps each op to how many actions of it were applied (invalid ones are not
    counted); ``created`` lists the ids of entries a split made.
    """

    counts: dict[str, int]
    created: list[str]


class ReflectionRefine(msgspec.Struct, frozen=True):
    """Refined reflections: every member (changed or only stamped) and every new one."""

    records: list[Reflection]
    outcome: RefineOutcome


class PersonaRefine(msgspec.Struct, frozen=True):
    """The whole persona after refining one entity's cluster."""

    persona: Persona
    outcome: RefineOutcome


# --- vectors and clusters ---------------------------------------------------------------


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


# --- the model's answer -----------------------------------------------------------------


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


# --- shared helpers ---------------------------------------------------------------------


def _stamp(entry: R, chash: str, now: datetime) -> R:
    return msgspec.structs.replace(entry, last_refine_cluster_hash=chash, last_refine_at=to_iso(now), refine_attempts=0)


def record_failure(entries: Iterable[R], now: datetime) -> list[R]:
    """``entries`` after a failed or unusable refine call: ``refine_attempts`` + 1 and the
    time of the try in ``last_refine_at`` (the cluster hash is left as it was)."""
    stamp = to_iso(now)
    return [msgspec.structs.replace(e, refine_attempts=e.refine_attempts + 1, last_refine_at=stamp) for e in entries]


def _evidence_copy(source: R) -> dict[str, Any]:
    return {
        "reinforcement": source.reinforcement,
        "disputation": source.disputation,
        "rein_last_signal_at": source.rein_last_signal_at,
        "disp_last_signal_at": source.disp_last_signal_at,
        "sub_zero_days": source.sub_zero_days,
        "sub_zero_last_increment_date": source.sub_zero_last_increment_date,
        "user_fact_reinforce_count": source.user_fact_reinforce_count,
    }


def _absorb_all(survivor: R, others: Sequence[R], now: datetime, settings: LongTermSettings) -> R:
    merged = survivor
    for other in others:
        merged = merge_evidence(merged, other, now, settings)
    count = max([survivor.user_fact_reinforce_count, *(o.user_fact_reinforce_count for o in others)])
    return msgspec.structs.replace(merged, user_fact_reinforce_count=count)


def _pick_survivor(members: Sequence[R], now: datetime, settings: LongTermSettings) -> R:
    def key(pair: tuple[int, R]) -> tuple[int, float, int]:
        index, entry = pair
        rank = _STATUS_RANK.get(getattr(entry, "status", "pending"), 0)
        return (rank, net_score(entry, now, settings), -index)

    return max(enumerate(members), key=key)[1]


def _counts() -> dict[str, int]:
    return {op: 0 for op in ("keep", "modify", "merge", "split", "discard")}


# --- reflections ------------------------------------------------------------------------


def new_reflection_id(text: str, now: datetime, taken: Iterable[str]) -> str:
    """``ref_`` + 16 hex of SHA-1 over ``text|now`` (a counter is added on a collision)."""
    used = set(taken)
    salt = 0
    while True:
        seed = f"{text}|{to_iso(now)}" + (f"|{salt}" if salt else "")
        rid = "ref_" + hashlib.sha1(seed.encode("utf-8")).hexdigest()[:_REF_ID_CHARS]
        if rid not in used:
            return rid
        salt += 1


def _history(entry: Reflection, now: datetime, reason: str, **extra: Any) -> list[dict[str, Any]]:
    record = {"old_text": entry.text, "modified_at": to_iso(now), "reason": reason, "absorbed_fact_ids": []}
    record.update(extra)
    return [*entry.modification_history, record]


def _reworded(entry: Reflection, text: str, history: list[dict[str, Any]], **changes: Any) -> Reflection:
    if text != entry.text:
        changes.update(embedding=None, embedding_text_sha256=None, embedding_model_id=None)
    return msgspec.structs.replace(entry, text=text, modification_history=history, **changes)


def _retired(entry: Reflection, now: datetime, into: str, history: list[dict[str, Any]]) -> Reflection:
    return msgspec.structs.replace(entry, status="merged", merged_at=to_iso(now), absorbed_into=into, modification_history=history)


def refine_reflections(
    members: Sequence[Reflection],
    ops: Sequence[RefineOp],
    now: datetime,
    settings: LongTermSettings,
    *,
    taken_ids: Iterable[str] = (),
) -> ReflectionRefine:
    """Apply validated ``ops`` to a cluster's ``members`` (active reflections).

    Returns every member (changed or only stamped) followed by the reflections made by
    splits; ids of new reflections avoid ``taken_ids`` and each other. Ops naming an id
    that is not a member, or a member no longer pending/confirmed, are skipped.
    """
    chash = cluster_hash(m.id for m in members)
    current: dict[str, Reflection] = {m.id: m for m in members if m.status not in TERMINAL_STATUSES}
    done: dict[str, Reflection] = {}
    created: list[Reflection] = []
    taken = set(taken_ids) | {m.id for m in members}
    counts = _counts()
    for action in ops:
        if any(i not in current or i in done for i in action.ids):
            continue
        targets = [current[i] for i in action.ids]
        if action.op == "keep":
            pass
        elif action.op == "modify":
            ref, text = targets[0], action.texts[0]
            if text != ref.text:
                done[ref.id] = _reworded(ref, text, _history(ref, now, REASON_MODIFY))
        elif action.op == "discard":
            for ref in targets:
                done[ref.id] = msgspec.structs.replace(ref, status="denied", denied_at=to_iso(now), denied_reason=REASON_DISCARD)
        elif action.op == "merge":
            survivor = _pick_survivor(targets, now, settings)
            others = [r for r in targets if r.id != survivor.id]
            sources = sorted({fid for r in targets for fid in r.source_fact_ids})
            best = max(targets, key=lambda r: _STATUS_RANK.get(r.status, 0))
            status_fields: dict[str, Any] = {}
            if _STATUS_RANK.get(best.status, 0) > _STATUS_RANK.get(survivor.status, 0):
                status_fields = {"status": best.status, "confirmed_at": best.confirmed_at, "auto_confirmed": best.auto_confirmed}
            history = _history(
                survivor, now, REASON_MERGE,
                absorbed_fact_ids=[f for f in sources if f not in set(survivor.source_fact_ids)],
                merged_from_ids=[r.id for r in others],
            )
            merged = _absorb_all(survivor, others, now, settings)
            done[survivor.id] = _reworded(merged, action.texts[0], history, source_fact_ids=sources, **status_fields)
            for other in others:
                done[other.id] = _retired(other, now, survivor.id, _history(other, now, REASON_MERGE, merged_into=survivor.id))
        elif action.op == "split":
            ref = targets[0]
            parts: list[Reflection] = []
            for text in action.texts:
                rid = new_reflection_id(text, now, taken)
                taken.add(rid)
                parts.append(
                    Reflection(
                        id=rid,
                        text=text,
                        entity=ref.entity,
                        status=ref.status,
                        source_fact_ids=list(ref.source_fact_ids),
                        created_at=ref.created_at,
                        next_eligible_at=ref.next_eligible_at,
                        relation_type=ref.relation_type,
                        subject=ref.subject,
                        temporal_scope=ref.temporal_scope,
                        event_when_raw=ref.event_when_raw,
                        event_start_at=ref.event_start_at,
                        event_end_at=ref.event_end_at,
                        schema_version=ref.schema_version,
                        confirmed_at=ref.confirmed_at,
                        auto_confirmed=ref.auto_confirmed,
                        modification_history=[{"old_text": ref.text, "modified_at": to_iso(now), "reason": REASON_SPLIT,
                                               "absorbed_fact_ids": [], "split_from": ref.id}],
                        **_evidence_copy(ref),
                    )
                )
            done[ref.id] = _retired(ref, now, parts[0].id, _history(ref, now, REASON_SPLIT, split_into=[p.id for p in parts]))
            created.extend(parts)
        counts[action.op] += 1
    records = [_stamp(done.get(m.id, m), chash, now) for m in members]
    records.extend(_stamp(r, chash, now) for r in created)
    return ReflectionRefine(records=records, outcome=RefineOutcome(counts=counts, created=[r.id for r in created]))


# --- persona ----------------------------------------------------------------------------


def _version(entry: PersonaEntry, now: datetime, reason: str, settings: LongTermSettings) -> list[VersionRecord]:
    history = [*entry.version_history, VersionRecord(text=entry.text, replaced_at=to_iso(now), reason=reason)]
    keep = settings.persona_version_history_max
    return history[-keep:] if keep else []


def _rewritten(entry: PersonaEntry, text: str, versions: list[VersionRecord], **changes: Any) -> PersonaEntry:
    if text != entry.text:
        changes.update(
            token_count=None, token_count_text_sha256=None, token_count_tokenizer=None,
            embedding=None, embedding_text_sha256=None, embedding_model_id=None,
        )
    return msgspec.structs.replace(entry, text=text, version_history=versions, **changes)


def _unique(items: Iterable[str | None], exclude: Iterable[str] = ()) -> list[str]:
    skip = set(exclude)
    result: list[str] = []
    for item in items:
        if item and item not in skip and item not in result:
            result.append(item)
    return result


def refine_persona(
    persona: Mapping[str, Sequence[PersonaEntry]],
    entity: str,
    cluster_ids: Sequence[str],
    ops: Sequence[RefineOp],
    now: datetime,
    settings: LongTermSettings,
) -> PersonaRefine:
    """Apply validated ``ops`` to the cluster ``cluster_ids`` of section ``entity``.

    Returns a new persona (other sections and entries untouched, order kept, split parts in
    the place of their original). Protected entries and ids not in that section are never
    changed, even when an op names them.
    """
    section = list(persona.get(entity, []))
    chash = cluster_hash(cluster_ids)
    members = {e.id: e for e in section if e.id in set(cluster_ids) and not e.protected}
    replaced: dict[str, list[PersonaEntry]] = {}  # id -> what stands in its place ([] = removed)
    touched: set[str] = set()
    taken = {e.id for entries in persona.values() for e in entries}
    created: list[str] = []
    counts = _counts()
    for action in ops:
        if any(i not in members or i in touched for i in action.ids):
            continue
        targets = [members[i] for i in action.ids]
        if action.op == "keep":
            pass
        elif action.op == "modify":
            entry, text = targets[0], action.texts[0]
            if text != entry.text:
                replaced[entry.id] = [_rewritten(entry, text, _version(entry, now, REASON_MODIFY, settings))]
        elif action.op == "discard":
            for entry in targets:
                replaced[entry.id] = []
        elif action.op == "merge":
            survivor = _pick_survivor(targets, now, settings)
            others = [e for e in targets if e.id != survivor.id]
            absorbed = _unique(
                [*survivor.merged_from_ids, *(x for o in others for x in (*o.merged_from_ids, o.source_id, o.id))],
                exclude=[survivor.id],
            )
            merged = _absorb_all(survivor, others, now, settings)
            replaced[survivor.id] = [_rewritten(merged, action.texts[0], _version(survivor, now, REASON_MERGE, settings), merged_from_ids=absorbed)]
            for other in others:
                replaced[other.id] = []
        elif action.op == "split":
            entry = targets[0]
            parts: list[PersonaEntry] = []
            for index, text in enumerate(action.texts):
                pid = manual_entry_id(text, now, salt=f"refine|{entry.id}|{index}|")
                while pid in taken:
                    pid = manual_entry_id(text, now, salt=f"refine|{entry.id}|{index}|{len(taken)}|")
                taken.add(pid)
                parts.append(
                    PersonaEntry(
                        id=pid,
                        text=text,
                        source=entry.source,
                        source_id=entry.source_id,
                        created_at=entry.created_at,
                        merged_from_ids=_unique([*entry.merged_from_ids, entry.id]),
                        version_history=_version(entry, now, REASON_SPLIT, settings),
                        **_evidence_copy(entry),
                    )
                )
            replaced[entry.id] = parts
            created.extend(p.id for p in parts)
        touched.update(action.ids)
        counts[action.op] += 1
    new_section: list[PersonaEntry] = []
    for entry in section:
        if entry.id not in members:
            new_section.append(entry)
            continue
        for item in replaced.get(entry.id, [entry]):
            new_section.append(_stamp(item, chash, now))
    result = {k: list(v) for k, v in persona.items()}
    result[entity] = new_section
    return PersonaRefine(persona=result, outcome=RefineOutcome(counts=counts, created=created))


def persona_failure(persona: Mapping[str, Sequence[PersonaEntry]], entity: str, cluster_ids: Sequence[str], now: datetime) -> Persona:
    """A new persona whose cluster members (of section ``entity``, non-protected) carry one
    more failed refine attempt (:func:`record_failure`)."""
    wanted = set(cluster_ids)
    result = {k: list(v) for k, v in persona.items()}
    result[entity] = [
        record_failure([e], now)[0] if e.id in wanted and not e.protected else e for e in persona.get(entity, [])
    ]
    return result
