"""Feedback on surfaced reflections: the user's direct verdicts and the check_feedback
answers about what the character brought up.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime

import msgspec

from nekomem.config.longterm import LongTermSettings
from nekomem.domain.evidence import (
    apply_signal,
)
from nekomem.domain.records import (
    Reflection,
    SurfacedEntry,
    record_get,
    to_iso,
)
from nekomem.domain.reflections.lifecycle import (
    can_transition,
    confirm,
    deny,
)

FEEDBACK_VALUES = ("confirmed", "denied", "ignored")


def apply_feedback(ref: Reflection, feedback: str, now: datetime, settings: LongTermSettings) -> Reflection:
    """Apply one user feedback to a reflection.

    ``confirmed``: reinforcement + ``evidence_user_confirm_delta`` (the status follows from
    the score in :func:`evidence_confirmations`). ``denied``: disputation +
    ``evidence_user_rebut_delta`` and, from pending/confirmed, status ``denied``
    (``denied_reason="user_denied"``). ``ignored``: reinforcement + ``evidence_ignored_delta``.
    Raises ValueError for another feedback value.
    """
    if feedback == "confirmed":
        return apply_signal(ref, "reinforce", "user_confirm", now, settings)
    if feedback == "ignored":
        return apply_signal(ref, "ignore", "user_ignore", now, settings)
    if feedback == "denied":
        ref = apply_signal(ref, "negate", "user_rebut", now, settings)
        if can_transition(ref.status, "denied"):
            ref = deny(ref, now, "user_denied")
        return ref
    raise ValueError(f"unknown feedback {feedback!r}")


def confirm_by_user(ref: Reflection, now: datetime, settings: LongTermSettings) -> Reflection:
    """Direct confirmation (memory browser): the confirm delta, and pending -> confirmed."""
    ref = apply_feedback(ref, "confirmed", now, settings)
    return confirm(ref, now) if ref.status == "pending" else ref


def deny_by_user(ref: Reflection, now: datetime, settings: LongTermSettings) -> Reflection:
    """Direct denial (memory browser): the rebut delta, and pending/confirmed -> denied."""
    return apply_feedback(ref, "denied", now, settings)


def ignore_by_user(ref: Reflection, now: datetime, settings: LongTermSettings) -> Reflection:
    """Direct 'ignored' feedback: the ignore delta (no status change)."""
    return apply_feedback(ref, "ignored", now, settings)


def awaiting_feedback(surfaced: Iterable[SurfacedEntry]) -> list[SurfacedEntry]:
    """Surfaced entries whose feedback is still unknown (check_feedback runs only if any)."""
    return [s for s in surfaced if s.feedback is None]


def interpret_feedback(output: object, allowed_ids: Iterable[str]) -> list[tuple[str, str]]:
    """Valid (reflection_id, feedback) pairs of a check_feedback output
    ``{"feedback": [{reflection_id, feedback}]}``: known ids only, first answer per id."""
    allowed = set(allowed_ids)
    seen: set[str] = set()
    result: list[tuple[str, str]] = []
    for item in record_get(output, "feedback", None) or []:
        rid, value = record_get(item, "reflection_id"), record_get(item, "feedback")
        if isinstance(rid, str) and rid in allowed and rid not in seen and value in FEEDBACK_VALUES:
            seen.add(rid)
            result.append((rid, value))
    return result


def record_feedback(surfaced: Sequence[SurfacedEntry], rid: str, feedback: str, now: datetime) -> list[SurfacedEntry]:
    """Stamp ``feedback`` on the surfaced entry of ``rid``; only a null, ``confirmed`` or
    ``auto_confirmed`` feedback can be overwritten."""
    result: list[SurfacedEntry] = []
    for entry in surfaced:
        if entry.reflection_id == rid and entry.feedback in (None, "confirmed", "auto_confirmed"):
            entry = msgspec.structs.replace(entry, feedback=feedback, feedback_at=to_iso(now))
        result.append(entry)
    return result


def user_feedback(ref: Reflection, feedback: str, now: datetime, settings: LongTermSettings) -> Reflection:
    """A direct verdict from the memory browser (``confirmed``, ``denied`` or ``ignored``).
    Raises ValueError for another value."""
    if feedback == "confirmed":
        return confirm_by_user(ref, now, settings)
    if feedback == "denied":
        return deny_by_user(ref, now, settings)
    if feedback == "ignored":
        return ignore_by_user(ref, now, settings)
    raise ValueError(f"unknown feedback {feedback!r}")
