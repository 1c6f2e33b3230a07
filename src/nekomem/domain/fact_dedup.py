"""Fact dedup: exact and lexical near-duplicates before persisting, and the queue of
paraphrase pairs the ``judge_duplicates`` model call decides.

Pure functions over :class:`~nekomem.domain.records.Fact` lists; the FactActor owns the
files, the queue's place in its state and the LLM calls. ``now`` is always an argument.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime

import msgspec

from nekomem.config.longterm import LongTermSettings
from nekomem.domain.dedup_key import DedupKey, dedup_key, near_duplicate
from nekomem.domain.records import (
    IMPORTANCE_MAX,
    DedupPair,
    Fact,
    fact_hash,
    record_get,
    to_iso,
)

# --- dedup before persisting -------------------------------------------------------------


class DedupOutcome(msgspec.Struct, frozen=True):
    """What to persist after dedup.

    ``accepted``: new facts to append. ``upgraded``: stored facts whose source goes from
    ai_disclosure to user_observation (re-entering Stage 2). ``skipped_exact`` and
    ``skipped_near``: (new text hash, id of the fact it duplicates).
    """

    accepted: list[Fact]
    upgraded: list[Fact]
    skipped_exact: list[tuple[str, str]]
    skipped_near: list[tuple[str, str]]


def dedup_new_facts(new_facts: Sequence[Fact], existing: Sequence[Fact], settings: LongTermSettings) -> DedupOutcome:
    """Exact-hash then lexical near-duplicate check of ``new_facts`` against ``existing``
    (active and archived facts) and against facts accepted earlier in the same batch.

    Exact: same ``hash`` -> skipped; if the stored fact is ``ai_disclosure`` and the new one
    ``user_observation``, the stored fact is upgraded (never downgraded). Near: the same
    numbers, negations and names and keyword Jaccard >= ``fact_near_dup_jaccard_threshold``
    with a fact of the same entity (:mod:`nekomem.domain.dedup_key`) -> skipped.
    """
    by_hash: dict[str, Fact] = {}
    for fact in existing:
        by_hash.setdefault(fact.hash, fact)
    buckets: dict[str, list[tuple[DedupKey, str]]] = {}
    for fact in existing:
        buckets.setdefault(fact.entity, []).append((dedup_key(fact.text), fact.id))
    accepted: list[Fact] = []
    upgraded: dict[str, Fact] = {}
    skipped_exact: list[tuple[str, str]] = []
    skipped_near: list[tuple[str, str]] = []
    threshold = settings.fact_near_dup_jaccard_threshold
    for fact in new_facts:
        same = by_hash.get(fact.hash)
        if same is not None:
            skipped_exact.append((fact.hash, same.id))
            if same.source == "ai_disclosure" and fact.source == "user_observation" and same.id not in upgraded:
                upgraded[same.id] = msgspec.structs.replace(same, source="user_observation", signal_processed=False)
            continue
        keys = dedup_key(fact.text)
        bucket = buckets.setdefault(fact.entity, [])
        near = next((fid for other, fid in bucket if near_duplicate(keys, other, threshold)), None)
        if near is not None:
            skipped_near.append((fact.hash, near))
            continue
        accepted.append(fact)
        by_hash[fact.hash] = fact
        bucket.append((keys, fact.id))
    return DedupOutcome(accepted, list(upgraded.values()), skipped_exact, skipped_near)


def paraphrase_pairs(
    new_fact: Fact,
    scored: Iterable[tuple[Fact, float]],
    now: datetime,
    settings: LongTermSettings,
) -> list[DedupPair]:
    """Paraphrase candidate pairs of ``new_fact`` given (older fact, cosine) scores.

    Only non-absorbed facts of the same entity, other than the fact itself, with cosine >=
    ``fact_dedup_cosine_threshold``; at most ``fact_dedup_pairs_per_new``, strongest first.
    """
    if new_fact.absorbed:
        return []
    eligible = [
        (other, cos)
        for other, cos in scored
        if other.id != new_fact.id
        and not other.absorbed
        and other.entity == new_fact.entity
        and cos >= settings.fact_dedup_cosine_threshold
    ]
    eligible.sort(key=lambda pair: -pair[1])
    stamp = to_iso(now)
    return [
        DedupPair(
            candidate_id=new_fact.id,
            existing_id=other.id,
            candidate_text=new_fact.text,
            existing_text=other.text,
            entity=new_fact.entity,
            cosine=float(cos),
            queued_at=stamp,
        )
        for other, cos in eligible[: settings.fact_dedup_pairs_per_new]
    ]


def enqueue_pairs(queue: Sequence[DedupPair], pairs: Iterable[DedupPair]) -> list[DedupPair]:
    """``queue`` plus ``pairs`` that are not queued yet in either direction."""
    result = list(queue)
    keys = {frozenset((p.candidate_id, p.existing_id)) for p in result}
    for pair in pairs:
        key = frozenset((pair.candidate_id, pair.existing_id))
        if key in keys or pair.candidate_id == pair.existing_id:
            continue
        keys.add(key)
        result.append(pair)
    return result


def dedup_batch(queue: Sequence[DedupPair], settings: LongTermSettings) -> list[DedupPair]:
    """The pairs of the next judge_duplicates call (oldest first, at most ``fact_dedup_batch_limit``)."""
    return list(queue[: settings.fact_dedup_batch_limit])


class DuplicateResolution(msgspec.Struct, frozen=True):
    """Result of applying judge_duplicates decisions.

    ``facts``: the new active list. ``queue``: the new pending-pair queue. ``removed_ids``:
    facts dropped by merge/replace. ``changed_ids``: facts rewritten. ``decided``: how many
    pairs a decision consumed. ``dropped_pairs``: pairs dead-lettered after too many failures.
    """

    facts: list[Fact]
    queue: list[DedupPair]
    removed_ids: list[str]
    changed_ids: list[str]
    decided: int
    dropped_pairs: list[DedupPair]


def _rewrite_text(fact: Fact, text: object) -> Fact:
    if not isinstance(text, str) or not text.strip() or text.strip() == fact.text:
        return fact
    clean = text.strip()
    return msgspec.structs.replace(
        fact, text=clean, hash=fact_hash(clean), embedding=None, embedding_text_sha256=None, embedding_model_id=None
    )


def _pair_key(a: str, b: str) -> frozenset[str]:
    return frozenset((a, b))


def _absorb_duplicate(winner: Fact, loser: Fact, importance: int, text: object) -> Fact:
    """``winner`` after absorbing ``loser``: the merge chain of both (winner's first, then
    the loser and its chain), ``importance``, and ``text`` when the model gave one."""
    chain = [i for i in [*winner.merged_from_ids, loser.id, *loser.merged_from_ids] if i != winner.id]
    kept = msgspec.structs.replace(winner, importance=importance, merged_from_ids=list(dict.fromkeys(chain)))
    return _rewrite_text(kept, text)


def apply_duplicate_decisions(
    facts: Sequence[Fact],
    queue: Sequence[DedupPair],
    batch: Sequence[DedupPair],
    output: object,
    settings: LongTermSettings,
) -> DuplicateResolution:
    """Apply a judge_duplicates output ``{"decisions": [{new_id, existing_id, action, text}]}``.

    ``merge``: the candidate (new) fact is dropped; the existing one gains
    ``fact_merge_importance_bonus`` importance (max 10), records the candidate (and its merge
    chain) in ``merged_from_ids`` and takes ``text`` when one is given. ``replace``: the
    existing fact is dropped; the candidate keeps the higher importance, inherits the merge
    chain and takes ``text`` when given. ``keep_both``: nothing changes. The first decision of
    a pair wins; a pair whose fact vanished is consumed; a batch pair without a decision
    stays queued. A batch with no usable decision counts as a failure
    (:func:`record_dedup_failure`).
    """
    by_id = {f.id: f for f in facts}
    order = [f.id for f in facts]
    batch_keys = {_pair_key(p.candidate_id, p.existing_id): p for p in batch}
    consumed: set[frozenset[str]] = set()
    removed: list[str] = []
    changed: list[str] = []
    for item in record_get(output, "decisions", None) or []:
        new_id, existing_id, action = record_get(item, "new_id"), record_get(item, "existing_id"), record_get(item, "action")
        if not isinstance(new_id, str) or not isinstance(existing_id, str):
            continue
        key = _pair_key(new_id, existing_id)
        pair = batch_keys.get(key)
        if pair is None or key in consumed or action not in ("merge", "replace", "keep_both"):
            continue
        consumed.add(key)
        # The model may swap the two ids; the queued pair says which fact is the candidate.
        candidate, existing = by_id.get(pair.candidate_id), by_id.get(pair.existing_id)
        if candidate is None or existing is None or action == "keep_both":
            continue
        if action == "merge":
            winner, loser = existing, candidate
            importance = min(IMPORTANCE_MAX, existing.importance + settings.fact_merge_importance_bonus)
        else:
            winner, loser = candidate, existing
            importance = max(candidate.importance, existing.importance)
        by_id[winner.id] = _absorb_duplicate(winner, loser, importance, record_get(item, "text"))
        del by_id[loser.id]
        removed.append(loser.id)
        changed.append(winner.id)
    if not consumed:
        new_queue, dropped = record_dedup_failure(queue, batch, settings)
        return DuplicateResolution(list(facts), new_queue, [], [], 0, dropped)
    gone = set(removed)
    remaining = [
        p
        for p in queue
        if _pair_key(p.candidate_id, p.existing_id) not in consumed and p.candidate_id not in gone and p.existing_id not in gone
    ]
    new_facts = [by_id[i] for i in order if i in by_id]
    return DuplicateResolution(new_facts, remaining, removed, changed, len(consumed), [])


def record_dedup_failure(
    queue: Sequence[DedupPair], batch: Sequence[DedupPair], settings: LongTermSettings
) -> tuple[list[DedupPair], list[DedupPair]]:
    """A failed judge_duplicates call: each batch pair gains one attempt; pairs reaching
    ``fact_dedup_max_attempts`` are dropped. Returns (new queue, dropped pairs)."""
    keys = {_pair_key(p.candidate_id, p.existing_id) for p in batch}
    result: list[DedupPair] = []
    dropped: list[DedupPair] = []
    for pair in queue:
        if _pair_key(pair.candidate_id, pair.existing_id) in keys:
            pair = msgspec.structs.replace(pair, resolve_attempts=pair.resolve_attempts + 1)
            if pair.resolve_attempts >= settings.fact_dedup_max_attempts:
                dropped.append(pair)
                continue
        result.append(pair)
    return result, dropped
