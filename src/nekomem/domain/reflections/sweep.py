"""Archive sweep: reflections below zero for enough distinct days leave reflections.json
for the archive shards; old terminal reflections age out the same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import TypeVar

import msgspec

from nekomem.config.longterm import LongTermSettings
from nekomem.domain.evidence import (
    archive_due,
    track_below_zero,
)
from nekomem.domain.records import (
    Reflection,
    TrackedFields,
    parse_time,
    to_iso,
)
from nekomem.domain.reflections.lifecycle import (
    transition,
)

T = TypeVar("T", bound=TrackedFields)


class ReflectionSweep(msgspec.Struct, frozen=True):
    """Result of an archive sweep: ``kept`` (with updated day counters) stays in
    reflections.json, ``archived`` (status archived, ``archived_at`` set) goes to today's
    shard, ``counted`` lists the ids whose below-zero day counter went up."""

    kept: list[Reflection]
    archived: list[Reflection]
    counted: list[str]


_SWEPT_STATUSES = frozenset({"pending", "confirmed", "promote_blocked"})


def archive_sweep(reflections: Sequence[Reflection], now: datetime, settings: LongTermSettings) -> ReflectionSweep:
    """Count one more below-zero day (at most once per calendar day of ``now``) for each
    pending, confirmed or promote_blocked reflection with a negative score, and archive those
    that reached ``evidence_archive_days`` distinct days."""
    kept: list[Reflection] = []
    archived: list[Reflection] = []
    counted: list[str] = []
    for ref in reflections:
        if ref.status in _SWEPT_STATUSES:
            updated = track_below_zero(ref, now, settings)
            if updated is not ref:
                counted.append(ref.id)
            if archive_due(updated, settings):
                archived.append(transition(updated, "archived", now))
                continue
            ref = updated
        kept.append(ref)
    return ReflectionSweep(kept, archived, counted)


def age_out_terminal(
    reflections: Sequence[Reflection], now: datetime, settings: LongTermSettings
) -> tuple[list[Reflection], list[Reflection]]:
    """(kept, moved): promoted and denied reflections older than
    ``reflection_terminal_archive_days`` (from promoted_at, else denied_at, else created_at)
    move to the shards as they are; ``merged`` and ``promote_blocked`` stay."""
    limit = timedelta(days=settings.reflection_terminal_archive_days)
    kept: list[Reflection] = []
    moved: list[Reflection] = []
    for ref in reflections:
        if ref.status in ("promoted", "denied"):
            since = parse_time(ref.promoted_at, now) or parse_time(ref.denied_at, now) or parse_time(ref.created_at, now)
            if since is not None and now - since > limit:
                moved.append(msgspec.structs.replace(ref, archived_at=to_iso(now)))
                continue
        kept.append(ref)
    return kept, moved


def with_shard_paths(entries: Sequence[T], shard_names: Sequence[str]) -> list[T]:
    """Stamp ``archive_shard_path`` (basename) on archived entries, pairwise with ``shard_names``."""
    return [msgspec.structs.replace(e, archive_shard_path=name) for e, name in zip(entries, shard_names, strict=True)]
