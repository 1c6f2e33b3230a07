"""Applying validated refine actions to a cluster: one algorithm for reflections and
persona entries (see :mod:`nekomem.domain.refine`), with what differs between the two
kinds (history, what a merged or discarded member becomes, new ids) in a small
:class:`_Kind` per record type."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar

import msgspec

from nekomem.config.longterm import LongTermSettings
from nekomem.domain.evidence import merge_evidence, net_score
from nekomem.domain.records import (
    TERMINAL_STATUSES,
    Persona,
    PersonaEntry,
    Reflection,
    VersionRecord,
    manual_entry_id,
    to_iso,
)
from nekomem.domain.refine.answer import RefineOp
from nekomem.domain.refine.clusters import cluster_hash

REASON_MODIFY = "refine_modify"
REASON_MERGE = "refine_merge"
REASON_SPLIT = "refine_split"
REASON_DISCARD = "refine_discard"

_REF_ID_CHARS = 16
# Reflections that are "more settled" win a merge; pending is the floor.
_STATUS_RANK = {"pending": 0, "confirmed": 1}

R = TypeVar("R", Reflection, PersonaEntry)


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


# --- the algorithm ----------------------------------------------------------------------


class _Kind(Generic[R]):
    """What each action makes of one kind of record."""

    def __init__(self, now: datetime, settings: LongTermSettings) -> None:
        self.now = now
        self.settings = settings

    def modified(self, entry: R, text: str) -> R:
        raise NotImplementedError

    def discarded(self, entry: R) -> list[R]:
        """What stands in the place of a discarded member ([]: nothing)."""
        raise NotImplementedError

    def merged(self, survivor: R, others: Sequence[R], text: str) -> R:
        raise NotImplementedError

    def absorbed(self, other: R, survivor: R) -> list[R]:
        """What stands in the place of a member merged into ``survivor``."""
        raise NotImplementedError

    def split(self, entry: R, texts: Sequence[str]) -> tuple[list[R], list[R]]:
        """(what stands in the place of ``entry``, the new entries)."""
        raise NotImplementedError


@dataclass
class _Applied(Generic[R]):
    replaced: dict[str, list[R]]  # member id -> what stands in its place
    new: list[R]
    counts: dict[str, int]


def _apply(members: Mapping[str, R], ops: Sequence[RefineOp], kind: _Kind[R]) -> _Applied[R]:
    """Apply ``ops`` in order; an op naming an id that is not a member, or one an earlier op
    already handled, is skipped. Members no op names are absent from ``replaced``."""
    applied: _Applied[R] = _Applied(replaced={}, new=[], counts=_counts())
    handled: set[str] = set()
    for action in ops:
        if any(i not in members or i in handled for i in action.ids):
            continue
        targets = [members[i] for i in action.ids]
        if action.op == "modify":
            if action.texts[0] != targets[0].text:
                applied.replaced[targets[0].id] = [kind.modified(targets[0], action.texts[0])]
        elif action.op == "discard":
            for entry in targets:
                applied.replaced[entry.id] = kind.discarded(entry)
        elif action.op == "merge":
            survivor = _pick_survivor(targets, kind.now, kind.settings)
            others = [e for e in targets if e.id != survivor.id]
            applied.replaced[survivor.id] = [kind.merged(survivor, others, action.texts[0])]
            for other in others:
                applied.replaced[other.id] = kind.absorbed(other, survivor)
        elif action.op == "split":
            in_place, parts = kind.split(targets[0], action.texts)
            applied.replaced[targets[0].id] = in_place
            applied.new.extend(parts)
        handled.update(action.ids)
        applied.counts[action.op] += 1
    return applied


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


class _Reflections(_Kind[Reflection]):
    """Reflections keep a modification history; a merged or split member stays as
    ``merged`` (``absorbed_into``), a discarded one becomes ``denied``."""

    def __init__(self, now: datetime, settings: LongTermSettings, taken: set[str]) -> None:
        super().__init__(now, settings)
        self.taken = taken

    def _history(self, entry: Reflection, reason: str, **extra: Any) -> list[dict[str, Any]]:
        record = {"old_text": entry.text, "modified_at": to_iso(self.now), "reason": reason, "absorbed_fact_ids": []}
        record.update(extra)
        return [*entry.modification_history, record]

    @staticmethod
    def _reworded(entry: Reflection, text: str, history: list[dict[str, Any]], **changes: Any) -> Reflection:
        if text != entry.text:
            changes.update(embedding=None, embedding_text_sha256=None, embedding_model_id=None)
        return msgspec.structs.replace(entry, text=text, modification_history=history, **changes)

    def _retired(self, entry: Reflection, into: str, history: list[dict[str, Any]]) -> Reflection:
        return msgspec.structs.replace(entry, status="merged", merged_at=to_iso(self.now), absorbed_into=into, modification_history=history)

    def modified(self, entry: Reflection, text: str) -> Reflection:
        return self._reworded(entry, text, self._history(entry, REASON_MODIFY))

    def discarded(self, entry: Reflection) -> list[Reflection]:
        return [msgspec.structs.replace(entry, status="denied", denied_at=to_iso(self.now), denied_reason=REASON_DISCARD)]

    def merged(self, survivor: Reflection, others: Sequence[Reflection], text: str) -> Reflection:
        targets = [survivor, *others]
        sources = sorted({fid for r in targets for fid in r.source_fact_ids})
        best = max(targets, key=lambda r: _STATUS_RANK.get(r.status, 0))
        status_fields: dict[str, Any] = {}
        if _STATUS_RANK.get(best.status, 0) > _STATUS_RANK.get(survivor.status, 0):
            status_fields = {"status": best.status, "confirmed_at": best.confirmed_at, "auto_confirmed": best.auto_confirmed}
        history = self._history(
            survivor,
            REASON_MERGE,
            absorbed_fact_ids=[f for f in sources if f not in set(survivor.source_fact_ids)],
            merged_from_ids=[r.id for r in others],
        )
        merged = _absorb_all(survivor, others, self.now, self.settings)
        return self._reworded(merged, text, history, source_fact_ids=sources, **status_fields)

    def absorbed(self, other: Reflection, survivor: Reflection) -> list[Reflection]:
        return [self._retired(other, survivor.id, self._history(other, REASON_MERGE, merged_into=survivor.id))]

    def split(self, entry: Reflection, texts: Sequence[str]) -> tuple[list[Reflection], list[Reflection]]:
        parts = [self._part(entry, text) for text in texts]
        retired = self._retired(entry, parts[0].id, self._history(entry, REASON_SPLIT, split_into=[p.id for p in parts]))
        return [retired], parts

    def _part(self, ref: Reflection, text: str) -> Reflection:
        rid = new_reflection_id(text, self.now, self.taken)
        self.taken.add(rid)
        history = [
            {"old_text": ref.text, "modified_at": to_iso(self.now), "reason": REASON_SPLIT, "absorbed_fact_ids": [], "split_from": ref.id}
        ]
        return Reflection(
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
            modification_history=history,
            **_evidence_copy(ref),
        )


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
    current = {m.id: m for m in members if m.status not in TERMINAL_STATUSES}
    kind = _Reflections(now, settings, set(taken_ids) | {m.id for m in members})
    applied = _apply(current, ops, kind)
    records = [_stamp(applied.replaced.get(m.id, [m])[0], chash, now) for m in members]
    records.extend(_stamp(r, chash, now) for r in applied.new)
    return ReflectionRefine(records=records, outcome=RefineOutcome(counts=applied.counts, created=[r.id for r in applied.new]))


# --- persona ----------------------------------------------------------------------------


def _unique(items: Iterable[str | None], exclude: Iterable[str] = ()) -> list[str]:
    skip = set(exclude)
    result: list[str] = []
    for item in items:
        if item and item not in skip and item not in result:
            result.append(item)
    return result


class _PersonaEntries(_Kind[PersonaEntry]):
    """Persona entries keep a bounded version history; merged, split and discarded
    members leave the section (split parts take the original's place)."""

    def __init__(self, now: datetime, settings: LongTermSettings, taken: set[str]) -> None:
        super().__init__(now, settings)
        self.taken = taken

    def _version(self, entry: PersonaEntry, reason: str) -> list[VersionRecord]:
        history = [*entry.version_history, VersionRecord(text=entry.text, replaced_at=to_iso(self.now), reason=reason)]
        keep = self.settings.persona_version_history_max
        return history[-keep:] if keep else []

    @staticmethod
    def _rewritten(entry: PersonaEntry, text: str, versions: list[VersionRecord], **changes: Any) -> PersonaEntry:
        if text != entry.text:
            changes.update(
                token_count=None,
                token_count_text_sha256=None,
                token_count_tokenizer=None,
                embedding=None,
                embedding_text_sha256=None,
                embedding_model_id=None,
            )
        return msgspec.structs.replace(entry, text=text, version_history=versions, **changes)

    def modified(self, entry: PersonaEntry, text: str) -> PersonaEntry:
        return self._rewritten(entry, text, self._version(entry, REASON_MODIFY))

    def discarded(self, entry: PersonaEntry) -> list[PersonaEntry]:
        return []

    def merged(self, survivor: PersonaEntry, others: Sequence[PersonaEntry], text: str) -> PersonaEntry:
        absorbed = _unique(
            [*survivor.merged_from_ids, *(x for o in others for x in (*o.merged_from_ids, o.source_id, o.id))],
            exclude=[survivor.id],
        )
        merged = _absorb_all(survivor, others, self.now, self.settings)
        return self._rewritten(merged, text, self._version(survivor, REASON_MERGE), merged_from_ids=absorbed)

    def absorbed(self, other: PersonaEntry, survivor: PersonaEntry) -> list[PersonaEntry]:
        return []

    def split(self, entry: PersonaEntry, texts: Sequence[str]) -> tuple[list[PersonaEntry], list[PersonaEntry]]:
        parts: list[PersonaEntry] = []
        for index, text in enumerate(texts):
            pid = manual_entry_id(text, self.now, salt=f"refine|{entry.id}|{index}|")
            while pid in self.taken:
                pid = manual_entry_id(text, self.now, salt=f"refine|{entry.id}|{index}|{len(self.taken)}|")
            self.taken.add(pid)
            parts.append(
                PersonaEntry(
                    id=pid,
                    text=text,
                    source=entry.source,
                    source_id=entry.source_id,
                    created_at=entry.created_at,
                    merged_from_ids=_unique([*entry.merged_from_ids, entry.id]),
                    version_history=self._version(entry, REASON_SPLIT),
                    **_evidence_copy(entry),
                )
            )
        return parts, parts


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
    kind = _PersonaEntries(now, settings, {e.id for entries in persona.values() for e in entries})
    applied = _apply(members, ops, kind)
    new_section: list[PersonaEntry] = []
    for entry in section:
        if entry.id not in members:
            new_section.append(entry)
            continue
        new_section.extend(_stamp(item, chash, now) for item in applied.replaced.get(entry.id, [entry]))
    result = {k: list(v) for k, v in persona.items()}
    result[entity] = new_section
    return PersonaRefine(persona=result, outcome=RefineOutcome(counts=applied.counts, created=[p.id for p in applied.new]))


def persona_failure(persona: Mapping[str, Sequence[PersonaEntry]], entity: str, cluster_ids: Sequence[str], now: datetime) -> Persona:
    """A new persona whose cluster members (of section ``entity``, non-protected) carry one
    more failed refine attempt (:func:`record_failure`)."""
    wanted = set(cluster_ids)
    result = {k: list(v) for k, v in persona.items()}
    result[entity] = [record_failure([e], now)[0] if e.id in wanted and not e.protected else e for e in persona.get(entity, [])]
    return result
