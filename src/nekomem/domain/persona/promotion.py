"""Promotion of confirmed reflections into the persona: the gate, the pool, the model's
decision applied, and the time-driven fallback.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Literal

import msgspec

from nekomem.config.longterm import LongTermSettings
from nekomem.domain.evidence import (
    merge_evidence,
    net_score,
)
from nekomem.domain.persona.adding import (
    add_entry,
    enqueue_correction,
)
from nekomem.domain.persona.sections import (
    _clear_caches,
    _push_version,
    _replace_entry,
    copy_persona,
    find_entry,
)
from nekomem.domain.records import (
    Correction,
    Observation,
    Persona,
    PersonaEntry,
    Reflection,
    parse_time,
    record_get,
    to_iso,
)
from nekomem.domain.reflections import (
    block_promotion,
    deny,
    mark_merged,
    mark_promoted,
)

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
        persona,
        corrections,
        ref.entity,
        ref.text,
        source=source,
        source_id=ref.id,
        now=now,
        settings=settings,
        stop_names=stop_names,
        evidence=ref,
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
            "denied",
            deny(ref, now, "llm_merge_rejected", reject_reason=reason if isinstance(reason, str) else None),
            base,
            list(corrections),
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
