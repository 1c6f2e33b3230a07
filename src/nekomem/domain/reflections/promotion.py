"""Promotion pass: which reflections get confirmed and which are handed to persona, by
evidence (powerful memory on) or by age (the time-driven fallback).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta

import msgspec

from nekomem.config.longterm import LongTermSettings
from nekomem.domain.evidence import (
    net_score,
)
from nekomem.domain.records import (
    Reflection,
    parse_time,
    to_iso,
)
from nekomem.domain.reflections.lifecycle import (
    confirm,
)


def evidence_confirmations(
    reflections: Sequence[Reflection], now: datetime, settings: LongTermSettings
) -> tuple[list[Reflection], list[str]]:
    """Evidence-driven pass: every pending reflection with score >= ``evidence_confirm_threshold``
    becomes confirmed. Returns (new list, ids confirmed)."""
    result: list[Reflection] = []
    changed: list[str] = []
    for ref in reflections:
        if ref.status == "pending" and net_score(ref, now, settings) >= settings.evidence_confirm_threshold:
            ref = confirm(ref, now)
            changed.append(ref.id)
        result.append(ref)
    return result, changed


def promotable(reflections: Iterable[Reflection], now: datetime, settings: LongTermSettings) -> list[Reflection]:
    """Confirmed reflections with score >= ``evidence_promote_threshold``."""
    return [r for r in reflections if r.status == "confirmed" and net_score(r, now, settings) >= settings.evidence_promote_threshold]


def time_driven_confirmations(
    reflections: Sequence[Reflection], now: datetime, settings: LongTermSettings
) -> tuple[list[Reflection], list[str]]:
    """Pending reflections created at least ``reflection_auto_confirm_days`` ago become
    confirmed (``auto_confirmed``, ``confirmed_at`` = now, so promotion waits a full period)."""
    limit = timedelta(days=settings.reflection_auto_confirm_days)
    result: list[Reflection] = []
    changed: list[str] = []
    for ref in reflections:
        created = parse_time(ref.created_at, now)
        if ref.status == "pending" and created is not None and now - created >= limit:
            ref = confirm(ref, now, auto=True)
            changed.append(ref.id)
        result.append(ref)
    return result, changed


def time_driven_promotable(reflections: Iterable[Reflection], now: datetime, settings: LongTermSettings) -> list[Reflection]:
    """Confirmed reflections whose ``confirmed_at`` is at least ``reflection_auto_promote_days`` old."""
    limit = timedelta(days=settings.reflection_auto_promote_days)
    result = []
    for ref in reflections:
        confirmed = parse_time(ref.confirmed_at, now)
        if ref.status == "confirmed" and confirmed is not None and now - confirmed >= limit:
            result.append(ref)
    return result


def reset_confirmed_at(reflections: Sequence[Reflection], now: datetime) -> tuple[list[Reflection], int]:
    """Switching powerful memory off: every confirmed reflection gets ``confirmed_at`` = now.
    Returns (new list, how many were reset)."""
    stamp = to_iso(now)
    count = 0
    result: list[Reflection] = []
    for ref in reflections:
        if ref.status == "confirmed":
            ref = msgspec.structs.replace(ref, confirmed_at=stamp)
            count += 1
        result.append(ref)
    return result, count
