"""Reflection lifecycle: the ontology, the status machine (compare-and-swap transitions) and
list helpers; also the time scopes that decide where a confirmed reflection renders.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import msgspec

from nekomem.config.longterm import LongTermSettings
from nekomem.domain.records import (
    TERMINAL_STATUSES,
    Reflection,
    parse_time,
    to_iso,
)

TIME_SCOPES: frozenset[str] = frozenset({"pattern", "state", "episode"})
#: Accepted on read; ``past`` is always stale, the legacy values read as ``pattern``.
LEGACY_TIME_SCOPES: frozenset[str] = frozenset({"past", "current", "ongoing"})
RELATION_TYPES: Mapping[str, frozenset[str]] = {
    "master": frozenset({"preference", "trait", "habit", "identity", "emotional", "boundary"}),
    "neko": frozenset({"self_awareness", "learned", "role_note"}),
    "relationship": frozenset({"dynamic", "milestone", "tension", "shared_memory", "agreement"}),
}

_TRANSITIONS: Mapping[str, frozenset[str]] = {
    "pending": frozenset({"confirmed", "denied", "archived"}),
    "confirmed": frozenset({"promoted", "merged", "denied", "promote_blocked", "archived"}),
    "promote_blocked": frozenset({"archived"}),
}


class TransitionError(ValueError):
    """A status change that is not allowed from the reflection's current status."""


def add_reflection(reflections: Sequence[Reflection], new: Reflection) -> tuple[list[Reflection], bool]:
    """``reflections`` plus ``new`` unless one with its id exists (idempotent synthesis)."""
    if any(r.id == new.id for r in reflections):
        return list(reflections), False
    return [*reflections, new], True


def find(reflections: Iterable[Reflection], rid: str) -> Reflection | None:
    """The reflection with id ``rid``, if any."""
    return next((r for r in reflections if r.id == rid), None)


def replace_one(reflections: Sequence[Reflection], updated: Reflection) -> list[Reflection]:
    """``reflections`` with the item of ``updated.id`` replaced (others unchanged)."""
    return [updated if r.id == updated.id else r for r in reflections]


def active(reflections: Iterable[Reflection]) -> list[Reflection]:
    """Reflections in a non-terminal status (pending or confirmed)."""
    return [r for r in reflections if r.status not in TERMINAL_STATUSES]


def can_transition(current: str, to: str) -> bool:
    """True when ``current`` -> ``to`` is an allowed lifecycle step."""
    return to in _TRANSITIONS.get(current, frozenset())


def transition(ref: Reflection, to: str, now: datetime, *, expect: str | None = None, **fields: Any) -> Reflection:
    """``ref`` moved to status ``to`` with ``<to>_at`` = now and extra ``fields``.

    ``expect`` (compare-and-swap) is the status the caller saw. Raises TransitionError when
    the current status differs from ``expect`` or the step is not allowed.
    """
    if expect is not None and ref.status != expect:
        raise TransitionError(f"{ref.id}: status is {ref.status}, expected {expect}")
    if not can_transition(ref.status, to):
        raise TransitionError(f"{ref.id}: cannot go from {ref.status} to {to}")
    stamp_field = f"{to}_at"
    extra = dict(fields)
    if stamp_field in Reflection.__struct_fields__:
        extra.setdefault(stamp_field, to_iso(now))
    return msgspec.structs.replace(ref, status=to, **extra)


def confirm(ref: Reflection, now: datetime, *, auto: bool = False) -> Reflection:
    """pending -> confirmed (``auto_confirmed`` for the time-driven path). Raises TransitionError."""
    return transition(ref, "confirmed", now, expect="pending", auto_confirmed=auto)


def deny(ref: Reflection, now: datetime, reason: str, *, reject_reason: str | None = None) -> Reflection:
    """pending/confirmed -> denied with ``denied_reason``. Raises TransitionError."""
    return transition(ref, "denied", now, denied_reason=reason, reject_reason=reject_reason)


def mark_promoted(ref: Reflection, now: datetime) -> Reflection:
    """confirmed -> promoted. Raises TransitionError."""
    return transition(ref, "promoted", now, expect="confirmed")


def mark_merged(ref: Reflection, target_id: str, now: datetime) -> Reflection:
    """confirmed -> merged into persona entry ``target_id``. Raises TransitionError."""
    return transition(ref, "merged", now, expect="confirmed", absorbed_into=target_id)


def block_promotion(ref: Reflection, now: datetime, reason: str) -> Reflection:
    """confirmed -> promote_blocked with ``promote_blocked_reason``. Raises TransitionError."""
    return transition(ref, "promote_blocked", now, expect="confirmed", promote_blocked_reason=reason)


def anchor_time(ref: Reflection, now: datetime) -> datetime | None:
    """The time a reflection is about: event end, else event start, else created_at."""
    for value in (ref.event_end_at, ref.event_start_at, ref.created_at):
        moment = parse_time(value, now)
        if moment is not None:
            return moment
    return None


def is_past_for_render(ref: Reflection, now: datetime, settings: LongTermSettings) -> bool:
    """Whether a confirmed reflection belongs in the past-memories block.

    ``pattern`` (and null/legacy current/ongoing) never; ``past`` always; ``state`` when its
    anchor is more than ``reflection_state_past_days`` old; ``episode`` after more than
    ``reflection_episode_past_days``.
    """
    scope = ref.temporal_scope
    if scope == "past":
        return True
    if scope not in ("state", "episode"):
        return False
    anchor = anchor_time(ref, now)
    if anchor is None:
        return False
    limit = settings.reflection_state_past_days if scope == "state" else settings.reflection_episode_past_days
    return now - anchor > timedelta(days=limit)
