"""The fact store: facts.json and facts_archive.json in memory, the journaled changes to
them (through :class:`~nekomem.actors.journaled_views.JournaledViews`), the private
dedup index and the recall index feed. The other parts of the fact layer (extraction,
self-disclosure, scoped facts, duplicate judgments, synthesis) change facts only through
this object.

The facts are read on first use, not at the layer's start: a wake whose first messages
only read recall (answered from the facts' recall segment, see
:mod:`nekomem.layers.recall.persist`) never decodes facts.json. The one gate is
:meth:`FactStore.require`: ``facts``, ``archive``, ``dedup``, ``record`` and
``record_many`` pass through it, so any part that reads or changes a fact loads the
views first (and feeds recall, as a load at start did).
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta

import msgspec

from nekomem.actors.journaled_views import JournaledViews
from nekomem.actors.layer import DeferredLoadFailed
from nekomem.actors.ports import LayerPorts
from nekomem.domain import facts as fl
from nekomem.domain.dedup_index import DedupIndex
from nekomem.domain.index_entry import IndexEntry
from nekomem.domain.layers import FACTS, JournalEvent
from nekomem.domain.neko_fields import retired
from nekomem.domain.opaque import clip_opaque
from nekomem.domain.records import Fact
from nekomem.domain.subjects import is_private
from nekomem.layers.facts.declaration import FactAbsorbed, FactAdded, FactArchived, FactDeleted, FactUpdated
from nekomem.stores.atomic import atomic_write_json, file_identity, read_records
from nekomem.stores.faults import classify
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
    (the :class:`~nekomem.actors.journaled_views.ViewState` of the fact layer), read on
    first use (see the module)."""

    def __init__(self, ports: LayerPorts) -> None:
        self.ports = ports
        self.s = ports.settings.longterm
        self.views = JournaledViews(ports, FACTS, self)
        self._facts: dict[str, Fact] = {}
        self._archive: dict[str, Fact] = {}
        self.loaded = False
        self.loads = 0  # the views read (an honest count for tests and logs)
        self._dedup: DedupIndex | None = None
        # New facts to check for paraphrases once RecallActor has computed their vectors.
        self.awaiting_vectors: set[str] = set()
        self.last_archive_at: datetime | None = None

    # -- the gate: the views are read by the first use -------------------------------
    def unload(self) -> None:
        """Forget the facts in memory: the next use reads the views again (a layer load)."""
        self.loaded = False
        self._facts = {}
        self._archive = {}
        self._dedup = None
        self.awaiting_vectors = set()
        self.last_archive_at = None
        self.views.dirty = 0

    def require(self) -> bool:
        """Read the views if they are not in memory yet: the views are read, the journal's
        events they lack re-applied (see JournaledViews.load), and recall is sent the
        complete fact set. True when this call loaded them. Raises OSError for a storage
        fault, DeferredLoadFailed for views that cannot be read otherwise (the actor then
        crashes as a load at start does, so its supervisor restarts it)."""
        if self.loaded:
            return False
        self.loaded = True  # the replay below reads self._facts, not this gate
        started = time.perf_counter()
        try:
            self.views.load()
        except Exception as exc:
            self.unload()
            if classify(exc) is None:
                raise DeferredLoadFailed(exc) from exc
            raise
        self.loads += 1
        self.ports.log.info(
            "facts read: %d active, %d archived in %.1f ms", len(self._facts), len(self._archive), (time.perf_counter() - started) * 1000
        )
        self.send_index()
        return True

    @property
    def facts(self) -> dict[str, Fact]:
        """The active facts by id (read from the views on first use)."""
        self.require()
        return self._facts

    @property
    def archive(self) -> dict[str, Fact]:
        """The archived facts by id (read from the views on first use)."""
        self.require()
        return self._archive

    # -- the views (ViewState) -------------------------------------------------------
    def load_views(self) -> None:
        """Read facts.json and facts_archive.json (records that do not decode are kept
        aside and the view is rewritten once without them). Raises OSError."""
        self._facts = {}
        self._archive = {}
        for path, target in ((self.ports.paths.facts, self._facts), (self.ports.paths.facts_archive, self._archive)):
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
            for fact in list(self.facts.values()) + list(self._archive.values()):
                if is_private(fact):
                    index.add(fact)
            self._dedup = index
        return self._dedup

    def write_views(self) -> None:
        """Write both views atomically. Raises OSError."""
        atomic_write_json(self.ports.paths.facts, list(self._facts.values()))
        atomic_write_json(self.ports.paths.facts_archive, list(self._archive.values()))

    def apply_event(self, event: JournalEvent) -> None:
        """Apply one ``fact.*`` event (idempotent; the views are in memory: a replay or a
        :meth:`record`)."""
        match event:
            case FactAdded(fact=fact) | FactUpdated(fact=fact):
                fact = self.clipped(fact)
                if isinstance(event, FactAdded) and fact.id in self._archive:
                    return
                self._facts[fact.id] = fact
            case FactAbsorbed(ids=ids):
                for fid in ids:
                    absorbed = self._facts.get(fid)
                    if absorbed is not None and not absorbed.absorbed:
                        self._facts[fid] = msgspec.structs.replace(absorbed, absorbed=True)
            case FactArchived(ids=ids):
                for fid in ids:
                    archived = self._facts.pop(fid, None)
                    if archived is not None:
                        self._archive[fid] = archived
            case FactDeleted(id=deleted):
                self._facts.pop(deleted, None)
                self._archive.pop(deleted, None)

    # -- changes ---------------------------------------------------------------------
    def record(self, type: str, payload: Mapping[str, object]) -> Event:
        """Journal one change and apply it (see JournaledViews.record), the views read
        first. Raises OSError."""
        self.require()
        return self.views.record(type, payload)

    def record_many(self, items: Iterable[tuple[str, Mapping[str, object]]]) -> list[Event]:
        """Journal several changes in one append and apply them, the views read first.
        Raises OSError."""
        self.require()
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
        entries += [fact_index_entry(f, "fact_archive") for f in self._archive.values()]
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
    def archive_due(self, monotonic: float, now: datetime) -> float | None:
        """Monotonic time of the next archive check (at once before the first); None while
        the facts are not read: the check waits for them (the first write, listing or
        synthesis pass reads them), a timer never reads them for it."""
        if not self.loaded:
            return None
        if self.last_archive_at is None:
            return monotonic
        return monotonic + (self.last_archive_at + timedelta(hours=self.s.fact_archive_cooldown_hours) - now).total_seconds()

    def maybe_archive(self, now: datetime) -> None:
        """Move the facts due for the archive there (at most once per cooldown). Raises
        OSError."""
        if not self.loaded:
            return
        split = fl.archive_split(list(self.facts.values()), now, self.last_archive_at, self.s)
        if split is not None:
            self.last_archive_at = now
            _kept, archived = split
            if archived:
                ids = [f.id for f in archived]
                self.record("fact.archived", {"ids": ids})
                self.ports.index_upsert([fact_index_entry(self.archive[i], "fact_archive") for i in ids])
