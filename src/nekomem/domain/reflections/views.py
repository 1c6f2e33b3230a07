"""How a reflection is shown outside its owner: the recall index entry and the API view."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime

import msgspec

from nekomem.config.longterm import LongTermSettings
from nekomem.domain.evidence import net_score
from nekomem.domain.index_entry import IndexEntry
from nekomem.domain.records import Reflection

# Statuses that leave recall and no longer take feedback.
TERMINAL = ("denied", "archived", "merged", "promote_blocked")


def index_entry(ref: Reflection, now: datetime, settings: LongTermSettings) -> IndexEntry:
    """The recall index entry of ``ref``: searchable unless terminal, suppressed, below
    zero or empty; the cached vector travels with it."""
    score = net_score(ref, now, settings)
    searchable = ref.status not in TERMINAL and not ref.suppress and score >= 0 and bool(ref.text.strip())
    return IndexEntry(
        id=ref.id,
        tier="reflection",
        text=ref.text,
        entity=ref.entity,
        created_at=ref.created_at or None,
        event_start_at=ref.event_start_at,
        event_end_at=ref.event_end_at,
        score=score,
        searchable=searchable,
        vector=ref.embedding if isinstance(ref.embedding, str) else None,
        vector_model=ref.embedding_model_id,
        text_sha256=ref.embedding_text_sha256,
        subject_kind=ref.subject_kind,
        subject_id=ref.subject_id,
        scope=ref.scope,
    )


def public_view(ref: Reflection, now: datetime, settings: LongTermSettings) -> dict[str, object]:
    """The API form of ``ref``: its fields without the vector, plus its evidence score."""
    data: dict[str, object] = msgspec.to_builtins(msgspec.structs.replace(ref, embedding=None))
    data["evidence_score"] = net_score(ref, now, settings)
    return data


class EditError(ValueError):
    """An API edit that cannot apply; ``code`` is the stable error code."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def edit_changes(changes: Mapping[str, object]) -> dict[str, object]:
    """The field changes of an API edit of a reflection (``text`` and/or ``entity``).

    Raises EditError: ``bad_field`` (a field that cannot be edited), ``bad_text`` or
    ``bad_entity`` (not a non-empty string)."""
    unknown = set(changes) - {"text", "entity"}
    if unknown:
        raise EditError("bad_field", f"cannot edit {sorted(unknown)}")
    result: dict[str, object] = {}
    if "text" in changes:
        text = changes["text"]
        if not isinstance(text, str) or not text.strip():
            raise EditError("bad_text", "text must be a non-empty string")
        result.update(text=text.strip(), embedding=None, embedding_text_sha256=None)
    if "entity" in changes:
        entity = changes["entity"]
        if not isinstance(entity, str) or not entity.strip():
            raise EditError("bad_entity", "entity must be a non-empty string")
        result["entity"] = entity.strip()
    return result
