"""Facts: normalising extracted facts, marks, the extraction schedule and the fact archive
(dedup is in :mod:`nekomem.domain.fact_dedup`).

Pure functions over :class:`~nekomem.domain.records.Fact` lists; the FactActor owns the
files and the LLM calls. ``now`` is always an argument.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime, timedelta

import msgspec

from nekomem.config.longterm import LongTermSettings
from nekomem.domain.records import (
    BUILTIN_ENTITIES,
    IMPORTANCE_MAX,
    IMPORTANCE_MIN,
    Fact,
    FactSource,
    fact_hash,
    fact_id,
    parse_time,
    record_get,
    to_iso,
)
from nekomem.domain.turns import Turn

# --- lexical keywords (shared with persona contradiction and mention checks) -------------

_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\u31f0-\u31ff"
_CJK_RUN = re.compile(f"[{_CJK}]+")
_WORD = re.compile(f"[^\\W{_CJK}_]+", re.UNICODE)


def text_keywords(text: str, stop_names: Iterable[str] = (), *, min_cjk_len: int = 1) -> set[str]:
    """Lexical keywords of a text: 2- and 3-grams of each CJK run (a run shorter than 2 is
    kept whole when it has at least ``min_cjk_len`` characters) plus lower-cased words of
    other scripts with at least 2 characters. ``stop_names`` are removed first."""
    for name in sorted((n for n in stop_names if n), key=len, reverse=True):
        text = text.replace(name, " ")
    keys: set[str] = set()
    for run in _CJK_RUN.findall(text):
        if len(run) < 2:
            if len(run) >= min_cjk_len:
                keys.add(run)
            continue
        for n in (2, 3):
            keys.update(run[i : i + n] for i in range(len(run) - n + 1))
    for word in _WORD.findall(_CJK_RUN.sub(" ", text)):
        if len(word) >= 2:
            keys.add(word.lower())
    return keys


def jaccard(a: set[str], b: set[str]) -> float:
    """|a & b| / |a | b| (0 when both are empty)."""
    union = a | b
    return len(a & b) / len(union) if union else 0.0


# --- normalising extracted facts -------------------------------------------------------


def clamp_importance(value: object, settings: LongTermSettings) -> int:
    """An importance in 1..10; unparsable values give ``fact_importance_default``."""
    try:
        number = int(round(float(value)))  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError):
        return settings.fact_importance_default
    return max(IMPORTANCE_MIN, min(IMPORTANCE_MAX, number))


def normalize_entity(value: object, allowed: Iterable[str] = BUILTIN_ENTITIES, fallback: str = "master") -> str:
    """``value`` if it is one of ``allowed`` (case-insensitive), else ``fallback``."""
    if isinstance(value, str):
        lowered = value.strip().lower()
        for entity in allowed:
            if lowered == entity:
                return entity
    return fallback


def parse_event_time(value: object, like: datetime) -> datetime | None:
    """An ISO 8601 event time (date or date-time) in ``like``'s zone; None if absent or invalid."""
    return parse_time(value, like)


def normalize_fact(
    item: object,
    *,
    now: datetime,
    source: FactSource,
    settings: LongTermSettings,
    signal_processed: bool | None = None,
    hash_prefix: str = "",
) -> Fact | None:
    """Build a Fact from one extract_facts item ``{text, importance, entity, event_start_at,
    event_end_at}``; None when the text is empty.

    Importance is clamped to 1..10, an unknown entity becomes ``master``, unparsable event
    times are dropped, the start falls back to ``now`` (the creation time) and an end before
    the start is dropped. ``signal_processed`` defaults to False for ``user_observation``
    (path A feeds Stage 2) and True for ``ai_disclosure`` (never self-reinforcing).
    """
    text = record_get(item, "text")
    if not isinstance(text, str) or not text.strip():
        return None
    text = text.strip()
    start = parse_event_time(record_get(item, "event_start_at"), now) or now
    end = parse_event_time(record_get(item, "event_end_at"), now)
    if end is not None and end < start:
        end = None
    if signal_processed is None:
        signal_processed = source != "user_observation"
    return Fact(
        id=fact_id(now, hash_prefix + text),
        text=text,
        importance=clamp_importance(record_get(item, "importance"), settings),
        entity=normalize_entity(record_get(item, "entity")),
        source=source,
        tags=[],
        hash=fact_hash(text, hash_prefix),
        created_at=to_iso(now),
        event_start_at=to_iso(start),
        event_end_at=to_iso(end) if end is not None else None,
        absorbed=False,
        signal_processed=signal_processed,
    )


def normalize_extraction(output: object, *, now: datetime, source: FactSource, settings: LongTermSettings) -> list[Fact]:
    """All valid facts of an extract_facts / extract_self_disclosure output ``{"facts": [...]}``
    (a bare list is accepted too). Facts with the same text keep the first."""
    items = output if isinstance(output, list) else record_get(output, "facts", None) or []
    result: list[Fact] = []
    seen: set[str] = set()
    for item in items:
        fact = normalize_fact(item, now=now, source=source, settings=settings)
        if fact is None or fact.hash in seen:
            continue
        seen.add(fact.hash)
        result.append(fact)
    return result


# --- marks -----------------------------------------------------------------------------


def mark_absorbed(facts: Sequence[Fact], ids: Iterable[str]) -> list[Fact]:
    """``facts`` with ``absorbed=True`` on the given ids (monotonic: never set back to False)."""
    wanted = set(ids)
    return [msgspec.structs.replace(f, absorbed=True) if f.id in wanted and not f.absorbed else f for f in facts]


def mark_signal_processed(facts: Sequence[Fact], ids: Iterable[str]) -> list[Fact]:
    """``facts`` with ``signal_processed=True`` on the given ids (after every signal applied)."""
    wanted = set(ids)
    return [msgspec.structs.replace(f, signal_processed=True) if f.id in wanted and not f.signal_processed else f for f in facts]


def signal_batch(facts: Iterable[Fact], settings: LongTermSettings) -> list[Fact]:
    """The next Stage-2 batch: unprocessed facts not from ``ai_disclosure``, highest
    importance first then oldest, at most ``evidence_map_max_new_facts``."""
    queue = [f for f in facts if not f.signal_processed and f.source != "ai_disclosure"]
    queue.sort(key=lambda f: (-f.importance, f.created_at))
    return queue[: settings.evidence_map_max_new_facts]


# --- extraction schedule ---------------------------------------------------------------


def extraction_due(
    turns_since: int,
    last_check_at: datetime | None,
    last_activity_at: datetime | None,
    now: datetime,
    settings: LongTermSettings,
) -> bool:
    """Whether a batch extraction (path A) should run now.

    True when ``turns_since`` (user turns since the last check) reaches
    ``fact_extract_every_n_turns``; or, with at least one turn, when
    ``fact_extract_interval_minutes`` passed since ``last_check_at``; or, with at least one
    turn, when the conversation has been idle ``fact_extract_idle_seconds`` (only before the
    first check when ``fact_extract_idle_requires_first_run``).
    """
    if turns_since >= settings.fact_extract_every_n_turns:
        return True
    if turns_since <= 0:
        return False
    if last_check_at is not None and now - last_check_at >= timedelta(minutes=settings.fact_extract_interval_minutes):
        return True
    idle_rule = last_check_at is None or not settings.fact_extract_idle_requires_first_run
    if idle_rule:
        idle = last_activity_at is None or now - last_activity_at >= timedelta(seconds=settings.fact_extract_idle_seconds)
        return idle
    return False


def extraction_window_start(last_check_at: datetime | None, now: datetime, settings: LongTermSettings) -> datetime:
    """Start of the path-A window: the cursor, or now minus the cold-start lookback."""
    if last_check_at is not None:
        return last_check_at
    return now - timedelta(minutes=settings.fact_extract_cold_start_lookback_minutes)


def self_disclosure_due(successful_passes_since_last: int, settings: LongTermSettings) -> bool:
    """True when path B is due: ``fact_self_disclosure_every_n_passes`` successful path-A
    passes happened since the last path-B pass (the caller resets its counter after B)."""
    return successful_passes_since_last >= settings.fact_self_disclosure_every_n_passes


def self_disclosure_window_start(last_b_check_at: datetime | None, path_a_latest: datetime, settings: LongTermSettings) -> datetime:
    """Start of the path-B window: its cursor, or the last path-A message minus the cold-start lookback."""
    if last_b_check_at is not None:
        return last_b_check_at
    return path_a_latest - timedelta(minutes=settings.fact_self_disclosure_cold_start_lookback_minutes)


def user_turns_only(turns: Iterable[Turn]) -> list[Turn]:
    """Path A sees user messages only (AI-only content never becomes memory)."""
    return [t for t in turns if t.role == "human"]


def trim_to_user_span(turns: Sequence[Turn], settings: LongTermSettings) -> list[Turn]:
    """Path-B window: the first ``fact_self_disclosure_max_window_messages`` rows trimmed to
    the span from the first to the last user message; empty when there is no user message."""
    rows = list(turns[: settings.fact_self_disclosure_max_window_messages])
    users = [i for i, t in enumerate(rows) if t.role == "human"]
    if not users:
        return []
    return rows[users[0] : users[-1] + 1]


def known_pool(facts: Iterable[Fact], since: datetime | None, now: datetime, settings: LongTermSettings) -> list[Fact]:
    """Facts shown to path B as already known: created at or after ``since``, most important
    first, at most ``fact_self_disclosure_known_pool_max``."""
    pool = []
    for fact in facts:
        created = parse_time(fact.created_at, now)
        if since is None or (created is not None and created >= since):
            pool.append(fact)
    pool.sort(key=lambda f: (-f.importance, f.created_at))
    return pool[: settings.fact_self_disclosure_known_pool_max]


# --- fact archive ------------------------------------------------------------------------


def archive_split(
    facts: Sequence[Fact], now: datetime, last_attempt_at: datetime | None, settings: LongTermSettings
) -> tuple[list[Fact], list[Fact]] | None:
    """Split ``facts`` into (kept, to archive) or None when the last attempt was less than
    ``fact_archive_cooldown_hours`` ago. Archived: absorbed AND created more than
    ``fact_archive_age_days`` ago (a fact without a valid created_at stays)."""
    if last_attempt_at is not None and now - last_attempt_at < timedelta(hours=settings.fact_archive_cooldown_hours):
        return None
    limit = timedelta(days=settings.fact_archive_age_days)
    kept: list[Fact] = []
    archived: list[Fact] = []
    for fact in facts:
        # Only an absorbed fact can move: its time is parsed only then (parsing every
        # fact's was most of the check's cost, 100 ms at 50,000 facts).
        created = parse_time(fact.created_at, now) if fact.absorbed else None
        if created is not None and now - created > limit:
            archived.append(fact)
        else:
            kept.append(fact)
    return kept, archived


def unabsorbed(facts: Iterable[Fact], min_importance: int) -> list[Fact]:
    """Facts not yet used by a reflection with at least ``min_importance``."""
    return [f for f in facts if not f.absorbed and f.importance >= min_importance]


def facts_by_id(facts: Iterable[Fact]) -> Mapping[str, Fact]:
    """Index facts by id (the last one wins)."""
    return {f.id: f for f in facts}
