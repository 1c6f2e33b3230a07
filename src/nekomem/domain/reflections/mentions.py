"""Mention suppression (shared with persona entries): an entry the character keeps
bringing up is suppressed for a cooldown.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import TypeVar

import msgspec

from nekomem.config.longterm import LongTermSettings
from nekomem.domain.facts import text_keywords
from nekomem.domain.records import (
    Reflection,
    TrackedFields,
    parse_time,
    to_iso,
)

T = TypeVar("T", bound=TrackedFields)


def mention_keywords(text: str, stop_names: Iterable[str] = ()) -> set[str]:
    """Keywords used to detect that a reply mentions an entry (no single CJK characters)."""
    return text_keywords(text, stop_names, min_cjk_len=2)


def is_mentioned(reply: str, entry_text: str, stop_names: Iterable[str] = ()) -> bool:
    """True when any keyword of ``entry_text`` occurs as a substring of ``reply``."""
    names = list(stop_names)
    haystack = reply
    for name in sorted((n for n in names if n), key=len, reverse=True):
        haystack = haystack.replace(name, " ")
    haystack = haystack.lower()
    return any(k in haystack for k in mention_keywords(entry_text, names))


def record_mention(entry: T, now: datetime, settings: LongTermSettings) -> T:
    """Add a mention at ``now``; keep only mentions inside ``longterm_mention_window_hours``;
    more than ``longterm_mention_limit`` of them suppress the entry."""
    window = timedelta(hours=settings.longterm_mention_window_hours)
    kept = []
    for stamp in entry.recent_mentions:
        moment = parse_time(stamp, now)
        if moment is not None and now - moment < window:
            kept.append(stamp)
    kept.append(to_iso(now))
    if len(kept) > settings.longterm_mention_limit and not entry.suppress:
        return msgspec.structs.replace(entry, recent_mentions=kept, suppress=True, suppressed_at=to_iso(now))
    return msgspec.structs.replace(entry, recent_mentions=kept)


def refresh_suppression(entry: T, now: datetime, settings: LongTermSettings) -> T:
    """Lift a suppression ``longterm_suppress_cooldown_hours`` after it started (mentions cleared)."""
    if not entry.suppress:
        return entry
    since = parse_time(entry.suppressed_at, now)
    if since is not None and now - since < timedelta(hours=settings.longterm_suppress_cooldown_hours):
        return entry
    return msgspec.structs.replace(entry, suppress=False, suppressed_at=None, recent_mentions=[])


def is_suppressed(entry: TrackedFields, now: datetime, settings: LongTermSettings) -> bool:
    """True while a suppression is in force at ``now`` (same rule as :func:`refresh_suppression`)."""
    return refresh_suppression(entry, now, settings).suppress


def refresh_suppressions(
    reflections: Sequence[Reflection], now: datetime, settings: LongTermSettings
) -> tuple[list[Reflection], list[str]]:
    """Lift expired suppressions of every reflection. Returns (new list, ids changed)."""
    result = [refresh_suppression(r, now, settings) for r in reflections]
    return result, [r.id for r, old in zip(result, reflections, strict=True) if r is not old]


def record_reply_mentions(
    reflections: Sequence[Reflection], reply: str, now: datetime, settings: LongTermSettings, stop_names: Iterable[str] = ()
) -> tuple[list[Reflection], list[str]]:
    """Scan an AI reply against confirmed reflections (pending ones are exempt: probing is
    their purpose) and record a mention on each one it mentions. Returns (list, ids)."""
    names = list(stop_names)
    changed: list[str] = []
    result: list[Reflection] = []
    for ref in reflections:
        if ref.status == "confirmed" and reply and is_mentioned(reply, ref.text, names):
            ref = record_mention(ref, now, settings)
            changed.append(ref.id)
        result.append(ref)
    return result, changed


def suppressed_reflections(reflections: Iterable[Reflection], now: datetime, settings: LongTermSettings) -> list[Reflection]:
    """Confirmed reflections mentioned too often recently (the 'do not bring up' list)."""
    return [r for r in reflections if r.status == "confirmed" and is_suppressed(r, now, settings)]
