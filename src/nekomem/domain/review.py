"""Pure logic of the recent-memory review (``review_recent``).

A review sends the window to the correction model, which returns the dialogue with its
mistakes fixed; the fixed messages replace the reviewed slots of the window if those are
still there. This module decides whether a review may run (:func:`review_gate`), builds
its prompt, splices its answer (:func:`apply_review`) and updates the per-character
:class:`ReviewState`. The actor owns the state, the in-flight flag and the LLM call.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

import msgspec

from nekomem.config.recent import RecentSettings
from nekomem.domain.prompts import recent as prompts_recent
from nekomem.domain.recent_window import locate_fingerprint, tail_fingerprint, window_tokens
from nekomem.domain.tokens import TokenCounter
from nekomem.domain.turns import Role, Turn, content_text

log = logging.getLogger(__name__)

# Reasons returned by review_gate, in gate order.
GATE_IN_FLIGHT = "in_flight"
GATE_SWITCH_OFF = "switch_off"
GATE_TOO_SHORT = "history_too_short"
GATE_MIN_INTERVAL = "min_interval"
GATE_FEW_NEW_MESSAGES = "not_enough_new_messages"
GATE_OUTPUT_EXHAUSTED = "output_exhausted"
GATE_DEAD_LETTER = "dead_letter"

# apply_review statuses (the actor adds "failed" and "output_exhausted" for LLM outcomes).
STATUS_PATCHED = "patched"
STATUS_WHITE = "white"  # the reviewed tail is no longer in the window
STATUS_CLEAN = "clean"  # the model had nothing to correct (no usable message)

_HUMAN_ROLES = {"user", "human", "master"}
_AI_ROLES = {"ai", "assistant", "character"}


class ReviewState(msgspec.Struct, frozen=True, kw_only=True):
    """Per-character review bookkeeping (persisted by the actor).

    ``last_reviewed_tail`` is the fingerprint of the last reviewed message and the ones
    before it; ``fail_*`` count failures on one unchanged tail; ``output_exhaustion_*``
    count answers cut off by the output limit and the smallest context that caused one.
    """

    last_review_ts: float | None = None
    last_reviewed_tail: list[str] | None = None
    fail_attempts: int = 0
    fail_fingerprint: list[str] | None = None
    output_exhaustion_attempts: int = 0
    output_exhaustion_min_context_tokens: int | None = None
    output_exhaustion_blocked: bool = False


class ReviewApply(msgspec.Struct, frozen=True):
    """Result of splicing a review: the new window (None unless patched), the status and
    the fingerprint of the reviewed tail in the new window (for :func:`record_success`)."""

    window: list[Turn] | None
    status: str
    cutoff_fingerprint: list[str] | None = None
    # Each corrected message with the window item it replaced (its slot), and the slots
    # the answer left out: the items a corrected message may stand for (erasure matches
    # a rewritten item by the rows of these, see nekomem.stores.window_sources).
    replaced: list[tuple[Turn, Turn]] = msgspec.field(default_factory=list)
    dropped: list[Turn] = msgspec.field(default_factory=list)


def new_human_messages(window: Sequence[Turn], fingerprint: Sequence[str] | None) -> int | None:
    """Human turns after the place ``fingerprint`` marks; None (= unbounded) when the
    fingerprint is missing or cannot be found in ``window``."""
    if not fingerprint:
        return None
    end = locate_fingerprint(window, fingerprint)
    if end is None:
        return None
    return sum(1 for t in window[end + 1 :] if t.role == "human")


def review_gate(
    state: ReviewState,
    window: Sequence[Turn],
    now_ts: float,
    last_activity_ts: float,
    switch_on: bool,
    settings: RecentSettings,
    counter: TokenCounter,
    *,
    in_flight: bool = False,
) -> str | None:
    """None when a review of ``window`` may start now, else the first blocking gate.

    Gates in order: a review in flight; the switch off; fewer than
    ``review_skip_history_len`` items; less than ``review_min_interval_seconds`` since the
    last review (a non-finite or future timestamp is ignored); fewer than
    ``review_min_new_messages`` new human turns since the reviewed tail (one is enough
    after ``review_long_idle_bypass_seconds`` of idle since ``last_activity_ts``); the
    output-exhaustion breaker (open again only when the window has fewer tokens than the
    smallest context that exhausted the output); ``review_max_fail_attempts`` failures on
    the current, unchanged tail.
    """
    s = settings
    if in_flight:
        return GATE_IN_FLIGHT
    if not switch_on:
        return GATE_SWITCH_OFF
    if len(window) < s.review_skip_history_len:
        return GATE_TOO_SHORT
    last = state.last_review_ts
    if last is not None and math.isfinite(last) and last <= now_ts:
        if now_ts - last < s.review_min_interval_seconds:
            return GATE_MIN_INTERVAL
    fresh = new_human_messages(window, state.last_reviewed_tail)
    if fresh is not None and fresh < s.review_min_new_messages:
        idle = now_ts - last_activity_ts
        if not (fresh >= 1 and idle >= s.review_long_idle_bypass_seconds):
            return GATE_FEW_NEW_MESSAGES
    blocked = state.output_exhaustion_blocked or state.output_exhaustion_attempts >= s.review_output_exhaustion_max_attempts
    if blocked and state.output_exhaustion_min_context_tokens is not None:
        if window_tokens(window, counter) >= state.output_exhaustion_min_context_tokens:
            return GATE_OUTPUT_EXHAUSTED
    if state.fail_attempts >= s.review_max_fail_attempts and state.fail_fingerprint is not None:
        current = tail_fingerprint(window, s.review_fingerprint_k, s.review_fingerprint_prefix_chars)
        if list(state.fail_fingerprint) == current:
            return GATE_DEAD_LETTER
    return None


def render_review_transcript(snapshot: Sequence[Turn]) -> str:
    """``"{role}: {text}\\n\\n"`` per turn, roles ``user``/``assistant``/``system``."""
    return "".join(f"{t.openai_role}: {t.text}\n\n" for t in snapshot)


def build_review_messages(snapshot: Sequence[Turn], *, master_name: str, character_name: str) -> list[dict[str, str]]:
    """The ``review_recent`` chat messages for ``snapshot``."""
    has_memo = bool(snapshot) and snapshot[0].role == "system"
    return prompts_recent.review_messages(
        render_review_transcript(snapshot),
        master_name=master_name,
        character_name=character_name,
        has_memo=has_memo,
    )


def _map_role(raw: Any, has_memo: bool, master_name: str, character_name: str | None) -> Role:
    role = raw.strip().lower() if isinstance(raw, str) else ""
    if role == "system" and has_memo:
        return "system"
    if role in _AI_ROLES or (character_name and role == character_name.strip().lower()):
        return "ai"
    if role in _HUMAN_ROLES or role == master_name.strip().lower():
        return "human"
    return "human"


def _normalize(
    corrected: Sequence[Any], has_memo: bool, settings: RecentSettings, character_name: str | None
) -> tuple[str | None, list[tuple[Role, str]]]:
    """Split the model's dialogue into one memo text (or None) and the body messages."""
    memo_parts: list[str] = []
    body: list[tuple[Role, str]] = []
    for item in corrected:
        if not isinstance(item, dict):
            continue
        text = content_text(item.get("content"))
        if text is None or not text.strip():
            continue
        role = _map_role(item.get("role"), has_memo, settings.master_name, character_name)
        if role == "system":
            memo_parts.append(text.strip())
        else:
            body.append((role, text))
    if not memo_parts:
        return None, body
    memo = "\n".join(memo_parts)
    if not memo.startswith(settings.recent_memo_prefix):
        memo = settings.recent_memo_prefix + memo
    return memo, body


def apply_review_detailed(
    current: Sequence[Turn],
    snapshot: Sequence[Turn],
    corrected: Sequence[Any],
    settings: RecentSettings,
    *,
    character_name: str | None = None,
) -> ReviewApply:
    """Splice a review answer into ``current`` (see :func:`apply_review`)."""
    s = settings
    has_memo = bool(snapshot) and snapshot[0].role == "system"
    memo_text, body = _normalize(corrected, has_memo, s, character_name)
    if not body:
        return ReviewApply(None, STATUS_CLEAN)
    fp = tail_fingerprint(snapshot, s.review_fingerprint_k, s.review_fingerprint_prefix_chars)
    end = locate_fingerprint(current, fp)
    if end is None:
        return ReviewApply(None, STATUS_WHITE)
    capacity = 0
    while capacity < len(snapshot) and capacity <= end:
        a, b = snapshot[len(snapshot) - 1 - capacity], current[end - capacity]
        if (a.role, a.text) != (b.role, b.text):
            break
        capacity += 1
    start = end - capacity + 1
    memo_covered = has_memo and capacity == len(snapshot)
    body_start = start + 1 if memo_covered else start
    slots = list(current[body_start : end + 1])
    used = min(len(slots), len(body))
    if used == 0:
        return ReviewApply(None, STATUS_WHITE)
    # Corrected messages take the timestamps of the slots they land in, aligned at the end.
    tail_slots = slots[len(slots) - used :]
    patched = [Turn(role=role, text=text, ts=slot.ts) for (role, text), slot in zip(body[len(body) - used :], tail_slots, strict=False)]
    head: list[Turn] = []
    if memo_covered:
        old_memo = current[start]
        head = [Turn(role="system", text=memo_text, ts=old_memo.ts) if memo_text else old_memo]
    after = list(current[end + 1 :])
    reviewed = [*current[:start], *head, *patched]
    window = [*reviewed, *after]
    cutoff = tail_fingerprint(reviewed, s.review_fingerprint_k, s.review_fingerprint_prefix_chars)
    log.info(
        "review patched: %d slots, %d corrected messages, %d kept after cutoff",
        len(slots),
        used,
        len(after),
    )
    return ReviewApply(
        window,
        STATUS_PATCHED,
        cutoff,
        replaced=list(zip(tail_slots, patched, strict=True)),
        dropped=slots[: len(slots) - used],
    )


def apply_review(
    current: Sequence[Turn],
    snapshot: Sequence[Turn],
    corrected: Sequence[Any],
    settings: RecentSettings,
    *,
    character_name: str | None = None,
) -> tuple[list[Turn] | None, str]:
    """Splice the model's ``corrected`` dialogue for ``snapshot`` into ``current``.

    The snapshot's tail is located in ``current`` by its ``review_fingerprint_k``
    fingerprint; the capacity is the number of consecutive matching turns walking back
    from there. Those slots are replaced by the last ``min(capacity, len(corrected))``
    corrected messages (the head memo, when covered, by the corrected memo), and anything
    appended after the snapshot is kept. Roles: ``system`` only when the snapshot starts
    with a memo (all system items become one head memo); user/human/master (or the master's
    name) → human; ai/assistant/character (or ``character_name``) → ai; anything else →
    human. Returns ``(window, "patched")``, ``(None, "clean")`` when the output has no
    usable message (nothing to correct), or ``(None, "white")`` when the tail is no longer
    in ``current``.
    """
    result = apply_review_detailed(current, snapshot, corrected, settings, character_name=character_name)
    return result.window, result.status


def record_success(state: ReviewState, now_ts: float, reviewed_tail: Sequence[str] | None) -> ReviewState:
    """State after a patched review: new anchor and time, failure and exhaustion cleared."""
    return ReviewState(
        last_review_ts=now_ts,
        last_reviewed_tail=list(reviewed_tail) if reviewed_tail else None,
    )


def record_white(state: ReviewState, now_ts: float | None = None) -> ReviewState:
    """State after a white review: the anchor is cleared, so the next review does not wait
    for new messages. With ``now_ts`` the review time moves too, so that next review waits
    the minimum interval (the reference keeps the old time and retries at once; a tail
    that keeps moving would then be reviewed on every tick)."""
    if now_ts is None:
        return msgspec.structs.replace(state, last_reviewed_tail=None)
    return msgspec.structs.replace(state, last_reviewed_tail=None, last_review_ts=now_ts)


def record_clean(state: ReviewState, snapshot: Sequence[Turn], now_ts: float, settings: RecentSettings) -> ReviewState:
    """State after a review that found nothing to correct in ``snapshot``: like a success
    anchored at the snapshot's tail, so the window-changed gate (new messages since that
    tail) and the minimum interval hold the next review back until there is new input."""
    fp = tail_fingerprint(snapshot, settings.review_fingerprint_k, settings.review_fingerprint_prefix_chars)
    return record_success(state, now_ts, fp)


def record_failure(state: ReviewState, snapshot: Sequence[Turn], now_ts: float, settings: RecentSettings) -> ReviewState:
    """State after a failed review of ``snapshot``: one more failure on this tail (a new
    tail restarts the count at 1); the review time moves so retries are spaced."""
    fp = tail_fingerprint(snapshot, settings.review_fingerprint_k, settings.review_fingerprint_prefix_chars)
    same = state.fail_fingerprint is not None and list(state.fail_fingerprint) == fp
    attempts = state.fail_attempts + 1 if same else 1
    return msgspec.structs.replace(state, last_review_ts=now_ts, fail_attempts=attempts, fail_fingerprint=fp)


def record_output_exhausted(state: ReviewState, context_tokens: int, now_ts: float, settings: RecentSettings) -> ReviewState:
    """State after a review whose answer hit the output limit with ``context_tokens`` of
    window: the breaker closes after ``review_output_exhaustion_max_attempts`` of them."""
    attempts = state.output_exhaustion_attempts + 1
    previous = state.output_exhaustion_min_context_tokens
    smallest = context_tokens if previous is None else min(previous, context_tokens)
    return msgspec.structs.replace(
        state,
        last_review_ts=now_ts,
        output_exhaustion_attempts=attempts,
        output_exhaustion_min_context_tokens=smallest,
        output_exhaustion_blocked=attempts >= settings.review_output_exhaustion_max_attempts,
    )
