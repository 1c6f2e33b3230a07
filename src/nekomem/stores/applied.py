"""One character's event journal shared by the actors that own event-backed layers.

Each owner (facts, reflections, persona) applies its own event types and writes its views
in batches, so each has its own "applied up to" mark. ``events_applied.json`` keeps them
all: ``{"last_applied_event_id": ..., "ts": ..., "owners": {"facts": id, ...}}``, where
``last_applied_event_id`` is the mark that lies earliest in the journal (everything before
it is applied by every owner), kept for readers of the reference's format.
"""

from __future__ import annotations

import threading
from collections.abc import Collection, Iterable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from nekomem.stores.atomic import atomic_write_json, read_json
from nekomem.stores.erasure import mentions
from nekomem.stores.journal import Event, EventJournal


class SharedJournal:
    """Appends are serialised by an internal lock (this is file plumbing, not domain state:
    each event's effect is applied only by the actor that owns its type)."""

    def __init__(self, events_path: Path, applied_path: Path, owners: Mapping[str, str]) -> None:
        self.owners = dict(owners)  # event type -> owner
        self.journal = EventJournal(events_path, applied_path, known_types=self.owners)
        self.applied_path = Path(applied_path)
        self._lock = threading.Lock()
        raw, _ = read_json(self.applied_path, default={})
        raw = raw if isinstance(raw, dict) else {}
        marks = raw.get("owners")
        self._marks: dict[str, str | None] = dict(marks) if isinstance(marks, dict) else {}
        compacted = raw.get("compacted_at")
        # When the journal last dropped applied events: a view lost after that cannot be
        # rebuilt completely from the journal.
        self.compacted_at: str | None = compacted if isinstance(compacted, str) else None
        legacy = raw.get("last_applied_event_id")
        if not self._marks and isinstance(legacy, str):
            # A single reference-style sentinel covers every owner.
            self._marks = {owner: legacy for owner in set(self.owners.values())}

    def append(self, type: str, payload: Mapping[str, Any], ts: str) -> Event:
        """Append one event durably (fsync). Raises ValueError for an unknown type and
        OSError when the journal cannot be written."""
        with self._lock:
            return self.journal.append(type, payload, ts)

    def append_many(self, items: Iterable[tuple[str, Mapping[str, Any], str]]) -> list[Event]:
        with self._lock:
            return self.journal.append_many(items)

    def unapplied_for(self, owner: str) -> list[Event]:
        """Events of ``owner``'s types after its mark, in journal order (all of them when
        the mark is missing or no longer in the journal)."""
        with self._lock:
            events = self.journal.all_events()
            mark = self._marks.get(owner)
        start = 0
        if mark is not None:
            for index, event in enumerate(events):
                if event.event_id == mark:
                    start = index + 1
                    break
        return [e for e in events[start:] if self.owners.get(e.type) == owner]

    def all_for(self, owner: str) -> list[Event]:
        """Every event of ``owner``'s types still in the journal, in journal order."""
        with self._lock:
            events = self.journal.all_events()
        return [e for e in events if self.owners.get(e.type) == owner]

    def has_unapplied(self) -> bool:
        return any(self.unapplied_for(owner) for owner in set(self.owners.values()))

    def mark(self, owner: str, event_id: str) -> None:
        """Record that ``owner``'s views include every effect up to ``event_id``."""
        with self._lock:
            self._marks[owner] = event_id
            atomic_write_json(
                self.applied_path,
                {
                    "last_applied_event_id": self._earliest_mark(),
                    "ts": datetime.now(timezone.utc).isoformat(),
                    "owners": dict(self._marks),
                    "compacted_at": self.compacted_at,
                },
            )

    def _earliest_mark(self) -> str | None:
        owners = set(self.owners.values())
        if any(self._marks.get(o) is None for o in owners):
            return None
        marks = {self._marks[o] for o in owners}
        if len(marks) == 1:
            return next(iter(marks))
        for event in self.journal.all_events():
            if event.event_id in marks:
                return event.event_id
        return None

    @property
    def line_count(self) -> int:
        return self.journal.line_count

    def compact_if_applied(self, threshold: int) -> int:
        """Rewrite the journal without its applied events once it has ``threshold`` lines
        and every owner's mark is its last event; returns the lines removed."""
        with self._lock:
            if self.journal.line_count < threshold:
                return 0
            events = self.journal.all_events()
            if not events:
                return 0
            last_by_owner: dict[str, str] = {}
            for event in events:
                last_by_owner[self.owners.get(event.type, "")] = event.event_id
            if any(self._marks.get(owner) != eid for owner, eid in last_by_owner.items()):
                return 0
            before = len(events)
            # Every owner has applied everything: say so in the reference-style sentinel
            # the journal's own compaction reads, so it keeps nothing.
            atomic_write_json(
                self.applied_path, {"last_applied_event_id": events[-1].event_id, "ts": datetime.now(timezone.utc).isoformat()}
            )
            for owner in list(self._marks):
                self._marks[owner] = None
            self.journal.compact(lambda e: False)
            self.compacted_at = datetime.now(timezone.utc).isoformat()
            atomic_write_json(
                self.applied_path,
                {"last_applied_event_id": None, "ts": self.compacted_at, "owners": {}, "compacted_at": self.compacted_at},
            )
            return before

    def purge(self, owner: str, ids: Collection[str], texts: Collection[str]) -> int:
        """Rewrite the journal without the events of ``owner`` that name one of ``ids``
        (its tombstones, ``*.deleted``, which carry only the id, stay) and without any
        event whose payload holds one of ``texts``; returns the events dropped.

        Call once ``owner``'s views hold the erasure (flushed): the dropped events are then
        not needed to rebuild them. Raises OSError."""
        wanted = set(ids)
        with self._lock:
            events = self.journal.all_events()
            kept = [e for e in events if not _about(e, self.owners.get(e.type) == owner, wanted, texts)]
            if len(kept) == len(events):
                return 0
            self.journal.rewrite(kept)
            return len(events) - len(kept)


def _names_id(value: object, ids: set[str]) -> bool:
    if isinstance(value, str):
        return value in ids
    if isinstance(value, dict):
        return any(_names_id(v, ids) for v in value.values())
    if isinstance(value, list):
        return any(_names_id(v, ids) for v in value)
    return False


def _about(event: Event, own: bool, ids: set[str], texts: Collection[str]) -> bool:
    if texts and mentions(event.payload, texts):
        return True
    return own and not event.type.endswith(".deleted") and _names_id(event.payload, ids)
