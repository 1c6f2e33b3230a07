"""An incremental index for fact dedup, so that adding a fact costs the same at 100 or
100,000 stored facts.

It answers the same questions as :func:`nekomem.domain.fact_dedup.dedup_new_facts` (exact hash,
then the near-duplicate key of :mod:`nekomem.domain.dedup_key` within the entity) without
scanning the store: a fact B with Jaccard(K, B) >= t must share one of the
``|K| - ceil(t * |K|) + 1`` rarest keywords of K (prefix filtering), and must have between
``t * |K|`` and ``|K| / t`` keywords; its numbers, negations and names must agree with K's.
"""

from __future__ import annotations

import itertools
import math
from collections import defaultdict
from collections.abc import Collection

import msgspec

from nekomem.domain.dedup_key import DedupKey, dedup_key, marks_agree
from nekomem.domain.fact_dedup import DedupOutcome
from nekomem.domain.facts import jaccard
from nekomem.domain.records import Fact


class DedupIndex:
    def __init__(self, threshold: float, max_candidates: int) -> None:
        self.threshold = threshold
        # Bounds the work of one check on a store whose keywords are all common; a near
        # duplicate beyond this many candidates is missed (the exact-hash check still holds).
        self.max_candidates = max_candidates
        self.by_hash: dict[str, Fact] = {}
        self.hash_of: dict[str, str] = {}  # id -> hash it owns in by_hash
        self.keys: dict[str, tuple[str, DedupKey]] = {}  # id -> (entity, key)
        self.postings: dict[tuple[str, str], set[str]] = defaultdict(set)  # (entity, kw) -> ids
        self.mark_postings: dict[tuple[str, str], set[str]] = defaultdict(set)  # (entity, mark) -> ids

    def add(self, fact: Fact, key_of: DedupKey | None = None) -> None:
        """Index ``fact`` (``key_of``: its key, when the caller has made it already)."""
        self.remove(fact.id)
        if fact.hash and fact.hash not in self.by_hash:
            self.by_hash[fact.hash] = fact
            self.hash_of[fact.id] = fact.hash
        if key_of is None:
            key_of = dedup_key(fact.text)
        self.keys[fact.id] = (fact.entity, key_of)
        for key in key_of.words:
            self.postings[(fact.entity, key)].add(fact.id)
        for mark in key_of.marks:
            self.mark_postings[(fact.entity, mark)].add(fact.id)

    def remove(self, fact_id: str) -> None:
        old = self.keys.pop(fact_id, None)
        if old is None:
            return
        entity, key_of = old
        for key in key_of.words:
            ids = self.postings.get((entity, key))
            if ids is not None:
                ids.discard(fact_id)
                if not ids:
                    del self.postings[(entity, key)]
        for mark in key_of.marks:
            marked = self.mark_postings.get((entity, mark))
            if marked is not None:
                marked.discard(fact_id)
                if not marked:
                    del self.mark_postings[(entity, mark)]
        owned = self.hash_of.pop(fact_id, None)
        if owned is not None:
            self.by_hash.pop(owned, None)

    def near_duplicate(self, entity: str, key_of: DedupKey) -> str | None:
        keys = key_of.words
        if not keys:
            return None
        t = self.threshold
        ranked = sorted(keys, key=lambda k: len(self.postings.get((entity, k), ())))
        prefix = len(keys) - math.ceil(t * len(keys)) + 1
        low, high = t * len(keys), len(keys) / t if t > 0 else math.inf
        sources: list[Collection[str]] = [self.postings.get((entity, key), ()) for key in ranked[: max(1, prefix)]]
        # A near duplicate agrees on every mark of K (marks_agree): it has the mark too, or
        # the mark's word ("#2": a fact with the number 2). So the facts holding one mark of
        # K or its word are candidates enough, and a number or a name is usually far rarer
        # than K's rarest keywords.
        for mark in key_of.marks:
            marked = (self.mark_postings.get((entity, mark), ()), self.postings.get((entity, mark[1:]), ()))
            if sum(map(len, marked)) < sum(map(len, sources)):
                sources = list(marked)
        seen: set[str] = set()
        for fid in itertools.chain.from_iterable(sources):
            if fid in seen:
                continue
            if len(seen) >= self.max_candidates:
                return None
            seen.add(fid)
            other = self.keys[fid][1]
            if marks_agree(other, key_of) and low <= len(other.words) <= high and jaccard(set(keys), set(other.words)) >= t:
                return fid
        return None

    def dedup(self, new_facts: list[Fact]) -> DedupOutcome:
        """Same outcome as ``dedup_new_facts(new_facts, stored, settings)``; accepted facts
        are added to the index."""
        accepted: list[Fact] = []
        upgraded: dict[str, Fact] = {}
        skipped_exact: list[tuple[str, str]] = []
        skipped_near: list[tuple[str, str]] = []
        for fact in new_facts:
            same = self.by_hash.get(fact.hash)
            if same is not None:
                skipped_exact.append((fact.hash, same.id))
                if same.source == "ai_disclosure" and fact.source == "user_observation" and same.id not in upgraded:
                    upgraded[same.id] = msgspec.structs.replace(same, source="user_observation", signal_processed=False)
                continue
            key_of = dedup_key(fact.text)
            near = self.near_duplicate(fact.entity, key_of)
            if near is not None:
                skipped_near.append((fact.hash, near))
                continue
            accepted.append(fact)
            self.add(fact, key_of)
        for fact in upgraded.values():
            self.by_hash[fact.hash] = fact
            self.hash_of[fact.id] = fact.hash
        return DedupOutcome(accepted, list(upgraded.values()), skipped_exact, skipped_near)
