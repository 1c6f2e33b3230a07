"""What the recall index holds of one searchable entry, and the rules that decide it.

The owners (facts, reflections) describe their entries as
:class:`~nekomem.domain.index_entry.IndexEntry`; the index keeps each one as an
:class:`IndexedDoc` with what recall needs precomputed (the text's sha256, the event
interval as epoch seconds).
"""

from __future__ import annotations

from datetime import datetime, timezone, tzinfo

from nekomem.config.zones import display_zone
from nekomem.domain.index_entry import IndexEntry
from nekomem.domain.layers import recall_tiers
from nekomem.domain.turns import parse_iso


class IndexedDoc:
    """One indexed entry and what recall needs of it, precomputed at upsert."""

    __slots__ = ("entry", "sha", "start", "end")

    def __init__(self, entry: IndexEntry, sha: str, start: float | None, end: float | None) -> None:
        self.entry = entry
        self.sha = sha
        self.start = start
        self.end = end


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
