"""Persona sections and the character card: copies, lookups, the protected card entries
and their sync.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

import msgspec

from nekomem.config.longterm import LongTermSettings
from nekomem.domain.records import (
    BUILTIN_ENTITIES,
    Persona,
    PersonaEntry,
    VersionRecord,
    card_entry_id,
    to_iso,
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
