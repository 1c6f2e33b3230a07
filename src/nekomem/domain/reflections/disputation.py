"""Disputation: negative keywords in a turn, the periodic scan of the raw journal for
messages that dispute confirmed reflections, and the signals they produce.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta

import msgspec

from nekomem.config.longterm import LongTermSettings
from nekomem.domain.evidence import (
    ResolvedSignal,
    SignalSource,
    apply_signal,
)
from nekomem.domain.records import (
    Reflection,
)
from nekomem.domain.reflections.lifecycle import (
    deny,
)
from nekomem.domain.reflections.mentions import (
    is_suppressed,
)
from nekomem.domain.turns import Turn, parse_timestamp


def contains_negative_keyword(texts: Iterable[str], settings: LongTermSettings) -> bool:
    """True when a user text contains one of ``evidence_negative_keywords`` (case-insensitive)."""
    keywords = [k.lower() for k in settings.evidence_negative_keywords if k]
    return any(k in text.lower() for text in texts for k in keywords)


def disputation_context(turns: Sequence[Turn], settings: LongTermSettings) -> list[Turn]:
    """The last ``evidence_negative_keyword_context_items`` user messages, oldest first."""
    users = [t for t in turns if t.role == "human"]
    return users[-settings.evidence_negative_keyword_context_items :]


def apply_disputed(
    reflections: Sequence[Reflection], target_ids: Iterable[str], now: datetime, settings: LongTermSettings
) -> tuple[list[Reflection], list[str]]:
    """Disputation + ``evidence_user_keyword_rebut_delta`` on each targeted reflection.
    Returns (new list, ids changed)."""
    wanted = set(target_ids)
    changed: list[str] = []
    result: list[Reflection] = []
    for ref in reflections:
        if ref.id in wanted:
            ref = apply_signal(ref, "negate", "user_keyword_rebut", now, settings)
            changed.append(ref.id)
        result.append(ref)
    return result, changed


def apply_resolved_signals(
    reflections: Sequence[Reflection],
    signals: Iterable[ResolvedSignal],
    now: datetime,
    settings: LongTermSettings,
    source: SignalSource = "user_fact",
) -> tuple[list[Reflection], list[str]]:
    """Apply the reflection-targeted signals of a map_evidence (``user_fact``) or
    check_disputation (``user_keyword_rebut``) result, in order. Returns (list, ids changed)."""
    index = {r.id: i for i, r in enumerate(reflections)}
    result = list(reflections)
    changed: list[str] = []
    for sig in signals:
        i = index.get(sig.target_id)
        if sig.target_kind != "reflection" or i is None:
            continue
        result[i] = apply_signal(result[i], sig.signal, source, now, settings)
        changed.append(sig.target_id)
    return result, list(dict.fromkeys(changed))


def rebuttal_window_start(cursor: datetime | None, now: datetime, settings: LongTermSettings) -> datetime:
    """Start of the disputation scan: the persisted cursor, or ``reflection_rebuttal_lookback_hours`` ago."""
    return cursor if cursor is not None else now - timedelta(hours=settings.reflection_rebuttal_lookback_hours)


class RebuttalBatch(msgspec.Struct, frozen=True):
    """User messages for one disputation scan and the cursor to store after success
    (None: leave it where it is)."""

    messages: list[Turn]
    advance_to: str | None


def rebuttal_batch(rows: Sequence[Turn], settings: LongTermSettings) -> RebuttalBatch:
    """Select the scan input from journal ``rows`` after the cursor (oldest first).

    At most ``reflection_rebuttal_max_rows`` rows are looked at; user messages only, at most
    ``reflection_rebuttal_max_messages``, extended with the rest of a same-timestamp
    cluster. The cursor advances to the last included message (or to the last row read
    when it holds no user message).
    """
    window = list(rows[: settings.reflection_rebuttal_max_rows])
    users = [t for t in window if t.role == "human"]
    if not users:
        return RebuttalBatch([], window[-1].ts if window else None)
    chosen = users[: settings.reflection_rebuttal_max_messages]
    last_ts = chosen[-1].ts
    for extra in users[len(chosen) :]:
        if extra.ts != last_ts:
            break
        chosen.append(extra)
    return RebuttalBatch(chosen, last_ts)


def rebuttal_targets(reflections: Iterable[Reflection], now: datetime, settings: LongTermSettings) -> list[Reflection]:
    """Active confirmed reflections checked by the disputation scan (confirmed, not suppressed)."""
    return [r for r in reflections if r.status == "confirmed" and not is_suppressed(r, now, settings)]


def apply_rebuttals(
    reflections: Sequence[Reflection], feedback: Iterable[tuple[str, str]], now: datetime
) -> tuple[list[Reflection], list[str]]:
    """Disputation-scan results: each ``denied`` answer moves a confirmed reflection to
    ``denied`` (``denied_reason="user_rebuttal"``, status only, as in the reference)."""
    denied = {rid for rid, value in feedback if value == "denied"}
    changed: list[str] = []
    result: list[Reflection] = []
    for ref in reflections:
        if ref.id in denied and ref.status == "confirmed":
            ref = deny(ref, now, "user_rebuttal")
            changed.append(ref.id)
        result.append(ref)
    return result, changed


def scan_start(cursor: str | None, now: datetime, settings: LongTermSettings) -> datetime:
    """Where the next disputation scan starts: just after the stored ``cursor`` (its own
    message was checked), or ``reflection_rebuttal_lookback_hours`` before ``now`` when
    there is no usable cursor (absent, unparseable, or after ``now``: the clock went back)."""
    start: datetime | None = None
    if cursor is not None:
        try:
            start = parse_timestamp(cursor)
        except ValueError:
            start = None
        if start is not None and start > now:
            start = None
        elif start is not None:
            start += timedelta(microseconds=1)
    return rebuttal_window_start(start, now, settings)
