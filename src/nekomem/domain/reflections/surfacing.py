"""Surfacing: followup topics for proactive chat and the record of what was brought up."""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta

import msgspec

from nekomem.config.longterm import LongTermSettings
from nekomem.domain.evidence import (
    net_score,
)
from nekomem.domain.records import (
    Reflection,
    SurfacedEntry,
    parse_time,
    to_iso,
)


def _text_key(text: str, settings: LongTermSettings) -> str:
    return " ".join(text.lower().split())[: settings.reflection_followup_text_key_chars]


def followup_candidates(
    reflections: Iterable[Reflection], now: datetime, settings: LongTermSettings, rng: random.Random
) -> list[Reflection]:
    """Followup topics for proactive chat (does not mark them surfaced).

    Candidates: pending reflections past ``next_eligible_at`` with score >= 0, one per
    normalised text key. With more than ``reflection_surface_top_k``, pick that many by
    weighted sampling without replacement (weight = max(score, 0) + base) using ``rng``, or
    the highest scores when ``reflection_followup_weighted`` is off.
    """
    pool: list[tuple[Reflection, float]] = []
    keys: set[str] = set()
    for ref in reflections:
        if ref.status != "pending":
            continue
        eligible = parse_time(ref.next_eligible_at, now)
        if eligible is not None and eligible > now:
            continue
        score = net_score(ref, now, settings)
        key = _text_key(ref.text, settings)
        if score < 0 or not key or key in keys:
            continue
        keys.add(key)
        pool.append((ref, score))
    k = settings.reflection_surface_top_k
    if len(pool) <= k:
        return [r for r, _ in pool]
    if not settings.reflection_followup_weighted:
        return [r for r, _ in sorted(pool, key=lambda p: -p[1])[:k]]
    chosen: list[Reflection] = []
    remaining = list(pool)
    for _ in range(k):
        weights = [max(score, 0.0) + settings.reflection_followup_weight_base for _, score in remaining]
        total = sum(weights)
        if total <= 0:
            index = rng.randrange(len(remaining))
        else:
            point = rng.random() * total
            index = len(remaining) - 1
            for i, w in enumerate(weights):
                point -= w
                if point < 0:
                    index = i
                    break
        chosen.append(remaining.pop(index)[0])
    return chosen


def record_surfaced(
    reflections: Sequence[Reflection],
    surfaced: Sequence[SurfacedEntry],
    ids: Iterable[str],
    now: datetime,
    settings: LongTermSettings,
) -> tuple[list[Reflection], list[SurfacedEntry]]:
    """The character brought up ``ids``: push their ``next_eligible_at`` one cooldown forward
    and upsert surfaced.json entries (feedback reset to null, ``surfaced_at`` = now).
    Unknown ids are ignored."""
    wanted = list(dict.fromkeys(ids))
    by_id = {r.id: r for r in reflections}
    stamp = to_iso(now)
    next_at = to_iso(now + timedelta(minutes=settings.reflection_cooldown_minutes))
    new_refs = [msgspec.structs.replace(r, next_eligible_at=next_at) if r.id in wanted else r for r in reflections]
    entries = list(surfaced)
    for rid in wanted:
        ref = by_id.get(rid)
        if ref is None:
            continue
        fresh = SurfacedEntry(reflection_id=rid, text=ref.text, surfaced_at=stamp, feedback=None, feedback_at=None)
        for i, entry in enumerate(entries):
            if entry.reflection_id == rid:
                entries[i] = fresh
                break
        else:
            entries.append(fresh)
    return new_refs, entries
