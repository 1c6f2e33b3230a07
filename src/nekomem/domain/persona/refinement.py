"""Persona refinement pass: which entries take part, their vectors (computed on the model
pool when the cache is stale), the clusters per entity for refine_cluster, and the check
that a cluster is still the one the model was shown. Protected entries never take part."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime

import msgspec
import numpy as np

from nekomem.config.longterm import LongTermSettings
from nekomem.domain import refine as rf
from nekomem.domain import vector_codec
from nekomem.domain.records import Persona, PersonaEntry, text_sha256


def refine_candidates(persona: Mapping[str, Sequence[PersonaEntry]], now: datetime, settings: LongTermSettings) -> list[PersonaEntry]:
    """Non-protected, non-empty entries not dead-lettered by failed refinements."""
    return [
        e for entries in persona.values() for e in entries if not e.protected and e.text.strip() and rf.refine_eligible(e, now, settings)
    ]


def missing_vectors(
    persona: Mapping[str, Sequence[PersonaEntry]], model: str, dim: int, now: datetime, settings: LongTermSettings
) -> list[tuple[str, str]]:
    """(id, text) of the candidates without a cached vector of ``model``."""
    return [(e.id, e.text) for e in refine_candidates(persona, now, settings) if rf.cached_vector(e, model, dim) is None]


def with_vectors(
    persona: Mapping[str, Sequence[PersonaEntry]], items: Sequence[tuple[str, str]], rows: Sequence[np.ndarray], model: str
) -> tuple[Persona, bool]:
    """``persona`` with the computed vectors cached on the entries whose text is still the
    one embedded (``items`` and ``rows`` pairwise); True when any entry changed. A row
    that cannot be encoded is skipped."""
    fresh: dict[str, tuple[str, str]] = {}
    for (entry_id, text), row in zip(items, rows, strict=False):
        try:
            fresh[entry_id] = (text, vector_codec.encode(row))
        except vector_codec.VectorCodecError:
            continue
    result: Persona = {k: list(v) for k, v in persona.items()}
    changed = False
    for entity, entries in result.items():
        updated = []
        for e in entries:
            if e.id in fresh and fresh[e.id][0] == e.text:
                e = msgspec.structs.replace(
                    e, embedding=fresh[e.id][1], embedding_model_id=model, embedding_text_sha256=text_sha256(e.text)
                )
                changed = True
            updated.append(e)
        result[entity] = updated
    return result, changed


def persona_clusters(
    persona: Mapping[str, Sequence[PersonaEntry]], model: str, dim: int, now: datetime, settings: LongTermSettings
) -> list[tuple[dict[str, str], str]]:
    """The clusters to send, each as (member id -> text, entity); entries never cluster
    across entities (see :func:`nekomem.domain.refine.plan_clusters`)."""
    sections = [(entity, [e for e in entries if not e.protected]) for entity, entries in persona.items()]
    clusters = rf.plan_clusters([entries for _entity, entries in sections], lambda e: rf.cached_vector(e, model, dim), now, settings)
    entity_of = {e.id: entity for entity, entries in sections for e in entries}
    text_of = {e.id: e.text for _entity, entries in sections for e in entries}
    return [({i: text_of[i] for i in ids}, entity_of[ids[0]]) for ids in clusters]


def cluster_changed(persona: Mapping[str, Sequence[PersonaEntry]], entity: str, members: Mapping[str, str]) -> bool:
    """True when a member left the section, became protected or was reworded since the
    cluster was sent: the model's answer is then about texts that no longer exist."""
    section = {e.id: e for e in persona.get(entity, [])}
    return any(i not in section or section[i].protected or section[i].text != text for i, text in members.items())
