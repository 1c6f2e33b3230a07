"""Request and response bodies of the HTTP API as msgspec types.

Each route decodes its body with :func:`nekomem.http.bodies.decode_body` into one of the
request types here, so the checks that used to be written by hand per route are the types'
constraints, and ``GET /openapi.json`` (:mod:`nekomem.server.openapi`) is generated from the
same types. Semantic checks a type cannot express (a message's role, a fact's time) stay
in the domain code.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, Meta, UnsetType

# The answers a layer builds in their wire shape (re-exported: the client and the OpenAPI
# document read them here with the other wire types).
from nekomem.wire.answers import ImportAnswer as ImportAnswer
from nekomem.wire.answers import PageAnswer as PageAnswer
from nekomem.wire.answers import RecallAnswer as RecallAnswer
from nekomem.wire.answers import RecallResult as RecallResult
from nekomem.wire.answers import TheaterForgetAnswer as TheaterForgetAnswer
from nekomem.wire.answers import TheaterRetractAnswer as TheaterRetractAnswer
from nekomem.wire.answers import WriteAnswer as WriteAnswer

NonEmpty = Annotated[str, Meta(min_length=1, pattern=r"\S")]
Importance = Annotated[int, Meta(ge=1, le=10)]


class Body(msgspec.Struct, kw_only=True, omit_defaults=True):
    """Base of request bodies: unknown fields are ignored (clients send extras)."""


class StrictBody(Body, forbid_unknown_fields=True):
    """Base of request bodies whose every field has a meaning (edits)."""


# -- requests ----------------------------------------------------------------------------
class HistoryBody(Body):
    """/cache, /process, /renew, /settle. ``input_history`` is an array of messages or that
    array JSON-encoded in a string (the reference client double-encodes)."""

    input_history: str | list[Any]
    # The reference's theater (a single theater episode capsule on /cache): the archive
    # request id, its attempt number and the story's current forget marker. A supported
    # ``language`` becomes the character's stored language; ``render_language`` is
    # accepted and ignored (see docs/NEKO.md, "Numeric theater").
    idempotency_key: str | None = None
    theater_archive_attempt: Annotated[int, Meta(ge=0)] | None = None
    theater_forget_marker: Annotated[str, Meta(max_length=128)] | None = None
    language: str | None = None
    render_language: str | None = None


class QueryBody(Body):
    """/query_memory: with neither ``query`` nor ``time`` the answer is empty (the
    reference's no-op). ``subjects`` narrows recall to scoped subjects (checked by
    :func:`nekomem.domain.subjects.subjects_from_request`)."""

    query: str | None = None
    time: str | None = None
    render: Literal["markdown"] | None = None
    language: str | None = None
    subjects: Any = None


class BrowseRecallBody(Body):
    """``POST /api/browse/{name}/recall_explain`` (a query, a time, or both)."""

    query: str | None = None
    time: str | None = None


class SuppressBody(Body):
    """``POST /api/browse/{name}/persona/{entry_id}/suppress``."""

    suppress: bool


class ReviewConfigBody(Body):
    """``POST /api/memory/review_config``."""

    enabled: bool


class ExportRequest(StrictBody):
    """The body of POST /api/characters/{name}/export: ``{}`` (no option yet)."""


class PowerfulMemoryBody(Body):
    enabled: bool


class StartupGateBody(Body):
    """Body of /internal/storage/startup/continue, /block and /activate (optional as a whole)."""

    reason: str | None = None
    recovery_mode: str | None = None  # the newest reference's /block field; accepted, not used


class RecordSurfacedBody(Body):
    reflection_ids: list[str] | None = None


class FeedbackBody(Body):
    feedback: Literal["confirmed", "denied", "ignored"]


class CardEntry(Body):
    entity: str
    text: str


class CardBody(Body):
    entries: list[CardEntry]


class FactImport(Body):
    text: NonEmpty
    importance: Importance = 5
    entity: str | None = None
    event_start_at: str | None = None
    event_end_at: str | None = None
    # Where the fact came from (a benchmark's dialogue ids, a file); stored as given
    # within the opaque bounds (depth and size settings).
    source: Any = None


class FactsBody(Body):
    facts: list[FactImport]


class EntryEdit(StrictBody):
    """PATCH of a facts/reflections/persona entry; which fields a layer accepts is checked
    by its actor (422 for one it does not have)."""

    text: str | UnsetType = UNSET
    importance: int | UnsetType = UNSET
    entity: str | UnsetType = UNSET


class RecentEdit(StrictBody):
    text: NonEmpty


# -- responses ---------------------------------------------------------------------------
class ErrorBody(msgspec.Struct):
    status: Literal["error"]
    error_code: str
    message: str


class GapAnswer(msgspec.Struct):
    gap_seconds: float


class EnabledAnswer(msgspec.Struct):
    enabled: bool


class ToggleAnswer(msgspec.Struct):
    success: bool
    enabled: bool


class CountAnswer(msgspec.Struct):
    ok: bool
    count: int


class CharacterItem(msgspec.Struct):
    name: str
    active: bool


class CharactersAnswer(msgspec.Struct):
    characters: list[CharacterItem]


class ReflectAnswer(msgspec.Struct):
    reflection: dict[str, Any] | None
    synthesis: dict[str, Any]
    confirmed: list[Any]
    promotion: list[Any]
    auto_transitions: int


class TierHealth(msgspec.Struct):
    """One LLM tier in ``/health``: ``state`` is ok / failing / untried / unconfigured."""

    configured: bool
    model: str = ""
    base_url: str = ""
    state: str = "unconfigured"
    calls: int = 0
    attempts: int = 0
    failures: int = 0
    skipped: int = 0
    last_error: str | None = None
    last_error_at: str | None = None
    failing_since: str | None = None
    last_success_at: str | None = None
    recovered_error: str | None = None
    negotiated: dict[str, Any] | None = None


class LLMHealth(msgspec.Struct):
    """The model tiers in ``/health``; ``state`` is ok / failing / unconfigured."""

    available: bool
    tiers: dict[str, TierHealth]
    skipped_tiers: list[str]
    state: str = "unconfigured"
    failing_tiers: list[str] = []
    config_warnings: list[str] = []


class EmbeddingsHealth(msgspec.Struct):
    """The local embedding model in ``/health``."""

    state: str
    model: str = ""
    pending: int = 0
    reason: str | None = None


class HealthAnswer(msgspec.Struct):
    app: str
    service: str
    status: str
    instance_id: str
    server: str
    version: str
    limited_mode: bool
    storage: dict[str, Any]
    active_characters: int = 0
    llm: LLMHealth | None = None
    embeddings: EmbeddingsHealth | None = None
    overall: str = "ok"
    blocking_reason: str | None = None
    # Only without api_token, or with it given: the server's process and memory root (so
    # a second `nekomem serve` on the port can say who holds it). Without the token, no
    # character names either: names_withheld is then true.
    pid: int | None = None
    memory_root: str | None = None
    names_withheld: bool = False


class RenameBody(StrictBody):
    """Body of ``POST /api/characters/{name}/rename``: the new name."""

    to: str


class MergeBody(StrictBody):
    """Body of ``POST /api/characters/{name}/merge``: the character that takes it in."""

    into: str
