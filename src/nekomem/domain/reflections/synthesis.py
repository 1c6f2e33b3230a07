"""Synthesis: which facts make the next reflection, the failure backoff, and the reflection
built from a synthesize_reflection answer (untrusted: validated field by field).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timedelta

import msgspec

from nekomem.config.longterm import LongTermSettings
from nekomem.domain.evidence import (
    seed_reinforcement,
)
from nekomem.domain.records import (
    BUILTIN_ENTITIES,
    SCHEMA_VERSION_CURRENT,
    Fact,
    Reflection,
    parse_time,
    record_get,
    reflection_id,
    to_iso,
)
from nekomem.domain.reflections.lifecycle import (
    LEGACY_TIME_SCOPES,
    RELATION_TYPES,
    TIME_SCOPES,
)


class SynthesisBatch(msgspec.Struct, frozen=True):
    """The facts of one synthesis and its deterministic ids.

    ``reflection_id`` is derived from the sorted ``source_fact_ids`` (idempotent retries);
    ``backoff_key`` hashes every eligible unabsorbed id before the cap, so any new fact
    resets the failure backoff.
    """

    facts: list[Fact]
    source_fact_ids: list[str]
    reflection_id: str
    backoff_key: str


def _ids_digest(ids: Iterable[str]) -> str:
    digest = hashlib.sha256()
    for fid in sorted(ids):
        digest.update(fid.encode("utf-8"))
        digest.update(b"\x00")
    return digest.hexdigest()[:16]


def synthesis_batch(facts: Iterable[Fact], settings: LongTermSettings) -> SynthesisBatch | None:
    """The next synthesis batch, or None when fewer than ``reflection_min_facts`` unabsorbed
    facts of importance >= ``reflection_min_importance`` exist. At most
    ``reflection_synthesis_facts_max`` facts: highest importance first, then oldest."""
    eligible = [f for f in facts if not f.absorbed and f.importance >= settings.reflection_min_importance]
    if len(eligible) < settings.reflection_min_facts:
        return None
    ranked = sorted(eligible, key=lambda f: (-f.importance, f.created_at))[: settings.reflection_synthesis_facts_max]
    ids = sorted(f.id for f in ranked)
    return SynthesisBatch(ranked, ids, reflection_id(ids), _ids_digest(f.id for f in eligible))


class SynthBackoff(msgspec.Struct, frozen=True):
    """One synth_backoff.json value: failures ``n`` and the last failure time ``at``."""

    n: int
    at: str


def synthesis_allowed(backoff: Mapping[str, SynthBackoff], key: str, now: datetime, settings: LongTermSettings) -> bool:
    """False while ``key`` has failed ``longterm_liveness_max_attempts`` times and the last
    failure is younger than ``longterm_dead_letter_self_heal_seconds`` (then one probe)."""
    entry = backoff.get(key)
    if entry is None or entry.n < settings.longterm_liveness_max_attempts:
        return True
    last = parse_time(entry.at, now)
    return last is None or (now - last).total_seconds() >= settings.longterm_dead_letter_self_heal_seconds


def record_synthesis_failure(backoff: Mapping[str, SynthBackoff], key: str, now: datetime) -> dict[str, SynthBackoff]:
    """``backoff`` with one more failure of ``key`` at ``now``."""
    result = dict(backoff)
    previous = result.get(key)
    result[key] = SynthBackoff(n=(previous.n if previous else 0) + 1, at=to_iso(now))
    return result


def clear_synthesis_backoff(backoff: Mapping[str, SynthBackoff], key: str) -> dict[str, SynthBackoff]:
    """``backoff`` without ``key`` (after a successful synthesis)."""
    return {k: v for k, v in backoff.items() if k != key}


def _ontology(body: object, entity: str, short_enough: bool) -> tuple[str | None, str | None, str | None]:
    """(time scope, relation type, subject) of a synthesis answer; all None when one of
    them is not allowed (or the text is too long): the text is kept without them."""
    scope = record_get(body, "time_scope", record_get(body, "temporal_scope"))
    scope = scope.strip().lower() if isinstance(scope, str) else None
    relation = record_get(body, "relation_type")
    relation = relation.strip().lower() if isinstance(relation, str) and relation.strip() else None
    subject = record_get(body, "subject")
    subject = subject.strip() if isinstance(subject, str) and subject.strip() else None
    ontology_ok = (
        (scope is None or scope in TIME_SCOPES or scope in LEGACY_TIME_SCOPES)
        and (relation is None or relation in RELATION_TYPES.get(entity, frozenset()))
        and short_enough
    )
    return (scope, relation, subject) if ontology_ok else (None, None, None)


def _event_times(body: object, scope: str | None, now: datetime) -> tuple[datetime | None, datetime | None]:
    """Event start and end of a synthesis answer: ``pattern`` keeps only a start,
    ``state``/``episode`` fall back to the start for the end; never end before start."""
    start = parse_time(record_get(body, "event_start_at"), now)
    end = parse_time(record_get(body, "event_end_at"), now)
    if scope == "pattern":
        end = None
    elif scope in ("state", "episode") and end is None:
        end = start
    if start is not None and end is not None and end < start:
        end = start
    return start, end


def build_reflection(
    output: object,
    batch: SynthesisBatch,
    now: datetime,
    settings: LongTermSettings,
    count_tokens: Callable[[str], int],
) -> Reflection | None:
    """The new pending reflection of a synthesize_reflection output, or None when the model
    returned ``{"reflection": null}`` or an empty text (the caller records a failure).

    An unknown entity becomes ``relationship``. An unknown time scope, a relation type not
    allowed for the entity, or a text over ``reflection_text_max_tokens`` clears the time
    scope, relation type and subject but keeps the text. ``state``/``episode`` get an end
    time (falling back to the start), ``pattern`` keeps only a start. The reinforcement seed
    comes from the most important source fact; ``next_eligible_at`` = now + cooldown.
    """
    body = record_get(output, "reflection")
    if body is None:
        return None
    text = record_get(body, "text")
    if not isinstance(text, str) or not text.strip():
        return None
    text = text.strip()
    entity = record_get(body, "entity")
    entity = entity.strip().lower() if isinstance(entity, str) else ""
    if entity not in BUILTIN_ENTITIES:
        entity = "relationship"
    scope, relation, subject = _ontology(body, entity, count_tokens(text) <= settings.reflection_text_max_tokens)
    start, end = _event_times(body, scope, now)
    seed = seed_reinforcement(max((f.importance for f in batch.facts), default=0), settings)
    return Reflection(
        id=batch.reflection_id,
        text=text,
        entity=entity,
        status="pending",
        source_fact_ids=list(batch.source_fact_ids),
        created_at=to_iso(now),
        next_eligible_at=to_iso(now + timedelta(minutes=settings.reflection_cooldown_minutes)),
        reinforcement=seed,
        rein_last_signal_at=to_iso(now) if seed else None,
        relation_type=relation,
        subject=subject,
        temporal_scope=scope,
        event_start_at=to_iso(start) if start else None,
        event_end_at=to_iso(end) if end else None,
        schema_version=SCHEMA_VERSION_CURRENT,
    )
