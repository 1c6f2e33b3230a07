"""The per-character event journal (events.ndjson) and its reconciler sentinel (events_applied.json).

An event-backed change is appended here (and fsync'd) before the view it changes is
written; the sentinel then records the last event whose effect is in the views. At
start-up the reconciler re-applies :meth:`EventJournal.unapplied`. Order is file position,
never ``ts``. Handlers are idempotent, so every doubt (missing or corrupt sentinel, an id
that is no longer in the file) resolves to "replay everything".

Line shape: ``{"event_id": uuid4 hex, "type": str, "ts": ISO 8601, "payload": {...}}``.
A payload carries the record it adds or changes (a fact, a reflection, a persona entry),
text included: the journal is the write-ahead copy a view lost in a crash is rebuilt from,
so an id alone would not do. An erasure therefore removes every event about the erased
ids once the view without them is on disk (:meth:`EventJournal.rewrite`, driven by
``stores.applied.SharedJournal.purge``); a tombstone (``*.deleted``) carries the id only.

Not thread-safe: one owning actor per character.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import msgspec

from nekomem.stores.atomic import atomic_write_json, read_json
from nekomem.stores.jsonl import NdjsonLog, require_iso

log = logging.getLogger(__name__)


class Event(msgspec.Struct, frozen=True):
    """One journaled state transition."""

    event_id: str
    type: str
    ts: str
    payload: dict[str, Any] = msgspec.field(default_factory=dict)


class AppliedSentinel(msgspec.Struct):
    """Shape of events_applied.json."""

    last_applied_event_id: str | None = None
    ts: str | None = None


_encoder = msgspec.json.Encoder()


class EventJournal:
    """Append-only journal of state transitions plus the "applied up to" sentinel.

    ``known_types`` is the registry of event types; :meth:`append` refuses anything else
    with ValueError, so a typo never reaches the disk. ``clock`` gives the ISO timestamp
    written into the sentinel (default: the current UTC time).
    """

    def __init__(
        self,
        events_path: Path,
        applied_path: Path,
        known_types: Iterable[str],
        *,
        clock: Callable[[], str] | None = None,
    ) -> None:
        self.events_path = Path(events_path)
        self.applied_path = Path(applied_path)
        self.known_types = frozenset(known_types)
        self._clock = clock or (lambda: datetime.now(timezone.utc).isoformat())
        self._log = NdjsonLog(self.events_path)

    # -- writing -----------------------------------------------------------------------

    def _build(self, type: str, payload: Mapping[str, Any], ts: str) -> tuple[Event, bytes]:
        if type not in self.known_types:
            raise ValueError(f"unknown event type {type!r}")
        if not isinstance(payload, Mapping):
            raise ValueError("event payload must be a mapping")
        event = Event(event_id=uuid.uuid4().hex, type=type, ts=require_iso(ts, "event ts"), payload=dict(payload))
        return event, _encoder.encode(event)  # TypeError for an unencodable payload

    def append(self, type: str, payload: Mapping[str, Any], ts: str) -> Event:
        """Append one event durably and return it.

        Raises ValueError (unknown type, bad ts or payload), TypeError (payload not JSON
        encodable) before anything is written, and OSError when the write or fsync fails.
        """
        event, line = self._build(type, payload, ts)
        self._log.append([line])
        return event

    def append_many(self, items: Iterable[tuple[str, Mapping[str, Any], str]]) -> list[Event]:
        """Append several ``(type, payload, ts)`` events with one write and one fsync.

        Everything is validated first: one bad item means nothing is written. Raises like
        :meth:`append`.
        """
        built = [self._build(type, payload, ts) for type, payload, ts in items]
        self._log.append([line for _event, line in built])
        return [event for event, _line in built]

    def mark_applied(self, event_id: str | None, ts: str | None = None) -> None:
        """Atomically record ``event_id`` as the last event whose effect is in the views.

        ``None`` means "nothing applied" (a full replay next time). Raises OSError.
        """
        sentinel = AppliedSentinel(last_applied_event_id=event_id, ts=ts or self._clock())
        atomic_write_json(self.applied_path, sentinel)

    # -- reading -----------------------------------------------------------------------

    def all_events(self) -> list[Event]:
        """Every readable event in file order (corrupt lines and a torn tail are skipped)."""
        return self._log.read_records(Event, what="event")

    def last_applied_id(self) -> str | None:
        """The sentinel's event id; None when missing, corrupt (moved aside) or null."""
        sentinel, _status = read_json(self.applied_path, type=AppliedSentinel, default=None)
        return sentinel.last_applied_event_id if sentinel is not None else None

    def unapplied(self) -> list[Event]:
        """The events after the sentinel, in file order.

        Every event when the sentinel is missing, corrupt, null, or names an id that is not
        in the file (a compaction or a lost line): a full replay is safe because handlers
        are idempotent.
        """
        return self._after_sentinel(self.all_events())

    def _after_sentinel(self, events: list[Event]) -> list[Event]:
        last = self.last_applied_id()
        if last is None:
            return events
        for index, event in enumerate(events):
            if event.event_id == last:
                return events[index + 1 :]
        log.warning(
            "%s: sentinel names event %s, which is not in the journal; replaying all %d events",
            self.applied_path.name,
            last,
            len(events),
        )
        return events

    # -- maintenance ---------------------------------------------------------------------

    def compact(self, keep: Callable[[Event], bool] | None = None) -> int:
        """Rewrite the journal atomically and reset the sentinel to null; return lines kept.

        Events not yet applied are always kept (dropping them would lose changes); of the
        applied ones only those for which ``keep`` is true survive (``None`` drops them
        all). Because the sentinel is reset, every kept event is replayed at the next
        reconcile, which idempotent handlers tolerate. Corrupt lines are dropped. A crash
        between the rewrite and the sentinel reset is harmless: the old sentinel id is
        either still in the file (in the same relative order) or gone (full replay).
        Raises OSError.
        """
        events = self.all_events()
        pending_ids = {event.event_id for event in self._after_sentinel(events)}
        kept = [e for e in events if e.event_id in pending_ids or (keep is not None and keep(e))]
        self._log.rewrite([_encoder.encode(e) for e in kept])
        self.mark_applied(None)
        log.info(
            "%s compacted: %d of %d events kept",
            self.events_path.name,
            len(kept),
            len(events),
        )
        return len(kept)

    def rewrite(self, events: Iterable[Event]) -> int:
        """Atomically replace the journal with ``events`` (in the order given); the
        sentinel is left alone (a mark naming a dropped event means a full replay, which
        idempotent handlers tolerate). Returns the lines written. Raises OSError."""
        lines = [_encoder.encode(e) for e in events]
        self._log.rewrite(lines)
        return len(lines)

    @property
    def line_count(self) -> int:
        """Lines in events.ndjson (a torn tail excluded)."""
        return self._log.line_count

    def oldest_ts(self) -> str | None:
        """``ts`` of the first readable event, or None for an empty journal."""
        events = self.all_events()
        return events[0].ts if events else None
