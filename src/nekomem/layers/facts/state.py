"""The fact store: facts.json and facts_archive.json in memory, the journaled changes to
them (through :class:`~nekomem.actors.journaled_views.JournaledViews`), the private
dedup index and the recall index feed. The other parts of the fact layer (extraction,
self-disclosure, scoped facts, duplicate judgments, synthesis) change facts only through
this object.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta

import msgspec

from nekomem.actors.journaled_views import JournaledViews
from nekomem.actors.messages import ReclaimParked
from nekomem.actors.ports import LayerPorts
from nekomem.domain import facts as fl
from nekomem.domain.dedup_index import DedupIndex
from nekomem.domain.index_entry import IndexEntry
from nekomem.domain.layers import FACTS, OUTBOX, JournalEvent
from nekomem.domain.neko_fields import retired
from nekomem.domain.opaque import clip_opaque
from nekomem.domain.records import Fact
from nekomem.domain.subjects import is_private
from nekomem.layers.facts.declaration import FactAbsorbed, FactAdded, FactArchived, FactDeleted, FactUpdated
from nekomem.stores.atomic import atomic_write_json, file_identity, read_records
from nekomem.stores.journal import Event

log = logging.getLogger(__name__)


def fact_from(obj: object, max_depth: int = 8, max_bytes: int = 4096) -> Fact:
    """A Fact from its stored form. An opaque field over the bounds (a record poisoned
    before the bounds existed) is dropped, so one record cannot break every read. Raises
    msgspec.ValidationError when ``obj`` is no fact."""
    return clipped_fact(msgspec.convert(obj, Fact, strict=False), max_depth, max_bytes)


def clipped_fact(fact: Fact, max_depth: int = 8, max_bytes: int = 4096) -> Fact:
    """``fact`` with an opaque field over the bounds dropped (see :func:`fact_from`)."""
    if fact.source_ref is None and fact.event_when_raw is None:
        return fact
    source_ref, clipped_source = clip_opaque(fact.source_ref, max_depth=max_depth, max_bytes=max_bytes)
    when_raw, clipped_when = clip_opaque(fact.event_when_raw, max_depth=max_depth, max_bytes=max_bytes)
    if clipped_source or clipped_when:
        log.warning("dropped an oversized opaque field of fact %s", fact.id)
        fact = msgspec.structs.replace(fact, source_ref=source_ref, event_when_raw=when_raw)
    return fact


def fact_index_entry(fact: Fact, tier: str) -> IndexEntry:
    """The recall index entry of ``fact`` in ``tier`` (``fact`` or ``fact_archive``)."""
    return IndexEntry(
        id=fact.id,
        tier=tier,
        text=fact.text,
        entity=fact.entity,
        created_at=fact.created_at or None,
        event_start_at=fact.event_start_at,
        event_end_at=fact.event_end_at,
        importance=fact.importance,
        # A fact the reference retired (superseded, lost an arbitration, stale subject) is
        # kept but never recalled.
        searchable=bool(fact.text.strip()) and not retired(fact.source_ref),
        vector=fact.embedding if isinstance(fact.embedding, str) else None,
        vector_model=fact.embedding_model_id,
        text_sha256=fact.embedding_text_sha256,
        subject_kind=fact.subject_kind,
        subject_id=fact.subject_id,
        scope=fact.scope,
        source_from=_span_end(fact.source_ref, "from"),
        source_to=_span_end(fact.source_ref, "to"),
    )


def _span_end(source_ref: object, key: str) -> str | None:
    """One end of the turn span a fact extracted from the journal names in its source_ref
    (``{"kind": "turns", "from", "to"}``); None for any other source."""
    if not isinstance(source_ref, dict) or source_ref.get("kind") != "turns":
        return None
    value = source_ref.get(key)
    return value if isinstance(value, str) and value else None


class FactStore:
    """Facts in memory, their journal and views, their dedup index and recall entries
    (the :class:`~nekomem.actors.journaled_views.ViewState` of the fact layer)."""

    def __init__(self, ports: LayerPorts) -> None:
        self.ports = ports
        self.s = ports.settings.longterm
        self.views = JournaledViews(ports, FACTS, self)
        self.facts: dict[str, Fact] = {}
        self.archive: dict[str, Fact] = {}
        self._dedup: DedupIndex | None = None
        # New facts to check for paraphrases once RecallActor has computed their vectors.
        self.awaiting_vectors: set[str] = set()
        self.last_archive_at: datetime | None = None

    # -- the views (ViewState) -------------------------------------------------------
    def load_views(self) -> None:
        """Read facts.json and facts_archive.json (records that do not decode are kept
        aside and the view is rewritten once without them). Raises OSError."""
        self.facts = {}
        self.archive = {}
        for path, target in ((self.ports.paths.facts, self.facts), (self.ports.paths.facts_archive, self.archive)):
            facts, rejected = read_records(path, self.fact_from, "facts", on_corrupt=self.views.note_corrupt, fast=(Fact, self.clipped))
            for fact in facts:
                target[fact.id] = fact
            self.views.changed(rejected)  # rewrite the view once, without what was kept aside
        self._dedup = None
        self.awaiting_vectors = set()
        self.last_archive_at = None

    def clipped(self, fact: Fact) -> Fact:
        """``fact`` within the server's opaque-field bounds."""
        server = self.ports.settings.server
        return clipped_fact(fact, server.opaque_max_depth, server.opaque_max_bytes)

    def fact_from(self, obj: object) -> Fact:
        """A Fact from its stored form, within the server's opaque-field bounds."""
        server = self.ports.settings.server
        return fact_from(obj, server.opaque_max_depth, server.opaque_max_bytes)

    def after_load(self) -> None:
        """Once the views are loaded and the journal replayed: reclaim the records parked
        by a lost instance, feed recall (the dedup index is built on first use)."""
        # Records parked in a previous instance's batch were lost with it.
        self.ports.send(OUTBOX, ReclaimParked(child=FACTS))
        self.send_index()

    @property
    def dedup(self) -> DedupIndex:
        """The dedup index of the stored facts, built on first use: a wake that only reads
        (the first /query_memory or /new_dialog of a long memory) does not pay for it, the
        first write that dedups does (its keys are most of a wake's CPU at 50,000 facts).
        Built from the facts as they are then, so the changes applied before it are in it."""
        if self._dedup is None:
            index = DedupIndex(self.s.fact_near_dup_jaccard_threshold, self.s.fact_near_dup_max_candidates)
            # Only the private corpus dedups private extraction: a group's fact must not hide
            # the owner's own (scoped facts dedup within their subject, see scoped_facts).
            for fact in list(self.facts.values()) + list(self.archive.values()):
                if is_private(fact):
                    index.add(fact)
            self._dedup = index
        return self._dedup

    def write_views(self) -> None:
        """Write both views atomically. Raises OSError."""
        atomic_write_json(self.ports.paths.facts, list(self.facts.values()))
        atomic_write_json(self.ports.paths.facts_archive, list(self.archive.values()))

    def apply_event(self, event: JournalEvent) -> None:
        """Apply one ``fact.*`` event (idempotent)."""
        match event:
            case FactAdded(fact=fact) | FactUpdated(fact=fact):
                fact = self.clipped(fact)
                if isinstance(event, FactAdded) and fact.id in self.archive:
                    return
                self.facts[fact.id] = fact
            case FactAbsorbed(ids=ids):
                for fid in ids:
                    absorbed = self.facts.get(fid)
                    if absorbed is not None and not absorbed.absorbed:
                        self.facts[fid] = msgspec.structs.replace(absorbed, absorbed=True)
            case FactArchived(ids=ids):
                for fid in ids:
                    archived = self.facts.pop(fid, None)
                    if archived is not None:
                        self.archive[fid] = archived
            case FactDeleted(id=deleted):
                self.facts.pop(deleted, None)
                self.archive.pop(deleted, None)

    # -- changes ---------------------------------------------------------------------
    def record(self, type: str, payload: Mapping[str, object]) -> Event:
        """Journal one change and apply it (see JournaledViews.record). Raises OSError."""
        return self.views.record(type, payload)

    def record_many(self, items: Iterable[tuple[str, Mapping[str, object]]]) -> list[Event]:
        """Journal several changes in one append and apply them. Raises OSError."""
        return self.views.record_many(items)

    def add_facts(self, new: list[Fact]) -> tuple[list[Fact], int]:
        """Dedup ``new`` against the store and journal what is left; returns (added,
        skipped). Raises OSError (nothing is added then)."""
        outcome = self.dedup.dedup(new)
        items: list[tuple[str, Mapping[str, object]]] = [("fact.added", {"fact": msgspec.to_builtins(f)}) for f in outcome.accepted]
        items += [("fact.updated", {"fact": msgspec.to_builtins(f)}) for f in outcome.upgraded]
        self.record_many(items)
        changed = outcome.accepted + outcome.upgraded
        embeddings = self.ports.embeddings
        if embeddings is not None and embeddings.state != "disabled":
            # Checked for paraphrases once RecallActor has computed their vectors.
            self.awaiting_vectors.update(f.id for f in outcome.accepted)
        if changed:
            self.ports.index_upsert([fact_index_entry(self.facts[f.id], "fact") for f in changed if f.id in self.facts])
        skipped = len(outcome.skipped_exact) + len(outcome.skipped_near)
        if outcome.accepted:
            self.ports.log.info("stored %d new facts (%d duplicates skipped)", len(outcome.accepted), skipped)
        return outcome.accepted, skipped

    def cache_vectors(self, vectors: Mapping[str, tuple[str, str, str]]) -> None:
        """Store the vectors RecallActor computed on the facts whose text they are of
        (id -> (encoded vector, model id, text sha256)). Vectors are a cache: written at
        the next view write, not journaled."""
        for fid, (vector, model, sha) in vectors.items():
            for store in (self.facts, self.archive):
                fact = store.get(fid)
                if fact is not None and hashlib.sha256(fact.text.encode()).hexdigest() == sha:
                    store[fid] = msgspec.structs.replace(fact, embedding=vector, embedding_model_id=model, embedding_text_sha256=sha)
        if vectors and not self.views.dirty:
            self.views.changed()

    def send_index(self) -> None:
        """Send recall the complete set of fact entries (replacing what it holds)."""
        entries = [fact_index_entry(f, "fact") for f in self.facts.values()]
        entries += [fact_index_entry(f, "fact_archive") for f in self.archive.values()]
        # The views' identities when they hold exactly these facts: recall then takes the
        # entries onto the segment it loaded without re-indexing them.
        views = None
        if not self.views.dirty:
            views = [
                None if i is None else list(i)
                for i in (file_identity(self.ports.paths.facts), file_identity(self.ports.paths.facts_archive))
            ]
        self.ports.index_upsert(entries, replace_tier="fact", views=views)

    # -- the archive move ------------------------------------------------------------
    def archive_due(self, monotonic: float, now: datetime) -> float:
        """Monotonic time of the next archive check (at once before the first)."""
        if self.last_archive_at is None:
            return monotonic
        return monotonic + (self.last_archive_at + timedelta(hours=self.s.fact_archive_cooldown_hours) - now).total_seconds()

    def maybe_archive(self, now: datetime) -> None:
        """Move the facts due for the archive there (at most once per cooldown). Raises
        OSError."""
        split = fl.archive_split(list(self.facts.values()), now, self.last_archive_at, self.s)
        if split is not None:
            self.last_archive_at = now
            _kept, archived = split
            if archived:
                ids = [f.id for f in archived]
                self.record("fact.archived", {"ids": ids})
                self.ports.index_upsert([fact_index_entry(self.archive[i], "fact_archive") for i in ids])
