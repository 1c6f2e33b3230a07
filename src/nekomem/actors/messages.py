"""Every message exchanged with and between the actors of a character.

A message that expects an answer carries ``reply`` (a :class:`~nekomem.runtime.reply.Reply`);
whichever actor finishes the work completes it.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from nekomem.domain.messages import Turn
from nekomem.domain.subjects import Subject

WriteMode = Literal["cache", "process", "renew", "settle"]


class Message(msgspec.Struct, kw_only=True):
    reply: Any = None


# -- supervision -------------------------------------------------------------------------
class Deliver(Message):
    child: str
    message: Any


class ChildCrashed(Message):
    child: str
    error: str
    pending: list[Any]


class Tick(Message):
    """Periodic work; sent by the scheduler through the supervisor to every child."""

    monotonic: float


class Flush(Message):
    """Write views that lag their journal now."""


class Describe(Message):
    """Ask the supervisor for its children's state (for /health and tests)."""


# -- recent window -----------------------------------------------------------------------
class AppendTurns(Message):
    turns: list[Turn]
    mode: WriteMode
    session_id: str
    idempotency_key: str | None = None


class WriteResult(msgspec.Struct):
    status: str
    count: int
    stored: int


class GetRecent(Message):
    """The window for /new_dialog and /get_recent_history; waits for an in-flight settle
    or renew when ``wait_settle``."""

    wait_settle: bool = False


class RecentView(msgspec.Struct):
    window: list[Turn]
    last_timestamp: str | None
    stored_total: int


class CompressDone(Message):
    token: int
    result: Any
    error: str | None


class ReviewDone(Message):
    token: int
    result: Any
    error: str | None
    exhausted: bool = False


class EditRecent(Message):
    """Replace item ``index`` of the window (text only) or delete it when ``text`` is None."""

    index: int
    text: str | None


# -- outbox ------------------------------------------------------------------------------
class Enqueue(Message):
    """Record background work durably, then answer ``reply`` with ``reply_value``."""

    op_type: str
    payload: dict[str, Any]
    reply_value: Any = None


class RunOp(Message):
    """Sent by the outbox to the op's handler actor; the handler answers with OpFinished."""

    op_id: str
    op_type: str
    payload: dict[str, Any]
    attempt: int


class OpFinished(Message):
    op_id: str
    ok: bool
    error: str = ""
    retry: bool = True


class OutboxState(Message):
    """Ask the outbox for its counts."""


# -- reflections -------------------------------------------------------------------------
class ResetConfirmedAt(Message):
    """Set confirmed_at = now on every confirmed reflection (powerful memory switched off);
    answers the number changed."""


# -- recall index feed -------------------------------------------------------------------
class IndexEntry(msgspec.Struct, kw_only=True):
    """What RecallActor needs of one searchable entry.

    ``tier`` is "fact", "reflection" or "fact_archive". ``searchable`` is False for entries
    the shared hard filter excludes (denied/archived/merged/promote_blocked reflections,
    suppressed, protected, negative evidence score, empty text); RecallActor drops them.
    ``vector`` is a cached vector in nekomem.recall.vector_codec form with ``vector_model``
    and ``text_sha256`` so it is reused only when both still match.
    """

    id: str
    tier: str
    text: str
    entity: str = ""
    created_at: str | None = None
    event_start_at: str | None = None
    event_end_at: str | None = None
    importance: int = 0
    score: float = 0.0
    searchable: bool = True
    source: Any = None
    vector: str | None = None
    vector_model: str | None = None
    text_sha256: str | None = None
    subject_kind: str | None = None
    subject_id: str | None = None
    scope: str | None = None


class IndexUpsert(Message):
    """Owners (FactActor, ReflectionActor) tell RecallActor of new or changed entries.
    ``replace_tier`` set: these entries are the complete set of that tier (used at load)."""

    entries: list[IndexEntry]
    replace_tier: str | None = None


class IndexRemove(Message):
    ids: list[str]


class VectorsComputed(Message):
    """RecallActor tells the owner the vectors it computed, so they are cached on entries."""

    vectors: dict[str, tuple[str, str, str]]  # id -> (encoded vector, model id, text sha256)


# -- long-term memory --------------------------------------------------------------------
class ModelDone(Message):
    """A model job finished; ``kind`` says which, ``context`` carries what the owner
    needs to apply the result (validated again by the owner: results are untrusted)."""

    kind: str
    token: int
    output: Any
    error: str | None
    context: Any = None


class ImportFacts(Message):
    facts: list[dict[str, Any]]


class ListEntries(Message):
    status: str | None = None
    entity: str | None = None
    offset: int = 0
    limit: int = 100


class EditEntry(Message):
    id: str
    changes: dict[str, Any]


class DeleteEntry(Message):
    id: str


class ReflectNow(Message):
    """POST /reflect: a synthesis pass then a promotion pass, answered with what they did."""


class Synthesize(Message):
    batch: Any  # nekomem.domain.reflections.SynthesisBatch | None
    related: list[Any] = []
    report: dict[str, Any] | None = None  # set for /reflect: the pass answers through reply


class AbsorbFacts(Message):
    ids: list[str]
    reflection_id: str


class NewFacts(Message):
    """New user facts (powerful memory on): the Stage-2 evidence pass starts here."""

    facts: list[Any]


class EvidencePass(Message):
    facts: list[Any]
    reflection_observations: list[Any]


class ApplySignals(Message):
    signals: list[Any]
    source: str = "user_fact"


class SignalsProcessed(Message):
    fact_ids: list[str]


class PostTurn(Message):
    turns: list[Turn]


class Feedback(Message):
    id: str
    feedback: str


class PromotionPass(Message):
    report: dict[str, Any] | None = None


class Promote(Message):
    candidates: list[Any]
    report: dict[str, Any] | None = None


class PromotionResult(Message):
    reflection: Any
    kind: str


class RenderContext(Message):
    """The long-term block of a context. ``subjects`` None: the owner's private corpus;
    otherwise only entries of those subjects (nekomem.domain.subjects)."""

    subjects: list[Subject] | None = None
    language: str = "en"
    master_name: str = ""  # empty: the master_name setting


class RenderWithPersona(Message):
    persona: Any
    subjects: list[Subject] | None = None
    language: str = "en"
    master_name: str = ""


class FollowupTopics(Message):
    pass


class RecordSurfaced(Message):
    ids: list[str]


class ImportCard(Message):
    entries: list[dict[str, str]]


class ReplyMentions(Message):
    """The character's last reply, for mention tracking ("do not bring up" list)."""

    text: str


class CorrectionResolved(Message):
    reflection_id: str
    kind: str


class AddScopedFacts(Message):
    """Store already-extracted facts of one group/participant subject (``/scoped_facts``).
    Answered ``{"created": n, "fact_ids": [...]}``."""

    subject: Subject
    facts: list[dict[str, Any]]


class ExtractScoped(Message):
    """Extract and store facts of one subject from its history (``/scoped_history``).
    Answered like :class:`AddScopedFacts`; an extraction failure fails the reply (502)."""

    subject: Subject
    turns: list[Turn]
    speaker_label: str = ""


class CancelCorrection(Message):
    """``/cancel_correction``: drop an in-flight review of the recent window and adopt an
    outside edit of recent.json. Answered ``{"status": "cancelled" | "no_task"}``."""


class ScopedMentions(Message):
    """``/scoped_mentions``: record mentions of the subjects' persona entries echoed in
    ``text`` (the character's reply in that group). Answered ``{"status", "mentioned"}``."""

    subjects: list[Subject]
    text: str
