"""Reflections: synthesis, lifecycle, feedback, disputation, surfacing and mentions.

Pure functions over :class:`~nekomem.domain.records.Reflection` lists; the ReflectionActor
owns reflections.json / surfaced.json and makes the LLM calls. ``now`` is always an
argument. Status changes go through :func:`transition`, a compare-and-swap on the current
status, so a late result never overwrites a newer state.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any, TypeVar

import msgspec

from nekomem.config.longterm import LongTermSettings
from nekomem.domain.evidence import (
    ResolvedSignal,
    SignalSource,
    apply_signal,
    archive_due,
    net_score,
    seed_reinforcement,
    track_below_zero,
)
from nekomem.domain.facts import text_keywords
from nekomem.domain.turns import Turn
from nekomem.domain.records import (
    BUILTIN_ENTITIES,
    SCHEMA_VERSION_CURRENT,
    TERMINAL_STATUSES,
    Fact,
    Reflection,
    SurfacedEntry,
    TrackedFields,
    parse_time,
    record_get,
    reflection_id,
    to_iso,
)

T = TypeVar("T", bound=TrackedFields)

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


# --- synthesis -------------------------------------------------------------------------


class SynthesisBatch(msgspec.Struct, frozen=True):
    """The facts of one synthesis and its deterministic ids.

    ``reflection_id`` is derived from the sorted ``source_fact_ids`` (idempotent retries);
    ``backoff_key`` hashes every eligible unabsorbed id before the cap, so any new fact
    resets the failure backoff.
    """

    facts: list[Fact]
    source_fact_ids: list[str]
    reflection_id: str
    backoff_key: str


def _ids_digest(ids: Iterable[str]) -> str:
    digest = hashlib.sha256()
    for fid in sorted(ids):
        digest.update(fid.encode("utf-8"))
        digest.update(b"\x00")
    return digest.hexdigest()[:16]


def synthesis_batch(facts: Iterable[Fact], settings: LongTermSettings) -> SynthesisBatch | None:
    """The next synthesis batch, or None when fewer than ``reflection_min_facts`` unabsorbed
    facts of importance >= ``reflection_min_importance`` exist. At most
    ``reflection_synthesis_facts_max`` facts: highest importance first, then oldest."""
    eligible = [f for f in facts if not f.absorbed and f.importance >= settings.reflection_min_importance]
    if len(eligible) < settings.reflection_min_facts:
        return None
    ranked = sorted(eligible, key=lambda f: (-f.importance, f.created_at))[: settings.reflection_synthesis_facts_max]
    ids = sorted(f.id for f in ranked)
    return SynthesisBatch(ranked, ids, reflection_id(ids), _ids_digest(f.id for f in eligible))


class SynthBackoff(msgspec.Struct, frozen=True):
    """One synth_backoff.json value: failures ``n`` and the last failure time ``at``."""

    n: int
    at: str


def synthesis_allowed(
    backoff: Mapping[str, SynthBackoff], key: str, now: datetime, settings: LongTermSettings
) -> bool:
    """False while ``key`` has failed ``longterm_liveness_max_attempts`` times and the last
    failure is younger than ``longterm_dead_letter_self_heal_seconds`` (then one probe)."""
    entry = backoff.get(key)
    if entry is None or entry.n < settings.longterm_liveness_max_attempts:
        return True
    last = parse_time(entry.at, now)
    return last is None or (now - last).total_seconds() >= settings.longterm_dead_letter_self_heal_seconds


def record_synthesis_failure(backoff: Mapping[str, SynthBackoff], key: str, now: datetime) -> dict[str, SynthBackoff]:
    """``backoff`` with one more failure of ``key`` at ``now``."""
    result = dict(backoff)
    previous = result.get(key)
    result[key] = SynthBackoff(n=(previous.n if previous else 0) + 1, at=to_iso(now))
    return result


def clear_synthesis_backoff(backoff: Mapping[str, SynthBackoff], key: str) -> dict[str, SynthBackoff]:
    """``backoff`` without ``key`` (after a successful synthesis)."""
    return {k: v for k, v in backoff.items() if k != key}


def build_reflection(
    output: object,
    batch: SynthesisBatch,
    now: datetime,
    settings: LongTermSettings,
    count_tokens: Callable[[str], int],
) -> Reflection | None:
    """The new pending reflection of a synthesize_reflection output, or None when the model
    returned ``{"reflection": null}`` or an empty text (the caller records a failure).

    An unknown entity becomes ``relationship``. An unknown time scope, a relation type not
    allowed for the entity, or a text over ``reflection_text_max_tokens`` clears the time
    scope, relation type and subject but keeps the text. ``state``/``episode`` get an end
    time (falling back to the start), ``pattern`` keeps only a start. The reinforcement seed
    comes from the most important source fact; ``next_eligible_at`` = now + cooldown.
    """
    body = record_get(output, "reflection")
    if body is None:
        return None
    text = record_get(body, "text")
    if not isinstance(text, str) or not text.strip():
        return None
    text = text.strip()
    entity = record_get(body, "entity")
    entity = entity.strip().lower() if isinstance(entity, str) else ""
    if entity not in BUILTIN_ENTITIES:
        entity = "relationship"
    scope = record_get(body, "time_scope", record_get(body, "temporal_scope"))
    scope = scope.strip().lower() if isinstance(scope, str) else None
    relation = record_get(body, "relation_type")
    relation = relation.strip().lower() if isinstance(relation, str) and relation.strip() else None
    subject = record_get(body, "subject")
    subject = subject.strip() if isinstance(subject, str) and subject.strip() else None
    ontology_ok = (
        (scope is None or scope in TIME_SCOPES or scope in LEGACY_TIME_SCOPES)
        and (relation is None or relation in RELATION_TYPES.get(entity, frozenset()))
        and count_tokens(text) <= settings.reflection_text_max_tokens
    )
    if not ontology_ok:
        scope = relation = subject = None
    start = parse_time(record_get(body, "event_start_at"), now)
    end = parse_time(record_get(body, "event_end_at"), now)
    if scope == "pattern":
        end = None
    elif scope in ("state", "episode") and end is None:
        end = start
    if start is not None and end is not None and end < start:
        end = start
    seed = seed_reinforcement(max((f.importance for f in batch.facts), default=0), settings)
    return Reflection(
        id=batch.reflection_id,
        text=text,
        entity=entity,
        status="pending",
        source_fact_ids=list(batch.source_fact_ids),
        created_at=to_iso(now),
        next_eligible_at=to_iso(now + timedelta(minutes=settings.reflection_cooldown_minutes)),
        reinforcement=seed,
        rein_last_signal_at=to_iso(now) if seed else None,
        relation_type=relation,
        subject=subject,
        temporal_scope=scope,
        event_start_at=to_iso(start) if start else None,
        event_end_at=to_iso(end) if end else None,
        schema_version=SCHEMA_VERSION_CURRENT,
    )


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


# --- transitions -----------------------------------------------------------------------


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
    return msgspec.structs.replace(ref, status=to, **extra)  # type: ignore[arg-type]


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


def evidence_confirmations(reflections: Sequence[Reflection], now: datetime, settings: LongTermSettings) -> tuple[list[Reflection], list[str]]:
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


# --- feedback on surfaced reflections --------------------------------------------------

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


# --- negative keywords and the disputation scan ----------------------------------------


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


# --- followup surfacing -----------------------------------------------------------------


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


# --- mention suppression (shared with persona entries) -----------------------------------


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


def refresh_suppressions(reflections: Sequence[Reflection], now: datetime, settings: LongTermSettings) -> tuple[list[Reflection], list[str]]:
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


# --- time scopes (rendering) ------------------------------------------------------------


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


# --- time-driven fallback (powerful memory off) -------------------------------------------


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


# --- archive ---------------------------------------------------------------------------


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
    return [msgspec.structs.replace(e, archive_shard_path=name) for e, name in zip(entries, shard_names, strict=True)]  # type: ignore[call-arg]

