"""Persona: protected card entries, promotion from reflections, the contradiction queue,
evidence decay/archive of non-protected entries and mention tracking.

The persona is ``entity -> list[PersonaEntry]`` (:data:`~nekomem.domain.records.Persona`).
Every function returns new objects; the PersonaActor owns persona.json,
persona_corrections.json and the archive shards, and makes the LLM calls.
Protected entries (from the character card) are never decayed, signal-targeted, archived
or rewritten by a contradiction.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, Literal

import msgspec

from nekomem.config.longterm import LongTermSettings
from nekomem.domain.evidence import (
    ResolvedSignal,
    Signal,
    SignalSource,
    apply_signal,
    archive_due,
    effective_disputation,
    effective_reinforcement,
    merge_evidence,
    net_score,
    track_below_zero,
)
from nekomem.domain.records import (
    BUILTIN_ENTITIES,
    Correction,
    EvidenceFields,
    Observation,
    Persona,
    PersonaEntry,
    Reflection,
    VersionRecord,
    card_entry_id,
    correction_entry_id,
    manual_entry_id,
    parse_time,
    promoted_entry_id,
    record_get,
    to_iso,
)
from nekomem.domain.reflections import (
    block_promotion,
    deny,
    is_mentioned,
    mark_merged,
    mark_promoted,
    mention_keywords,
    record_mention,
    refresh_suppression,
)

CARD_SOURCE = "character_card"
_AI_CONTEXT_PREFIX = "__ai_context."


def copy_persona(persona: Mapping[str, Sequence[PersonaEntry]]) -> Persona:
    """A shallow copy (new dict, new lists) safe to modify."""
    return {entity: list(entries) for entity, entries in persona.items()}


def ensure_sections(persona: Mapping[str, Sequence[PersonaEntry]], entities: Iterable[str] = BUILTIN_ENTITIES) -> Persona:
    """``persona`` with an (empty) section for each of ``entities`` that is missing."""
    result = copy_persona(persona)
    for entity in entities:
        result.setdefault(entity, [])
    return result


def find_entry(persona: Mapping[str, Sequence[PersonaEntry]], entry_id: str) -> tuple[str, PersonaEntry] | None:
    """(entity, entry) of the entry with ``entry_id``, if any."""
    for entity, entries in persona.items():
        for entry in entries:
            if entry.id == entry_id:
                return entity, entry
    return None


def _replace_entry(persona: Persona, entity: str, updated: PersonaEntry) -> None:
    persona[entity] = [updated if e.id == updated.id else e for e in persona[entity]]


def _clear_caches(entry: PersonaEntry, **changes: Any) -> PersonaEntry:
    return msgspec.structs.replace(
        entry,
        token_count=None,
        token_count_text_sha256=None,
        token_count_tokenizer=None,
        embedding=None,
        embedding_text_sha256=None,
        embedding_model_id=None,
        **changes,
    )


def _push_version(entry: PersonaEntry, now: datetime, reason: str, settings: LongTermSettings, **extra: Any) -> list[VersionRecord]:
    history = [*entry.version_history, VersionRecord(text=entry.text, replaced_at=to_iso(now), reason=reason, **extra)]
    keep = settings.persona_version_history_max
    return history[-keep:] if keep else []


# --- character card ----------------------------------------------------------------------


def card_entries(entity: str, card: Mapping[str, Any], settings: LongTermSettings, now: datetime | None = None) -> list[PersonaEntry]:
    """Protected entries of one card part, in card-field order.

    Each scalar or list field becomes ``"<field>: <value>"`` (lists joined with
    ``persona_card_list_separator``); ``__ai_context.*`` fields keep the bare value;
    reserved fields, dict values and empty values are skipped.
    """
    reserved = set(settings.persona_card_reserved_fields)
    result: list[PersonaEntry] = []
    for field, value in card.items():
        if not isinstance(field, str) or field in reserved or isinstance(value, Mapping) or value is None:
            continue
        if isinstance(value, (list, tuple)):
            parts = [str(v).strip() for v in value if not isinstance(v, (Mapping, list, tuple)) and str(v).strip()]
            rendered = settings.persona_card_list_separator.join(parts)
        elif isinstance(value, bool):
            rendered = "true" if value else "false"
        else:
            rendered = str(value).strip()
        if not rendered:
            continue
        text = rendered if field.startswith(_AI_CONTEXT_PREFIX) else f"{field}: {rendered}"
        result.append(
            PersonaEntry(
                id=card_entry_id(entity, field),
                text=text,
                source=CARD_SOURCE,
                source_id=field,
                protected=True,
                created_at=to_iso(now) if now else None,
            )
        )
    return result


def sync_card(
    persona: Mapping[str, Sequence[PersonaEntry]],
    cards: Mapping[str, Mapping[str, Any]],
    settings: LongTermSettings,
    now: datetime | None = None,
) -> Persona:
    """Sync the protected entries of each entity in ``cards`` (e.g. ``{"neko": {...},
    "master": {...}}``) with its card: card entries sit at the head in card order, changed
    texts are rewritten in place (token and embedding caches cleared), fields gone from the
    card are dropped. Other entries and entities are unchanged."""
    result = copy_persona(persona)
    for entity, card in cards.items():
        current = result.get(entity, [])
        old_cards = {e.id: e for e in current if e.source == CARD_SOURCE or e.protected}
        head: list[PersonaEntry] = []
        for fresh in card_entries(entity, card, settings, now):
            old = old_cards.get(fresh.id)
            if old is None:
                head.append(fresh)
            elif old.text != fresh.text or not old.protected:
                head.append(_clear_caches(old, text=fresh.text, protected=True, source=CARD_SOURCE, source_id=fresh.source_id))
            else:
                head.append(old)
        rest = [e for e in current if not (e.source == CARD_SOURCE or e.protected)]
        # A protected entry that did not come from this card (e.g. an imported one) is kept.
        kept_other = [e for e in current if e.protected and e.source != CARD_SOURCE]
        result[entity] = [*head, *kept_other, *rest]
    return result


# --- contradiction check and adding entries -------------------------------------------------


def overlap_ratio(a: str, b: str, stop_names: Iterable[str] = ()) -> float:
    """Shared keywords / the smaller keyword set (0 when either has none)."""
    names = list(stop_names)
    ka, kb = mention_keywords(a, names), mention_keywords(b, names)
    if not ka or not kb:
        return 0.0
    return len(ka & kb) / min(len(ka), len(kb))


def conflicting_entries(
    entries: Iterable[PersonaEntry], text: str, settings: LongTermSettings, stop_names: Iterable[str] = ()
) -> list[PersonaEntry]:
    """Entries that 'may contradict' ``text``: keyword overlap ratio >= ``persona_contradiction_overlap_ratio``
    (strongest first; an entry with exactly the same text is a duplicate, not a conflict)."""
    names = list(stop_names)
    scored = []
    for entry in entries:
        if entry.text.strip() == text.strip():
            continue
        ratio = overlap_ratio(text, entry.text, names)
        if ratio >= settings.persona_contradiction_overlap_ratio:
            scored.append((ratio, entry))
    scored.sort(key=lambda pair: -pair[0])
    return [entry for _, entry in scored]


def enqueue_correction(queue: Sequence[Correction], item: Correction) -> tuple[list[Correction], bool]:
    """``queue`` plus ``item`` unless an item with the same old_text, new_text and entity is queued."""
    for existing in queue:
        if (existing.old_text, existing.new_text, existing.entity) == (item.old_text, item.new_text, item.entity):
            return list(queue), False
    return [*queue, item], True


AddKind = Literal["added", "duplicate", "card_conflict", "queued"]


class AddOutcome(msgspec.Struct, frozen=True):
    """Result of :func:`add_entry`: the new persona and queue, the entry added (``added``),
    or the entry in conflict (``card_conflict`` / ``queued``) or already present (``duplicate``)."""

    kind: AddKind
    persona: Persona
    corrections: list[Correction]
    entry_id: str | None


def _inherit_evidence(evidence: EvidenceFields | None, now: datetime, settings: LongTermSettings) -> dict[str, Any]:
    if evidence is None:
        return {}
    stamp = to_iso(now)
    return {
        "reinforcement": effective_reinforcement(evidence, now, settings),
        "disputation": effective_disputation(evidence, now, settings),
        "rein_last_signal_at": stamp,
        "disp_last_signal_at": stamp,
        "user_fact_reinforce_count": evidence.user_fact_reinforce_count,
    }


def add_entry(
    persona: Mapping[str, Sequence[PersonaEntry]],
    corrections: Sequence[Correction],
    entity: str,
    text: str,
    *,
    source: str,
    source_id: str | None,
    now: datetime,
    settings: LongTermSettings,
    stop_names: Iterable[str] = (),
    evidence: EvidenceFields | None = None,
) -> AddOutcome:
    """Add ``text`` to ``entity``'s section after the contradiction check.

    The same text (or the same ``prom_<source_id>`` id) already present -> ``duplicate``.
    A conflict with a protected entry -> ``card_conflict`` (nothing written). A conflict with
    a non-protected entry -> ``queued``: a Correction (old = that entry, new = ``text``) joins
    the queue. Otherwise a new entry is appended (``prom_<source_id>`` for reflections,
    ``manual_...`` otherwise), carrying ``evidence`` decayed to now when given.
    """
    text = text.strip()
    result = copy_persona(persona)
    section = result.setdefault(entity, [])
    promoted = source.startswith("reflection") and source_id
    new_id = promoted_entry_id(source_id) if promoted else manual_entry_id(text, now)  # type: ignore[arg-type]
    for entry in section:
        if entry.text.strip() == text or entry.id == new_id:
            return AddOutcome("duplicate", result, list(corrections), entry.id)
    conflicts = conflicting_entries(section, text, settings, stop_names)
    protected = [e for e in conflicts if e.protected]
    if protected:
        return AddOutcome("card_conflict", result, list(corrections), protected[0].id)
    if conflicts:
        old = conflicts[0]
        item = Correction(
            old_text=old.text, new_text=text, entity=entity, created_at=to_iso(now), old_entry_id=old.id, source_id=source_id
        )
        queue, _ = enqueue_correction(corrections, item)
        return AddOutcome("queued", result, queue, old.id)
    entry = PersonaEntry(
        id=new_id, text=text, source=source, source_id=source_id, created_at=to_iso(now), **_inherit_evidence(evidence, now, settings)
    )
    section.append(entry)
    return AddOutcome("added", result, list(corrections), entry.id)


def new_manual_entry(entity: str, text: str, now: datetime) -> PersonaEntry:
    """A hand-written (memory browser) entry; add it with :func:`add_entry` to run the checks."""
    clean = text.strip()
    return PersonaEntry(id=manual_entry_id(clean, now), text=clean, source="manual", created_at=to_iso(now))


# --- promotion -------------------------------------------------------------------------------

Gate = Literal["attempt", "wait", "block"]


def promotion_gate(ref: Reflection, now: datetime, settings: LongTermSettings) -> Gate:
    """``wait`` when the last attempt is younger than ``evidence_promote_retry_backoff_minutes``;
    ``block`` (-> :func:`block_promotion`) once ``evidence_promote_max_retries`` attempts were
    made; else ``attempt`` (record it with :func:`record_promotion_attempt` first)."""
    last = parse_time(ref.last_promote_attempt_at, now)
    if last is not None and now - last < timedelta(minutes=settings.evidence_promote_retry_backoff_minutes):
        return "wait"
    if ref.promote_attempt_count >= settings.evidence_promote_max_retries:
        return "block"
    return "attempt"


def record_promotion_attempt(ref: Reflection, now: datetime) -> Reflection:
    """One more promotion attempt at ``now`` (counted before the LLM call)."""
    return msgspec.structs.replace(ref, promote_attempt_count=ref.promote_attempt_count + 1, last_promote_attempt_at=to_iso(now))


def blocked(ref: Reflection, now: datetime) -> Reflection:
    """confirmed -> promote_blocked after the last allowed attempt (reason ``llm_unavailable``)."""
    return block_promotion(ref, now, "llm_unavailable")


def promotion_pool(
    candidate: Reflection,
    persona: Mapping[str, Sequence[PersonaEntry]],
    reflections: Iterable[Reflection],
    now: datetime,
    settings: LongTermSettings,
    count_tokens: Callable[[str], int],
) -> list[Observation]:
    """Existing knowledge shown to judge_promotion: non-protected persona entries of the
    candidate's entity, then the entity's other confirmed/promoted reflections, each by score;
    cut when the texts exceed ``persona_merge_pool_max_tokens``."""
    entries = [
        Observation(id=e.id, kind="persona", entity=candidate.entity, text=e.text, score=net_score(e, now, settings))
        for e in persona.get(candidate.entity, [])
        if not e.protected and e.text.strip()
    ]
    refs = [
        Observation(id=r.id, kind="reflection", entity=r.entity, text=r.text, score=net_score(r, now, settings))
        for r in reflections
        if r.id != candidate.id and r.entity == candidate.entity and r.status in ("confirmed", "promoted")
    ]
    pool: list[Observation] = []
    used = 0
    for obs in sorted(entries, key=lambda o: -o.score) + sorted(refs, key=lambda o: -o.score):
        cost = count_tokens(obs.text)
        if used + cost > settings.persona_merge_pool_max_tokens:
            break
        used += cost
        pool.append(obs)
    return pool


PromotionKind = Literal["promoted", "merged", "denied", "queued", "duplicate", "invalid", "stale"]


class PromotionOutcome(msgspec.Struct, frozen=True):
    """Result of a promotion decision.

    ``kind``: promoted (new entry), merged (into ``entry_id``), denied, queued (contradiction
    queue, the reflection stays confirmed), duplicate (already present; the reflection is
    marked promoted), invalid (bad target or text: counts as a skipped retry), stale (the
    reflection is no longer confirmed/promotable: nothing changes).
    """

    kind: PromotionKind
    reflection: Reflection
    persona: Persona
    corrections: list[Correction]
    entry_id: str | None = None


def _promote_via_add(
    ref: Reflection,
    persona: Mapping[str, Sequence[PersonaEntry]],
    corrections: Sequence[Correction],
    now: datetime,
    settings: LongTermSettings,
    stop_names: Iterable[str],
    source: str,
    card_reason: str,
) -> PromotionOutcome:
    outcome = add_entry(
        persona, corrections, ref.entity, ref.text, source=source, source_id=ref.id, now=now,
        settings=settings, stop_names=stop_names, evidence=ref,
    )
    if outcome.kind == "added":
        return PromotionOutcome("promoted", mark_promoted(ref, now), outcome.persona, outcome.corrections, outcome.entry_id)
    if outcome.kind == "duplicate":
        return PromotionOutcome("duplicate", mark_promoted(ref, now), outcome.persona, outcome.corrections, outcome.entry_id)
    if outcome.kind == "card_conflict":
        return PromotionOutcome("denied", deny(ref, now, card_reason), outcome.persona, outcome.corrections, outcome.entry_id)
    return PromotionOutcome("queued", ref, outcome.persona, outcome.corrections, outcome.entry_id)


def merge_into_entry(
    persona: Mapping[str, Sequence[PersonaEntry]],
    target_id: str,
    ref: Reflection,
    merged_text: str,
    now: datetime,
    settings: LongTermSettings,
) -> Persona | None:
    """Rewrite non-protected entry ``target_id`` with ``merged_text`` and absorb ``ref``: each
    evidence side = max of the two (decayed to now), clocks restart, ``sub_zero_days`` = 0,
    ``ref.id`` joins ``merged_from_ids`` (if it is already there nothing changes). None when
    the target is missing or protected."""
    found = find_entry(persona, target_id)
    if found is None or found[1].protected:
        return None
    entity, target = found
    result = copy_persona(persona)
    if ref.id in target.merged_from_ids:
        return result
    updated = merge_evidence(target, ref, now, settings)
    text = merged_text.strip()
    if text and text != target.text:
        updated = _clear_caches(updated, text=text, version_history=_push_version(target, now, "promote_merge", settings))
    updated = msgspec.structs.replace(updated, merged_from_ids=[*target.merged_from_ids, ref.id])
    _replace_entry(result, entity, updated)
    return result


def apply_promotion_decision(
    ref: Reflection,
    output: object,
    persona: Mapping[str, Sequence[PersonaEntry]],
    corrections: Sequence[Correction],
    now: datetime,
    settings: LongTermSettings,
    stop_names: Iterable[str] = (),
) -> PromotionOutcome:
    """Apply a judge_promotion output ``{action, target_id, text, reason}`` to ``ref``.

    First re-checks that ``ref`` is still confirmed with score >= the promote threshold
    (else ``stale``). ``promote``: :func:`add_entry` (source ``reflection``) -> promoted,
    duplicate, denied (card conflict, ``rejected_by_persona_card``) or queued. ``merge``:
    :func:`merge_into_entry` on a non-protected persona entry with a non-empty ``text`` ->
    merged. ``reject``: denied (``llm_merge_rejected``, ``reject_reason``). ``contradiction``:
    a protected target denies the reflection, a non-protected one queues a correction.
    A missing/protected merge target, an empty merge text or an unknown action -> invalid.
    """
    base = copy_persona(persona)
    if ref.status != "confirmed" or net_score(ref, now, settings) < settings.evidence_promote_threshold:
        return PromotionOutcome("stale", ref, base, list(corrections))
    action = record_get(output, "action")
    target_id = record_get(output, "target_id")
    text = record_get(output, "text")
    reason = record_get(output, "reason")
    if action == "promote":
        return _promote_via_add(ref, base, corrections, now, settings, stop_names, "reflection", "rejected_by_persona_card")
    if action == "reject":
        return PromotionOutcome(
            "denied", deny(ref, now, "llm_merge_rejected", reject_reason=reason if isinstance(reason, str) else None),
            base, list(corrections),
        )
    found = find_entry(base, target_id) if isinstance(target_id, str) else None
    if action == "merge":
        if found is None or not isinstance(text, str) or not text.strip():
            return PromotionOutcome("invalid", ref, base, list(corrections))
        merged = merge_into_entry(base, found[1].id, ref, text, now, settings)
        if merged is None:
            return PromotionOutcome("invalid", ref, base, list(corrections))
        return PromotionOutcome("merged", mark_merged(ref, found[1].id, now), merged, list(corrections), found[1].id)
    if action == "contradiction":
        if found is None:
            return PromotionOutcome("invalid", ref, base, list(corrections))
        entity, target = found
        if target.protected:
            return PromotionOutcome("denied", deny(ref, now, "rejected_by_persona_card"), base, list(corrections), target.id)
        item = Correction(
            old_text=target.text, new_text=ref.text, entity=entity, created_at=to_iso(now), old_entry_id=target.id, source_id=ref.id
        )
        queue, _ = enqueue_correction(corrections, item)
        return PromotionOutcome("queued", ref, base, queue, target.id)
    return PromotionOutcome("invalid", ref, base, list(corrections))


def time_driven_promotion(
    ref: Reflection,
    persona: Mapping[str, Sequence[PersonaEntry]],
    corrections: Sequence[Correction],
    now: datetime,
    settings: LongTermSettings,
    stop_names: Iterable[str] = (),
) -> PromotionOutcome:
    """Powerful memory off: promote a due confirmed reflection without an LLM
    (source ``reflection_time_driven``): added -> promoted; card conflict -> denied
    (``rejected_by_persona_card_time_driven``); conflict -> queued (stays confirmed)."""
    if ref.status != "confirmed":
        return PromotionOutcome("stale", ref, copy_persona(persona), list(corrections))
    return _promote_via_add(
        ref, persona, corrections, now, settings, stop_names, "reflection_time_driven", "rejected_by_persona_card_time_driven"
    )


# --- the contradiction queue -----------------------------------------------------------------


def correction_batch(queue: Sequence[Correction], settings: LongTermSettings) -> list[Correction]:
    """The items of the next resolution pass (oldest first, ``persona_correction_batch_limit``)."""
    return list(queue[: settings.persona_correction_batch_limit])


def _without(queue: Sequence[Correction], item: Correction) -> list[Correction]:
    return [q for q in queue if not (q.created_at == item.created_at and q.old_text == item.old_text and q.new_text == item.new_text)]


CorrectionKind = Literal["kept_old", "replaced", "merged", "invalid"]


class CorrectionOutcome(msgspec.Struct, frozen=True):
    """Result of a resolve_correction decision. ``entry_id``: the entry now holding the
    knowledge. ``source_id``: the reflection that proposed the new text (the caller marks it
    promoted after replaced/merged, denied after kept_old). ``invalid`` leaves everything
    as it was (count it with :func:`record_correction_failure`)."""

    kind: CorrectionKind
    persona: Persona
    corrections: list[Correction]
    entry_id: str | None
    source_id: str | None


def apply_correction(
    persona: Mapping[str, Sequence[PersonaEntry]],
    queue: Sequence[Correction],
    item: Correction,
    output: object,
    now: datetime,
    settings: LongTermSettings,
) -> CorrectionOutcome:
    """Apply a resolve_correction output ``{action: keep_old|replace|merge, text}``.

    ``keep_old``: nothing changes. ``replace``: the old entry is replaced in place by a new
    ``corr_...`` entry holding ``text`` (else the queued new text), with the old text in its
    version history. ``merge``: the old entry keeps its id, evidence and mentions, takes
    ``text`` (required) and records the old text in ``version_history`` (at most
    ``persona_version_history_max``). A protected old entry always survives (as keep_old).
    When the old entry has gone, replace/merge add the text as a new entry. The item leaves
    the queue unless the outcome is ``invalid``.
    """
    result = copy_persona(persona)
    action = record_get(output, "action")
    text = record_get(output, "text")
    text = text.strip() if isinstance(text, str) and text.strip() else None
    if action not in ("keep_old", "replace", "merge") or (action == "merge" and text is None):
        return CorrectionOutcome("invalid", result, list(queue), None, item.source_id)
    remaining = _without(queue, item)
    section = result.setdefault(item.entity, [])
    old = None
    if item.old_entry_id:
        old = next((e for e in section if e.id == item.old_entry_id), None)
    if old is None:
        old = next((e for e in section if e.text == item.old_text), None)
    if action == "keep_old" or (old is not None and old.protected):
        return CorrectionOutcome("kept_old", result, remaining, old.id if old else None, item.source_id)
    new_text = text if text is not None else item.new_text.strip()
    if old is None:
        entry = PersonaEntry(
            id=correction_entry_id(new_text, now), text=new_text, source="correction", source_id=item.source_id, created_at=to_iso(now)
        )
        section.append(entry)
        return CorrectionOutcome("replaced" if action == "replace" else "merged", result, remaining, entry.id, item.source_id)
    history = _push_version(old, now, "correction_" + action, settings)
    if action == "merge":
        updated = _clear_caches(old, text=new_text, version_history=history)
        _replace_entry(result, item.entity, updated)
        return CorrectionOutcome("merged", result, remaining, old.id, item.source_id)
    entry = PersonaEntry(
        id=correction_entry_id(new_text, now),
        text=new_text,
        source="correction",
        source_id=item.source_id,
        created_at=to_iso(now),
        version_history=history,
    )
    result[item.entity] = [entry if e.id == old.id else e for e in section]
    return CorrectionOutcome("replaced", result, remaining, entry.id, item.source_id)


def reflection_after_correction(ref: Reflection, kind: CorrectionKind, now: datetime) -> Reflection:
    """Close the loop on the reflection that proposed a resolved correction: ``replaced`` or
    ``merged`` -> promoted (its knowledge is now in the persona), ``kept_old`` -> denied
    (``correction_kept_old``). Any other case, or a reflection no longer confirmed, is
    returned unchanged."""
    if ref.status != "confirmed":
        return ref
    if kind in ("replaced", "merged"):
        return mark_promoted(ref, now)
    if kind == "kept_old":
        return deny(ref, now, "correction_kept_old")
    return ref


def record_correction_failure(
    queue: Sequence[Correction], item: Correction, settings: LongTermSettings
) -> tuple[list[Correction], bool]:
    """One more failed resolution of ``item``; it is dropped at ``persona_correction_max_attempts``.
    Returns (new queue, dropped)."""
    result: list[Correction] = []
    dropped = False
    for q in queue:
        if q.created_at == item.created_at and q.old_text == item.old_text and q.new_text == item.new_text:
            q = msgspec.structs.replace(q, resolve_attempts=q.resolve_attempts + 1)
            if q.resolve_attempts >= settings.persona_correction_max_attempts:
                dropped = True
                continue
        result.append(q)
    return result, dropped


# --- evidence, archive and mentions of persona entries ---------------------------------------


def apply_entry_signal(
    persona: Mapping[str, Sequence[PersonaEntry]],
    entry_id: str,
    signal: Signal,
    source: SignalSource,
    now: datetime,
    settings: LongTermSettings,
) -> tuple[Persona, bool]:
    """Apply one evidence signal to a non-protected entry. Returns (persona, changed);
    protected and unknown entries are left alone."""
    result = copy_persona(persona)
    found = find_entry(result, entry_id)
    if found is None or found[1].protected:
        return result, False
    entity, entry = found
    _replace_entry(result, entity, apply_signal(entry, signal, source, now, settings))
    return result, True


def apply_resolved_signals(
    persona: Mapping[str, Sequence[PersonaEntry]],
    signals: Iterable[ResolvedSignal],
    now: datetime,
    settings: LongTermSettings,
    source: SignalSource = "user_fact",
) -> tuple[Persona, list[str]]:
    """Apply the persona-targeted signals of a map_evidence (``user_fact``) or
    check_disputation (``user_keyword_rebut``) result. Returns (persona, ids changed)."""
    result = copy_persona(persona)
    changed: list[str] = []
    for sig in signals:
        if sig.target_kind != "persona":
            continue
        result, ok = apply_entry_signal(result, sig.target_id, sig.signal, source, now, settings)
        if ok:
            changed.append(sig.target_id)
    return result, changed


class PersonaSweep(msgspec.Struct, frozen=True):
    """Result of the persona archive sweep: the new persona, the archived (entity, entry)
    pairs (``archived_at`` set; the caller stamps the shard) and the ids counted today."""

    persona: Persona
    archived: list[tuple[str, PersonaEntry]]
    counted: list[str]


def persona_archive_sweep(persona: Mapping[str, Sequence[PersonaEntry]], now: datetime, settings: LongTermSettings) -> PersonaSweep:
    """Below-zero day counting for every non-protected entry (once per calendar day) and
    removal of those below zero on ``evidence_archive_days`` distinct days. Protected
    entries are never counted or archived."""
    result: Persona = {}
    archived: list[tuple[str, PersonaEntry]] = []
    counted: list[str] = []
    for entity, entries in persona.items():
        kept: list[PersonaEntry] = []
        for entry in entries:
            if not entry.protected:
                updated = track_below_zero(entry, now, settings)
                if updated is not entry:
                    counted.append(entry.id)
                if archive_due(updated, settings):
                    archived.append((entity, msgspec.structs.replace(updated, archived_at=to_iso(now))))
                    continue
                entry = updated
            kept.append(entry)
        result[entity] = kept
    return PersonaSweep(result, archived, counted)


def record_reply_mentions(
    persona: Mapping[str, Sequence[PersonaEntry]],
    reply: str,
    now: datetime,
    settings: LongTermSettings,
    stop_names: Iterable[str] = (),
) -> tuple[Persona, list[str]]:
    """Record a mention on every non-protected entry the AI ``reply`` mentions (any keyword
    as a substring, stop names removed). Returns (persona, ids mentioned)."""
    names = list(stop_names)
    result: Persona = {}
    changed: list[str] = []
    for entity, entries in persona.items():
        new_entries = []
        for entry in entries:
            if not entry.protected and reply and is_mentioned(reply, entry.text, names):
                entry = record_mention(entry, now, settings)
                changed.append(entry.id)
            new_entries.append(entry)
        result[entity] = new_entries
    return result, changed


def refresh_suppressions(persona: Mapping[str, Sequence[PersonaEntry]], now: datetime, settings: LongTermSettings) -> tuple[Persona, list[str]]:
    """Lift expired suppressions (run before each render). Returns (persona, ids changed)."""
    result: Persona = {}
    changed: list[str] = []
    for entity, entries in persona.items():
        new_entries = []
        for entry in entries:
            updated = refresh_suppression(entry, now, settings)
            if updated is not entry:
                changed.append(entry.id)
            new_entries.append(updated)
        result[entity] = new_entries
    return result, changed

