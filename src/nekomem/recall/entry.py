"""What the recall index holds of one searchable entry, and the rules that decide it.

The owners (facts, reflections) describe their entries as
:class:`~nekomem.domain.index_entry.IndexEntry`; the index keeps each one as an
:class:`IndexedDoc` with what recall needs precomputed (the text's sha256, the event
interval as epoch seconds).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from datetime import datetime, timezone, tzinfo

from nekomem.config.zones import display_zone
from nekomem.domain.index_entry import IndexEntry
from nekomem.domain.layers import recall_tiers
from nekomem.domain.turns import parse_iso


class IndexedDoc:
    """One indexed entry and what recall needs of it: its tier and event interval,
    precomputed; its text's sha256 on first use (only vectors need it).

    A document of a persisted segment is made without its entry: ``source(row)`` decodes it
    the first time :attr:`entry` is read (a query's top rows), or the owner's feed hands it
    over (:meth:`resolve`) without any decoding.
    """

    __slots__ = ("_entry", "_sha", "_source", "_row", "tier", "start", "end")

    def __init__(
        self,
        entry: IndexEntry | None,
        start: float | None,
        end: float | None,
        *,
        sha: str | None = None,
        tier: str | None = None,
        source: Callable[[int], IndexEntry] | None = None,
        row: int = -1,
    ) -> None:
        if entry is None and (source is None or tier is None):
            raise ValueError("a document without its entry needs its tier and a source")
        self._entry = entry
        self._sha = sha
        self._source = source
        self._row = row
        self.tier: str = entry.tier if entry is not None else tier  # type: ignore[assignment]
        self.start = start
        self.end = end

    @property
    def entry(self) -> IndexEntry:
        """The entry (decoded from its source on first use). Raises what the source raises."""
        if self._entry is None:
            assert self._source is not None
            self._entry = self._source(self._row)
            self._source = None
        return self._entry

    @property
    def resolved(self) -> bool:
        """True once the entry is held (given, decoded or handed over)."""
        return self._entry is not None

    def resolve(self, entry: IndexEntry) -> None:
        """Hold ``entry`` (the owner's copy of what the source would decode)."""
        self._entry, self._source = entry, None

    @property
    def sha(self) -> str:
        """sha256 hex digest of the entry's UTF-8 text (the cache key of its vector)."""
        if self._sha is None:
            self._sha = hashlib.sha256(self.entry.text.encode("utf-8")).hexdigest()
        return self._sha


def epoch_seconds(value: object, tz: tzinfo) -> float | None:
    """An ISO 8601 timestamp as epoch seconds (a naive one is read in ``tz``); None if unusable."""
    parsed = parse_iso(value, tz)
    if parsed is None:
        return None
    try:
        return parsed.timestamp()
    except (OverflowError, OSError, ValueError):
        return None


def event_interval(entry: IndexEntry, tz: tzinfo) -> tuple[float | None, float | None]:
    """The entry's event as epoch ``(start, end)``: anchor = event end, else event start,
    else created_at; the interval is [start or anchor, end or anchor], swapped if reversed.
    ``(None, None)`` when no timestamp parses."""
    start = epoch_seconds(entry.event_start_at, tz)
    end = epoch_seconds(entry.event_end_at, tz)
    anchor = end if end is not None else start if start is not None else epoch_seconds(entry.created_at, tz)
    if anchor is None:
        return None, None
    s = start if start is not None else anchor
    e = end if end is not None else anchor
    return (e, s) if e < s else (s, e)


def indexable(entry: IndexEntry) -> bool:
    """The shared hard filter as the index applies it (the owner's verdict first)."""
    return (
        entry.searchable
        and entry.tier in recall_tiers()
        and isinstance(entry.text, str)
        and bool(entry.text.strip())
        and not (entry.score < 0)
    )


def display_tz(name: str) -> tzinfo:
    """The named IANA zone (:func:`nekomem.config.zones.display_zone`; ValueError for an
    unknown name, which load_settings refuses); the machine's local zone when it is empty."""
    zone = display_zone(name)
    if zone is not None:
        return zone
    local = datetime.now().astimezone().tzinfo
    return local if local is not None else timezone.utc
