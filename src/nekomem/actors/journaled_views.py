"""The journal-backed views of an event-sourced layer (facts, reflections, persona).

Every change is first an event appended (fsync) to the character's journal, then applied
to the in-memory state; the JSON views are rewritten from that state in batches (after
``view_flush_changes`` changes or ``view_flush_seconds``), and the owner's applied mark
moves only after its views are on disk. So a change is durable as soon as its event is,
one change costs one journal append whatever the size of the store, and a crash between
journal and view is repaired at the next load by re-applying the events after the mark.
The flush cadence is real time, not the injectable clock: it is I/O batching, not domain
time.

A layer owns one :class:`JournaledViews` and gives it a :class:`ViewState`: the three
operations that differ per layer (read the views, write them, apply one event). An event
reaches the layer typed: the payload Struct its declaration lists for its type
(:func:`nekomem.domain.layers.decode_event`), so a layer dispatches on the class.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Protocol

import msgspec

from nekomem.actors.messages import ScrubTexts
from nekomem.actors.ports import LayerPorts
from nekomem.domain.layers import Address, JournalEvent, decode_event
from nekomem.importer import neko_folder
from nekomem.runtime.reply import ActorFailure, Reply
from nekomem.stores.atomic import read_json
from nekomem.stores.erasure import drop_from_shards
from nekomem.stores.faults import classify
from nekomem.stores.journal import Event


class ViewState(Protocol):
    """The per-layer half of a journaled layer."""

    def load_views(self) -> None:
        """Read this layer's views from disk into memory."""

    def write_views(self) -> None:
        """Write this layer's views from memory (atomically). Raises OSError."""

    def apply_event(self, event: JournalEvent) -> None:
        """Apply one of this owner's events (its typed payload) to the in-memory state,
        idempotently: applying an event twice has the effect of once."""


class JournaledViews:
    """Journal first, views in batches, the applied mark after the views (see the module)."""

    def __init__(self, ports: LayerPorts, owner: str, state: ViewState) -> None:
        self.ports = ports
        self.owner = owner
        self.state = state
        self.dirty = 0
        self._last_event: str | None = None
        self._last_flush = time.monotonic()
        self._flush_gap = 0.0
        self._corrupt_views: list[str] = []
        self._views_behind = False

    @property
    def views_layer(self) -> str:
        """The /health key of a view rewrite that failed after its changes were journaled."""
        return f"{self.ports.child}_views"

    # -- loading ---------------------------------------------------------------------
    def read_view(self, path: Path, default: object) -> object:
        """A view's content (see :func:`read_json`); a corrupt one (moved aside) is noted,
        so that :meth:`load` rebuilds it from the whole journal."""
        value, status = read_json(path, default=default)
        if status == "corrupt":
            self.note_corrupt(path)
        return value

    def note_corrupt(self, path: Path) -> None:
        """Record that the view ``path`` was undecodable (moved aside): :meth:`load`
        rebuilds it from the whole journal."""
        self._corrupt_views.append(path.name)

    def changed(self, count: int = 1) -> None:
        """Count ``count`` in-memory changes that the views must be rewritten for (a view
        read with entries set aside, say), without an event."""
        self.dirty += count

    def load(self) -> None:
        """Read the views, then re-apply this owner's events the views do not hold yet
        (every one of them when a view was corrupt), and write the views once if any was
        re-applied. Raises OSError."""
        self.dirty = 0
        self._last_event = None
        self._last_flush = time.monotonic()
        self._flush_gap = 0.0
        self._corrupt_views = []
        self.state.load_views()
        if self._corrupt_views:
            # Every event of this owner still in the journal, not just those after the
            # applied mark: handlers are idempotent, so replaying what the lost view
            # already held is safe.
            replay = self.ports.journal.all_for(self.owner)
            self._report_rebuild(len(replay))
        else:
            replay = self.ports.journal.unapplied_for(self.owner)
        for event in replay:
            self.state.apply_event(typed(event))
        if replay:
            self.ports.log.info("re-applied %d journaled events", len(replay))
            self._last_event = replay[-1].event_id
            self.dirty += len(replay)
            self.flush()

    def _report_rebuild(self, events: int) -> None:
        compacted_at = self.ports.journal.compacted_at
        views = ", ".join(self._corrupt_views)
        if compacted_at is None:
            self.ports.log.warning("rebuilt corrupt view(s) %s from %d journaled events", views, events)
            return
        self.ports.log.warning("corrupt view(s) %s rebuilt only from events since the journal compaction", views)
        storage = self.ports.storage
        if storage is not None:
            for view in self._corrupt_views:
                storage.unrebuilt(
                    self.ports.character,
                    view,
                    f"rebuilt from the journal since its compaction at {compacted_at}; older entries of this view are lost "
                    "(the corrupt file was kept beside it as .corrupt-*)",
                )

    # -- changes ---------------------------------------------------------------------
    def record(self, type: str, payload: Mapping[str, object]) -> Event:
        """Journal one transition, apply it, and schedule the view write. Raises OSError
        (nothing is applied then)."""
        event = self.ports.journal.append(type, payload, self.ports.now_iso())
        self.state.apply_event(typed(event))
        self._note(event)
        return event

    def record_event(self, event: JournalEvent) -> Event:
        """:meth:`record` a typed event (its payload is the Struct's fields). Raises OSError."""
        payload: dict[str, object] = msgspec.to_builtins(event)
        return self.record(event.type, payload)

    def record_many(self, items: Iterable[tuple[str, Mapping[str, object]]]) -> list[Event]:
        """Journal several transitions in one append (one fsync), apply them in order and
        schedule the view write. Raises OSError (nothing is applied then)."""
        ts = self.ports.now_iso()
        batch = [(t, p, ts) for t, p in items]
        if not batch:
            return []
        events = self.ports.journal.append_many(batch)
        for event in events:
            self.state.apply_event(typed(event))
        self.dirty += len(events) - 1
        self._note(events[-1])
        return events

    def erase(
        self,
        ids: list[str],
        texts: list[str],
        archive_dir: Path | None,
        reply: Reply | None,
        answer: object,
        relay: ScrubTexts | None = None,
    ) -> None:
        """Complete a forget whose tombstone is journaled: the views without ``ids`` go to
        disk now, then the journal drops every event about them (and every event holding
        one of ``texts``), the archive shards in ``archive_dir`` drop them, and the layers
        that scrub an entry erasure's text (the persona's contradiction queue, declared
        ``scrubs``) and the outbox drop the texts, and the outbox answers ``reply`` with
        ``answer``. In that order, so a crash at any step leaves the erasure applied (never a
        journal that would bring an erased entry back). ``relay``: this owner is scrubbing
        another layer's erasure, which goes on from here. Raises OSError."""
        self.dirty = max(self.dirty, 1)
        self.flush()
        dropped = self.ports.journal.purge(self.owner, ids, texts)
        shards = drop_from_shards(archive_dir, ids) if archive_dir is not None else 0
        if shards:
            self._mirror()  # the reference's copy of the archive drops them too
        self.ports.log.info("erased %d entries: %d journal events and %d archived copies dropped", len(ids), dropped, shards)
        # The persona's contradiction queue may quote the text (a reflection's proposal):
        # the layers that keep such copies scrub them in turn; the outbox answers.
        scrub = relay or ScrubTexts(texts=texts, origin=Address(self.owner), kind="entries", reply_value=answer, reply=reply)
        self.ports.send(scrub.onward(Address(self.owner)), scrub)

    def _note(self, event: Event) -> None:
        self.dirty += 1
        self._last_event = event.event_id
        self.maybe_flush()

    # -- view writes -----------------------------------------------------------------
    def maybe_flush(self) -> None:
        """Rewrite the views when enough changes or time have gathered. A storage fault
        here is reported and retried at the next due time: the journal holds the changes."""
        rt = self.ports.settings.runtime
        if not self.dirty:
            return
        since = time.monotonic() - self._last_flush
        # A big view costs a lot to rewrite: after a flush that took T seconds, wait at
        # least T / view_flush_max_duty, so rewrites never take more than that share of
        # the actor's time, however large the store (the journal keeps changes durable).
        if since < self._flush_gap:
            return
        if self.dirty >= rt.view_flush_changes or since >= rt.view_flush_seconds:
            try:
                self.flush()
            except Exception as exc:
                fault = classify(exc)
                if fault is None:
                    raise
                # Every change is already durable in the journal (and applied in memory):
                # the message that caused it succeeded. Only the view is behind; it is
                # rewritten at the next due time, and /health shows the fault until then.
                self._last_flush = time.monotonic()
                self.ports.log.warning("%s: views not rewritten (%s); the journal holds the changes", self.ports.child, fault.code)
                storage = self.ports.storage
                if storage is not None:
                    storage.report(self.ports.character, self.views_layer, fault)
                self._views_behind = True

    def flush(self) -> None:
        """Write the views now if any change waits, then move the applied mark and compact
        the journal when it allows. Raises OSError."""
        if not self.dirty:
            return
        started = time.monotonic()
        self.state.write_views()
        self._mirror()
        self._flush_gap = (time.monotonic() - started) / self.ports.settings.runtime.view_flush_max_duty
        if self._last_event is not None:
            self.ports.journal.mark(self.owner, self._last_event)
        self.dirty = 0
        self._last_flush = time.monotonic()
        if self._views_behind:
            self._views_behind = False
            storage = self.ports.storage
            if storage is not None:
                storage.clear(self.ports.character, self.views_layer)
        self.ports.journal.compact_if_applied(self.ports.settings.runtime.events_compact_lines)

    def _mirror(self) -> None:
        """In a N.E.K.O. memory folder: the reference's copies of this owner's views, in
        its format (see :mod:`nekomem.importer.neko_folder`). Raises OSError."""
        files = neko_folder.OWNER_FILES.get(self.owner)
        if files and self.ports.paths.neko_folder:
            neko_folder.mirror_views(self.ports.paths, self.ports.settings.importer.import_source_timezone, files)

    def real_due_at(self) -> float | None:
        """The next view rewrite, when changes wait (see :meth:`maybe_flush`)."""
        if not self.dirty:
            return None
        return self._last_flush + max(self._flush_gap, self.ports.settings.runtime.view_flush_seconds)


def typed(event: Event) -> JournalEvent:
    """The typed payload of a journaled event, as its layer's declaration lists it. Raises
    msgspec.ValidationError for a payload that is not its type's shape."""
    return decode_event(event.type, event.payload)


def edited_text(changes: Mapping[str, object]) -> str:
    """The ``text`` of an API edit, stripped. Raises ActorFailure 422 when it is not a
    non-empty string."""
    text = changes.get("text")
    if not isinstance(text, str) or not text.strip():
        raise ActorFailure("bad_text", "text must be a non-empty string", 422)
    return text.strip()
