"""The answers whose shape is the wire shape, described once.

A layer builds one of these as its reply, the route encodes it (``msgspec.to_builtins``
then the JSON response: field order is key order, an ``UNSET`` field is left out), the
Python client decodes it and ``/openapi.json`` documents it: ``nekomem.http.schemas``
re-exports them with the other wire types. They sit in a room of their own below every
other (msgspec only), so the layer that answers can build them and the client can import
them without loading any of the server.
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

# An entry's API form: its record's fields as JSON, plus what the owner adds (a
# reflection's evidence_score, a fact's archived flag in the browser). The owners build it
# from their record Structs; each layer's records have their own fields, so the
# listing that carries several layers' entries names the JSON form, not one record type.
# Any: a JSON value of the record's (msgspec documents ``object`` in no schema).
PublicEntry = dict[str, Any]


class WriteAnswer(msgspec.Struct, omit_defaults=True):
    """/cache, /process, /renew, /settle: ``count`` (the turns sent) for /cache only."""

    status: str
    count: int | None = None


class RecallResult(msgspec.Struct):
    """One row of a recall (``recall.response.hit_row``)."""

    id: str
    text: str
    # fact, fact_archive, reflection, turn (a journal turn no memory covers), journal (the
    # fallback without long-term entries), or the tier of a layer declared at run time.
    tier: str
    entity: str | None = None
    score: float | None = None  # None for a recall by time alone
    created_at: str | None = None
    event_start_at: str | None = None
    event_end_at: str | None = None
    # The subject the entry belongs to (nekomem.domain.subjects): kind and id are None and
    # scope is "legacy_private" (LEGACY_PRIVATE_SCOPE) for the owner's private entries.
    subject_kind: str | None = None
    subject_id: str | None = None
    scope: str = "legacy_private"
    session_id: str | UnsetType = UNSET  # the write request that stored a journal turn


class RecallAnswer(msgspec.Struct, kw_only=True):
    """The answer of ``/query_memory``; the fields in wire order."""

    results: list[RecallResult]
    query: str
    time: str | UnsetType = UNSET  # the time expression of a recall by time alone (``query`` is then "")
    candidates_total: int = 0
    elapsed_ms: float = 0.0
    error_code: str | UnsetType = UNSET  # "hybrid_recall_failed": recall failed, no rows
    markdown: str | UnsetType = UNSET  # with ``render: "markdown"``: the block for a model


class PageAnswer(msgspec.Struct):
    """A page of a layer's entries (``GET /api/characters/{name}/{layer}``)."""

    total: int
    offset: int
    items: list[PublicEntry]


class ImportAnswer(msgspec.Struct):
    """``POST /api/characters/{name}/facts``: the ids stored and the duplicates skipped."""

    added: list[str]
    skipped_duplicates: int


class TheaterForgetAnswer(msgspec.Struct):
    """``/internal/memory/{name}/theater/forget``."""

    ok: bool
    removed_recent: int
    removed_time_index: int
    forget_marker: str


class TheaterRetractAnswer(msgspec.Struct):
    """``/internal/memory/{name}/theater/retract``."""

    ok: bool
    removed_recent: int
    removed_time_index: int


class DeleteAnswer(msgspec.Struct):
    """``DELETE /api/characters/{name}/{layer}/{id}``: answered once every copy is gone."""

    deleted: str


class ForgetTurnsAnswer(msgspec.Struct):
    """``DELETE /api/characters/{name}/turns``: how many journal rows went, and their ids."""

    forgotten: int
    rows: list[int]


class Topic(msgspec.Struct):
    id: str
    text: str
    entity: str


class TopicsAnswer(msgspec.Struct):
    """``/followup_topics``: reflections the character may bring up."""

    topics: list[Topic]


class SurfacedAnswer(msgspec.Struct):
    """``/record_surfaced``."""

    ok: bool
    recorded: int


class CardImportAnswer(msgspec.Struct):
    """``POST /api/characters/{name}/persona``: the entry ids added, the entries already there."""

    added: list[str]
    skipped_existing: int


class StatusAnswer(msgspec.Struct):
    """An answer that is a status word (``/cancel_correction``: cancelled or no_task)."""

    status: str


class MentionsAnswer(msgspec.Struct):
    """``/scoped_mentions``: recorded (or skipped) and how many entries were mentioned."""

    status: str
    mentioned: int


class SuppressAnswer(msgspec.Struct):
    """The memory browser's suppression of a persona entry."""

    id: str
    entity: str
    suppress: bool
    suppressed_at: str | None


class ScopedCreated(msgspec.Struct):
    """The facts a scoped write stored (``/scoped_facts``, ``/scoped_history``)."""

    created: int
    fact_ids: list[str]
