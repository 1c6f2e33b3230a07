"""Every message exchanged with and between the actors of a character.

A message that expects an answer carries ``reply`` (a :class:`~nekomem.runtime.reply.Reply`);
whichever actor finishes the work completes it. Messages are frozen: a handler never
changes what it was sent. Fields that carry model output or JSON from a client are typed
``object`` (untrusted until the receiving owner validates them).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Literal

import msgspec
import numpy as np
import numpy.typing as npt

from nekomem.domain.browse import FactFilter
from nekomem.domain.evidence import ResolvedSignal, SignalSource
from nekomem.domain.index_entry import IndexEntry
from nekomem.domain.layers import Address, Count, Erasure, next_scrubber, vector_tiers
from nekomem.domain.persona.corrections import CorrectionKind
from nekomem.domain.records import Correction, Fact, Observation, Persona, Reflection
from nekomem.domain.reflections import SynthesisBatch
from nekomem.domain.subjects import Subject
from nekomem.domain.turns import Turn

# The supervision protocol is the runtime's; re-exported here for the actors.
from nekomem.runtime.protocol import ChildCrashed as ChildCrashed
from nekomem.runtime.protocol import Deliver as Deliver
from nekomem.runtime.protocol import Describe as Describe
from nekomem.runtime.protocol import Flush as Flush
from nekomem.runtime.protocol import Message
from nekomem.runtime.protocol import Tick as Tick
from nekomem.wire.answers import PublicEntry

WriteMode = Literal["cache", "process", "renew", "settle"]


class Report(msgspec.Struct):
    """The answer of POST /reflect, filled in by the passes it runs: the fact layer starts
    it, the reflections fill in ``synthesis`` (``{"status", ...}``) and ``confirmed`` (the
    ids confirmed), the persona ``promotion`` (a line per candidate), and whichever runs
    last answers it. Mutable on purpose: it travels with the messages of one pass, held
    by one actor at a time. The route shapes it (``nekomem.http.longterm.reflect``)."""

    synthesis: dict[str, object] | None = None
    confirmed: list[str] | None = None
    promotion: list[dict[str, object]] | None = None


Vectors = npt.NDArray[np.float32]


# -- recent window -----------------------------------------------------------------------
class AppendTurns(Message, frozen=True):
    turns: list[Turn]
    mode: WriteMode
    session_id: str
    idempotency_key: str | None = None


class GetRecent(Message, frozen=True):
    """The window for /new_dialog and /get_recent_history; waits for an in-flight settle
    or renew when ``wait_settle``."""

    wait_settle: bool = False


class RecentView(msgspec.Struct):
    window: list[Turn]
    last_timestamp: str | None
    stored_total: int
    shown: list[str] | None = None  # each item's text as a context shows it (GetRecent only)


class CompressDone(Message, frozen=True):
    token: int
    result: object
    error: str | None


class ReviewDone(Message, frozen=True):
    token: int
    result: object
    error: str | None
    exhausted: bool = False


class TheaterWrite(Message, frozen=True):
    """Upsert one theater capsule (/cache with a single theater episode summary)."""

    turn: Turn
    archive_request_id: str = ""
    archive_attempt: int | None = None
    forget_marker: str | None = None


class TheaterForget(Message, frozen=True):
    """Remove every capsule of a story from the window and the journal; tombstone it."""

    story_id: str


class TheaterRetract(Message, frozen=True):
    """Take back the capsule of one declined archive (restoring its previous version)."""

    story_id: str
    session_id: str
    through_revision: int
    archive_request_id: str = ""
    archive_attempt: int = 0


class EditRecent(Message, frozen=True):
    """Replace item ``index`` of the window (text only) or delete it when ``text`` is None."""

    index: int
    text: str | None


class ForgetTurns(Message, frozen=True):
    """Erase journal rows (``row_ids``, or every row stamped within [``start``, ``end``])
    and every copy of their text; answered with ``{"forgotten": n, "rows": [ids]}``."""

    row_ids: list[int] = []
    start: str | None = None
    end: str | None = None


class ScrubTexts(Message, frozen=True):
    """The erasure relay: every layer that keeps copies of the text of a ``kind`` erasure
    (declared ``scrubs``) removes them in turn, from the layer the erasure began in
    (``origin``) on, in start order (``domain.layers.next_scrubber``); the outbox comes last
    and answers ``reply`` with ``reply_value`` (the erasure's answer: it is complete only
    once every copy is gone)."""

    texts: list[str]
    origin: Address
    kind: Erasure
    reply_value: object = None

    def onward(self, current: Address) -> Address:
        """The layer this message goes to after ``current`` (see ``next_scrubber``)."""
        return next_scrubber(self.kind, self.origin, current)


# -- outbox ------------------------------------------------------------------------------
class Enqueue(Message, frozen=True):
    """Record background work durably, then answer ``reply`` with ``reply_value``."""

    op_type: str
    payload: Mapping[str, object]
    reply_value: object = None
    replay: bool = False  # re-sent after a crash: dropped when the outbox holds the same rows
    # The payload's messages as Turns, when the sender has them: handed to the first run
    # so the handler does not parse back what was just encoded (never written to disk).
    turns: list[Turn] | None = None


class OutboxAck(Message, frozen=True):
    """Sent back by the outbox to RecentActor once a post-turn record of a
    process/renew/settle is durable (the ``reply_value`` of its Enqueue)."""

    write_id: int
    row: int = 0  # the last time-index row the record covers


class OutboxAcks(Message, frozen=True):
    """The acknowledgements one group fsync of the outbox made true, in record order (one
    message for all of them: a busy character has a record per turn)."""

    acks: list[OutboxAck]


class RunOp(Message, frozen=True):
    """Sent by the outbox to the op's handler actor; the handler answers with OpFinished."""

    op_id: str
    op_type: str
    payload: Mapping[str, object]
    attempt: int
    turns: list[Turn] | None = None  # the payload's messages, parsed (first run only)


class OpFinished(Message, frozen=True):
    op_id: str
    ok: bool
    error: str = ""
    retry: bool = True


class OpParked(Message, frozen=True):
    """Sent by a handler that keeps an op in memory until a later batch runs it: the
    record stays pending (replayed after a crash) but no longer takes a dispatch slot,
    so the outbox goes on dispatching the records behind it."""

    op_id: str


class ReclaimParked(Message, frozen=True):
    """Sent by a handler at load: the ops it had parked were lost with its memory, so the
    outbox dispatches them again."""

    child: Address


class OutboxState(Message, frozen=True):
    """Ask the outbox for its counts."""


# -- reflections -------------------------------------------------------------------------
class ResetConfirmedAt(Message, frozen=True):
    """Set confirmed_at = now on every confirmed reflection (powerful memory switched off);
    answers the number changed."""


# -- recall index feed -------------------------------------------------------------------
class IndexUpsert(Message, frozen=True):
    """Owners (FactActor, ReflectionActor) tell RecallActor of new or changed entries.
    ``replace_tier`` set: these entries are the complete set of that tier (used at load)."""

    entries: list[IndexEntry]
    replace_tier: str | None = None
    counted: int = 0  # entries the sender counted as waiting for a vector (recall.pending)
    # With replace_tier: the identities (inode, size, mtime ns) of the owner's view files when
    # the entries are exactly what those files hold (actors.recall_persist.views_stamp).
    views: list[list[int] | None] | None = None


class IndexRemove(Message, frozen=True):
    ids: list[str]


class VectorsComputed(Message, frozen=True):
    """RecallActor tells the owner the vectors it computed, so they are cached on entries."""

    vectors: dict[str, tuple[str, str, str]]  # id -> (encoded vector, model id, text sha256)


# -- long-term memory --------------------------------------------------------------------
class ModelResult(Message, frozen=True):
    """Base of the outcome of one model job. Each job has its own subclass, which carries
    what its owner needs to apply the result; ``output`` is untrusted until the owner
    validates it, ``error`` is the failure's repr when the job failed."""

    token: int
    output: object
    error: str | None


class RefineDone(ModelResult, frozen=True):
    """A ``refine_cluster`` job finished (reflections and persona both refine):
    ``members`` maps each member's id to the text sent, ``extra`` is the owner's own
    context for the cluster."""

    members: dict[str, str]
    extra: Mapping[str, object]


class ImportFacts(Message, frozen=True):
    facts: list[Mapping[str, object]]


class ListEntries(Message, frozen=True):
    status: str | None = None
    entity: str | None = None
    offset: int = 0
    limit: int = 100


class EditEntry(Message, frozen=True):
    id: str
    changes: Mapping[str, object]


class DeleteEntry(Message, frozen=True):
    id: str


class ReflectNow(Message, frozen=True):
    """POST /reflect: a synthesis pass then a promotion pass, answered with what they did."""


class Synthesize(Message, frozen=True):
    batch: SynthesisBatch | None
    related: list[Fact] = []
    report: Report | None = None  # set for /reflect: the pass answers through reply


class AbsorbFacts(Message, frozen=True):
    ids: list[str]
    reflection_id: str


class NewFacts(Message, frozen=True):
    """New user facts (powerful memory on): the Stage-2 evidence pass starts here."""

    facts: list[Fact]


class EvidencePass(Message, frozen=True):
    facts: list[Fact]
    reflection_observations: list[Observation]


class ApplySignals(Message, frozen=True):
    signals: list[ResolvedSignal]
    source: SignalSource = "user_fact"


class SignalsProcessed(Message, frozen=True):
    fact_ids: list[str]


class PostTurn(Message, kw_only=True, frozen=True):
    """A turn's messages after they are stored; ``reply_text`` is the character's last
    reply in them, for mention tracking (as :class:`ReplyMentions`, in the same message)."""

    turns: list[Turn]
    reply_text: str = ""


class Feedback(Message, frozen=True):
    id: str
    feedback: str


class PromotionPass(Message, frozen=True):
    report: Report | None = None


class Promote(Message, frozen=True):
    candidates: list[Reflection]
    report: Report | None = None


class PromotionResult(Message, frozen=True):
    reflection: Reflection
    kind: str


class RenderBlock(Message, frozen=True):
    """A declared layer's block of the working context (``LayerSpec.render``), answered
    with its text ("" for none)."""

    language: str = "en"
    master_name: str = ""  # empty: the master_name setting


class RenderContext(Message, frozen=True):
    """The long-term block of a context. ``subjects`` None: the owner's private corpus;
    otherwise only entries of those subjects (nekomem.domain.subjects)."""

    subjects: list[Subject] | None = None
    language: str = "en"
    master_name: str = ""  # empty: the master_name setting


class RenderWithPersona(Message, frozen=True):
    persona: Persona
    subjects: list[Subject] | None = None
    language: str = "en"
    master_name: str = ""


class FollowupTopics(Message, frozen=True):
    pass


class RecordSurfaced(Message, frozen=True):
    ids: list[str]


class ImportCard(Message, frozen=True):
    """Add persona entries: character-card entries (protected) by default, or, with
    ``protected=False``, ordinary entries of ``source`` (an external Markdown import)."""

    entries: list[dict[str, str]]
    source: str = "character_card"
    protected: bool = True


class ReplyMentions(Message, frozen=True):
    """The character's last reply, for mention tracking ("do not bring up" list)."""

    text: str


class CorrectionResolved(Message, frozen=True):
    reflection_id: str
    kind: CorrectionKind


# -- recall ------------------------------------------------------------------------------
class QueryMemory(Message, frozen=True):
    """User recall (``/query_memory``). ``now`` is the caller's clock in the display time
    zone (time expressions resolve against it); ``reply`` gets the response dict."""

    query: str = ""
    time: str = ""
    now: datetime | None = None
    subjects: list[Subject] | None = None  # None: the private corpus (nekomem.domain.subjects)
    # An explicit recall (POST /query_memory), which recall_llm_rerank may re-rank.
    explicit: bool = False


class RankForStage2(Message, frozen=True):
    """Stage-2 coarse rank: ``candidate_ids`` (confirmed/promoted reflections and
    non-protected persona, in evidence order) ranked by their best cosine to any of
    ``query_texts``, cut to ``recall_coarse_oversample * budget``. Candidates the index has
    no vector for (persona entries) keep the given order in a reserved quota; pass their
    texts in ``candidate_texts`` to have them embedded too. Without vectors or queries the
    answer is the given order. Answered with ``RankedIds(tag, ids)`` sent to
    ``reply_child`` (and through ``reply`` when set)."""

    query_texts: list[str]
    candidate_ids: list[str]
    budget: int
    reply_child: Address | None = None
    tag: str = ""
    candidate_texts: dict[str, str] = {}


class RelatedFacts(Message, frozen=True):
    """Synthesis related context: the ``per_query_k`` entries nearest to each query text
    (cosine), merged round-robin (every query's first before anyone's second), deduplicated,
    capped at ``cap``; ``tiers`` limits the pool, ``exclude_ids`` removes entries (e.g. the
    batch's own facts). Empty without vectors. Answered like :class:`RankForStage2`."""

    query_texts: list[str]
    per_query_k: int
    cap: int
    reply_child: Address | None = None
    tag: str = ""
    tiers: list[str] = msgspec.field(default_factory=lambda: list(vector_tiers()))
    exclude_ids: list[str] = []


MaintenanceRecall = RankForStage2 | RelatedFacts


class RankedIds(Message, frozen=True):
    """The answer of a maintenance recall: ``ids`` best first, ``tag`` as given."""

    tag: str
    ids: list[str]


class RequestIndex(Message, frozen=True):
    """Sent by a restarted RecallActor to the owners: please resend your complete
    IndexUpsert (with replace_tier), my in-memory index was lost with the crash. With
    ``wake``: sent by a waking RecallActor to the facts owner, which reads its facts only
    when one needs them: recall needs their feed (no current segment of the facts, or
    vectors to take from them); an owner that has read them already sent it then."""

    wake: bool = False


class QueryVector(Message, frozen=True):
    """A query's embedding came back from the model pool (``vectors`` one row)."""

    token: int
    vectors: Vectors | None
    error: str | None


class IndexWaitOver(Message, frozen=True):
    """The wait for the owners' first IndexUpsert is over: answer held queries anyway."""


class QueryExpired(Message, frozen=True):
    """A query's embedding did not come back in time: answer from BM25 alone."""

    token: int


class Reranked(Message, frozen=True):
    """A query's re-rank request came back: the candidates' indexes best first (None with
    ``error``)."""

    token: int
    order: list[int] | None = None
    error: str | None = None


class TurnVectorsDone(Message, frozen=True):
    """An embedding job over uncovered journal turns came back: ``ids`` in batch order,
    embedded by ``model``; ``vectors`` None with ``error``."""

    token: int
    ids: list[str]
    model: str
    vectors: Vectors | None = None
    error: str | None = None


class RerankExpired(Message, frozen=True):
    """A query's re-ranker did not answer in time: answer in the fused order."""

    token: int


class BackfillDone(Message, frozen=True):
    """A backfill batch came back: ``items`` are (id, text sha256) in batch order."""

    token: int
    items: list[tuple[str, str]]
    vectors: Vectors | None
    error: str | None


class MaintenanceVectors(Message, frozen=True):
    """The query (and extra candidate) embeddings of a maintenance recall came back."""

    token: int
    vectors: Vectors | None
    error: str | None


# -- drop-in routes --------------------------------------------------------------------
class AddScopedFacts(Message, frozen=True):
    """Store already-extracted facts of one group/participant subject (``/scoped_facts``).
    Answered ``{"created": n, "fact_ids": [...]}``."""

    subject: Subject
    facts: list[Mapping[str, object]]


class ExtractScoped(Message, frozen=True):
    """Extract and store facts of one subject from its history (``/scoped_history``).
    Answered like :class:`AddScopedFacts`; an extraction failure fails the reply (502)."""

    subject: Subject
    turns: list[Turn]
    speaker_label: str = ""
    # Who said it, for the reference's identity routes (``speaker_id``, ``speaker_label``,
    # ``speaker_entity_id``): kept on each stored fact under ``source_ref.neko``.
    provenance: Mapping[str, str] | None = None


class CancelCorrection(Message, frozen=True):
    """``/cancel_correction``: drop an in-flight review of the recent window and adopt an
    outside edit of recent.json. Answered ``{"status": "cancelled" | "no_task"}``."""


class ScopedMentions(Message, frozen=True):
    """``/scoped_mentions``: record mentions of the subjects' persona entries echoed in
    ``text`` (the character's reply in that group). Answered ``{"status", "mentioned"}``."""

    subjects: list[Subject]
    text: str


# -- memory browser (/ui) ----------------------------------------------------------------
class BrowseFacts(Message, frozen=True):
    """A filtered page of facts, newest first. Answers ``{"total", "offset", "items"}``."""

    filter: FactFilter
    offset: int = 0
    limit: int = 100


class GetEntry(Message, frozen=True):
    """One reflection by id in its public form (404 when unknown)."""

    id: str


class SetSuppressed(Message, frozen=True):
    """Suppress (or lift the suppression of) one persona entry; journaled like any change."""

    id: str
    suppress: bool


class ListCorrections(Message, frozen=True):
    """The persona contradiction queue (corrections waiting for a model decision)."""


class CountEntries(Message, frozen=True):
    """The memory browser's counts of a layer (the keys its declaration lists in
    ``counts``), answered with :class:`EntryCounts`: exact, unflushed changes included."""


class EntryCounts(msgspec.Struct, frozen=True):
    counts: dict[str, Count]


class ExplainQuery(Message, frozen=True):
    """Recall playground: run a user recall (the plan and query embedding of
    :class:`QueryMemory`) and answer each leg with scores, the fused result, and what the
    filters removed. ``excluded`` are entries the owners keep out of the index
    (``{"id", "tier", "text", "reason"}``), scored lexically to show what the hard filter
    removed."""

    query: str = ""
    time: str = ""
    now: datetime | None = None
    excluded: list[dict[str, str]] = []


class TurnsMined(Message, frozen=True):
    """Sent by FactActor to RecentActor when an extraction of facts over journal rows
    finished: the inclusive row ranges ``ranges`` are covered
    (:mod:`nekomem.stores.turn_coverage`)."""

    ranges: list[tuple[int, int]]


class BacklogMined(Message, frozen=True):
    """Sent by FactActor to RecentActor once the extraction of a fact-backlog batch
    finished: rows up to ``row`` are mined."""

    row: int


# -- replies -----------------------------------------------------------------------------
# What a handler answers through ``reply`` when the route reshapes it (an answer the route
# sends as it is, is a wire Struct of nekomem.wire.answers).
class EntryAnswer(msgspec.Struct):
    """EditEntry, Feedback, GetEntry: the entry in its API form (the route sends ``entry``)."""

    entry: PublicEntry


class CorrectionsAnswer(msgspec.Struct):
    """ListCorrections: the persona's contradictions waiting for a model decision, and
    whether one is with the model now."""

    total: int
    items: list[Correction]
    inflight: bool


class ExplainAnswer(msgspec.Struct):
    """ExplainQuery: the recall playground's explained recall (``nekomem.recall.explain``:
    legs, scores, the fused rows, what each filter removed), sent to the browser as it is."""

    explanation: dict[str, object]
