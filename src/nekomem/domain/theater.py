"""Theater capsules: the story summaries the reference's numeric theater keeps in memory.

The reference's theater (``main_routers/numeric_theater_router.py``) archives each played
session of a story as ONE system message posted to ``/cache``, tagged in its
``metadata``: ``source=theater_numeric_v2``, ``memory_tier=episode_summary``, ``story_id``,
``session_id``, ``story_title``, ``episode_status`` (paused/completed), ``ending_title``,
``episode_summary``, ``archive_through_revision``, optionally ``run_index``,
``story_run_count``, ``ending_titles_seen`` and ``performed_at``. The reference's memory
server keeps these capsules in recent.json with that metadata and:

- upserts one capsule per (story, session): a retry that changes nothing keeps its slot, a
  changed one (resumed, paused again, completed) moves to the end; the previous version is
  kept inside the new one's metadata so that a declined (retracted) archive can restore it;
- numbers the sessions of a story (``run_index``), counts them (``story_run_count``) and
  collects the endings reached (``ending_titles_seen``);
- keeps at most the newest 3 sessions per story and 30 capsules in all;
- mirrors the capsules of each story into the journal as one event (session id
  ``theater-story-<sha256(name \\x1f story_id)>``), rebuilt from recent on every change;
- never derives facts or reflections from them;
- renders each in the working context as a "we performed this story" note, not as dialogue.

Everything here is pure: the recent actor passes the window in and persists the result.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from datetime import datetime, timezone
from typing import Any

import msgspec

from nekomem.domain.turns import Turn, parse_iso

THEATER_SOURCE = "theater_numeric_v2"
EPISODE_TIER = "episode_summary"
PREVIOUS_KEY = "_theater_previous_episode"  # the version a retraction restores
_STORY_WIDE = ("story_run_count", "ending_titles_seen")  # describe the story, not the episode


_SLASH_DATE = re.compile(r"(\d{4})[/.](\d{1,2})[/.](\d{1,2})(?:[ T](\d{1,2}):(\d{2})(?::(\d{2}))?)?")
_EPOCH_MS = 10**11  # an epoch number beyond this is milliseconds (JavaScript's Date.now())


def performed_at_iso(value: object) -> str | None:
    """A capsule's ``performed_at`` as an ISO 8601 string; None when absent or empty.

    Accepted as the theater and its tools write it: an ISO 8601 string (kept as given), a
    date written with slashes or dots (``2026/12/06``, ``2026.12.06 21:30``), or an epoch
    number (seconds, or milliseconds beyond 10^11), also as a string of digits; those are
    converted (an epoch to UTC, a slash date as a time without offset, read as UTC like
    any such time). Raises ValueError for anything else (a list, ``true``, a word, a date
    out of range)."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, str):
        text = value.strip()
        parsed = parse_iso(text)
        if parsed is not None:
            try:
                parsed.astimezone(timezone.utc)  # the journal stores it in UTC
            except (ValueError, OverflowError):
                raise ValueError("performed_at is out of range") from None
            return text
        slash = _SLASH_DATE.fullmatch(text)
        if slash is not None:
            year, month, day, hour, minute, second = (int(p) if p else 0 for p in slash.groups())
            try:
                return datetime(year, month, day, hour, minute, second).isoformat()
            except ValueError:
                raise ValueError(f"performed_at {text!r} is not a date") from None
        if re.fullmatch(r"-?\d+(\.\d+)?", text):
            value = float(text)
        else:
            raise ValueError("performed_at must be an ISO 8601 time, a date like 2026/12/06, or an epoch number")
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"performed_at must be a time, not {type(value).__name__}")
    seconds = value / 1000 if abs(value) >= _EPOCH_MS else value
    try:
        return datetime.fromtimestamp(seconds, tz=timezone.utc).isoformat()
    except (ValueError, OverflowError, OSError):
        raise ValueError("performed_at is an epoch number out of range") from None


def stored_performed_at(turn: Turn) -> str | None:
    """The journal time of a theater message: its ``performed_at`` when readable, else
    None (a capsule written before the edge checked it, or edited on disk, must not stop
    every later theater write)."""
    try:
        return performed_at_iso(metadata(turn).get("performed_at"))
    except ValueError:
        return None


def metadata(turn: Turn) -> dict[str, Any]:
    return turn.metadata or {}


def is_theater(turn: Turn) -> bool:
    """Any message the theater wrote (a capsule, or a legacy full-text row)."""
    return metadata(turn).get("source") == THEATER_SOURCE


def is_capsule(turn: Turn) -> bool:
    """A theater episode summary: the only shape /cache stores through the upsert path."""
    meta = metadata(turn)
    return meta.get("source") == THEATER_SOURCE and meta.get("memory_tier") == EPISODE_TIER


def episode_key(turn: Turn) -> tuple[str, str]:
    meta = metadata(turn)
    return str(meta.get("story_id") or ""), str(meta.get("session_id") or "")


def positive_int(value: object) -> int:
    """A theater counter: a positive int, anything else 0."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _with_meta(turn: Turn, meta: dict[str, Any]) -> Turn:
    return msgspec.structs.replace(turn, metadata=meta)


def _titles(seen: list[str], *more: object) -> None:
    for title in more:
        text = str(title or "").strip()
        if text and text not in seen:
            seen.append(text)


def _payload(turn: Turn) -> tuple[str, str, dict[str, Any]]:
    meta = {k: v for k, v in metadata(turn).items() if k not in _STORY_WIDE}
    return turn.role, turn.text, meta


def merge_capsule(window: Sequence[Turn], incoming: Turn, *, per_story: int, total: int) -> tuple[list[Turn], Turn, bool]:
    """Upsert ``incoming`` (a capsule) into ``window``.

    Returns ``(new window, the capsule as stored, kept)``; ``kept`` is False when the
    per-story limit evicted the capsule itself (an old session arriving late).
    """
    key = episode_key(incoming)
    story_id = key[0]
    previous_index = next((i for i, t in enumerate(window) if is_capsule(t) and episode_key(t) == key), None)
    previous = window[previous_index] if previous_index is not None else None
    merged = [t for t in window if not (is_capsule(t) and episode_key(t) == key)]

    known_total = 0
    endings: list[str] = []
    run_position = 0
    for position, turn in enumerate(merged):
        if not (is_capsule(turn) and metadata(turn).get("story_id") == story_id):
            continue
        run_position += 1
        meta = metadata(turn)
        run_index = positive_int(meta.get("run_index"))
        if not run_index:  # a capsule from before run numbers: numbered by position
            run_index = run_position
            merged[position] = _with_meta(turn, {**meta, "run_index": run_index})
        known_total = max(known_total, run_index, positive_int(meta.get("story_run_count")))
        _titles(endings, *(meta.get("ending_titles_seen") or []), meta.get("ending_title"))

    meta_in = dict(metadata(incoming))
    prev_meta = metadata(previous) if previous is not None else {}
    if previous is not None:
        if prev_meta.get("archive_through_revision") == meta_in.get("archive_through_revision"):
            backup = prev_meta.get(PREVIOUS_KEY)
        else:
            backup = previous.to_disk()
            backup["data"].get("metadata", {}).pop(PREVIOUS_KEY, None)
        if backup:
            meta_in[PREVIOUS_KEY] = backup
    run_index = positive_int(prev_meta.get("run_index"))
    if run_index:
        known_total = max(known_total, positive_int(prev_meta.get("story_run_count")))
    else:
        run_index = positive_int(meta_in.get("run_index")) or known_total + 1
    known_total = max(known_total, positive_int(meta_in.get("story_run_count")))
    _titles(endings, *(prev_meta.get("ending_titles_seen") or []), prev_meta.get("ending_title"), meta_in.get("ending_title"))
    meta_in.update(run_index=run_index, story_run_count=max(known_total, run_index), ending_titles_seen=endings)
    stored = _with_meta(incoming, meta_in)

    if previous is not None and previous_index is not None and _payload(stored) == _payload(previous):
        # A retry that changes nothing keeps its slot and its time: stored once.
        stored = previous
        merged.insert(previous_index, previous)
    else:
        merged.append(stored)

    story = [i for i, t in enumerate(merged) if is_capsule(t) and metadata(t).get("story_id") == story_id]
    ranked = sorted(story, key=lambda i: (positive_int(metadata(merged[i]).get("run_index")), i))
    drop = set(ranked[:-per_story]) if per_story > 0 else set(ranked)
    kept = not any(merged[i] is stored for i in drop)
    merged = [t for i, t in enumerate(merged) if i not in drop]
    capsules = [i for i, t in enumerate(merged) if is_capsule(t)]
    drop_all = set(capsules[:-total]) if total > 0 else set(capsules)
    merged = [t for i, t in enumerate(merged) if i not in drop_all]
    return merged, stored, kept


def capsules_kept(before: Sequence[Turn], after: Sequence[Turn]) -> bool:
    """True when ``after`` holds exactly the theater messages of ``before``, unchanged and
    in order (a review answer that rewrote one is not applied)."""
    return [t for t in before if is_theater(t)] == [t for t in after if is_theater(t)]


def matches_retraction(turn: Turn, story_id: str, session_id: str, through: int) -> bool:
    """The capsule written by one archive range (story, session, through revision)."""
    if not is_theater(turn):
        return False
    meta = metadata(turn)
    rev = meta.get("archive_through_revision")
    return episode_key(turn) == (story_id, session_id) and isinstance(rev, int) and not isinstance(rev, bool) and rev == through


def restore_retracted(window: Sequence[Turn], story_id: str, session_id: str, through: int) -> list[Turn]:
    """``window`` with the retracted capsule replaced by its previous version (if it had an
    older one of the same session), without nesting backups."""
    from nekomem.domain.turns import from_disk

    out: list[Turn] = []
    for turn in window:
        if not matches_retraction(turn, story_id, session_id, through):
            out.append(turn)
            continue
        backup = metadata(turn).get(PREVIOUS_KEY)
        previous = from_disk(backup) if isinstance(backup, dict) else None
        if (
            previous is not None
            and episode_key(previous) == (story_id, session_id)
            and positive_int(metadata(previous).get("archive_through_revision")) < through
        ):
            out.append(msgspec.structs.replace(previous, ts=previous.ts or turn.ts))
    return out


def without_story(window: Sequence[Turn], story_id: str) -> list[Turn]:
    """``window`` without any theater message of ``story_id``."""
    return [t for t in window if not (is_theater(t) and episode_key(t)[0] == story_id)]


def _latest(window: Sequence[Turn]) -> tuple[dict[tuple[str, str], dict[str, Any]], dict[str, tuple[str, str]]]:
    """The latest metadata of each (story, session), and each story's latest run."""
    by_episode: dict[tuple[str, str], dict[str, Any]] = {}
    for turn in window:
        if is_theater(turn):
            key = episode_key(turn)
            by_episode.pop(key, None)  # re-insert: the latest position counts
            by_episode[key] = metadata(turn)
    latest: dict[str, tuple[str, str]] = {}
    rank: dict[str, tuple[int, int]] = {}
    for position, (key, meta) in enumerate(by_episode.items()):
        r = (positive_int(meta.get("run_index")), position)
        if r >= rank.get(key[0], (-1, -1)):
            rank[key[0]] = r
            latest[key[0]] = key
    return by_episode, latest


def _summary(meta: dict[str, Any]) -> str:
    return str(meta.get("episode_summary") or meta.get("ending_summary") or "").strip()


def stories(window: Sequence[Turn]) -> list[dict[str, Any]]:
    """``theater/stories``: one entry per story with its title and the sessions' summaries."""
    by_episode, _ = _latest(window)
    out: dict[str, dict[str, Any]] = {}
    for (story_id, _session), meta in by_episode.items():
        if not story_id:
            continue
        story = out.setdefault(story_id, {"story_id": story_id, "title": "", "memory_summaries": []})
        story["title"] = str(meta.get("story_title") or story["title"] or story_id)
        summary = _summary(meta)
        if summary:
            story["memory_summaries"].append(summary)
    return list(out.values())


def story_event_id(character: str, story_id: str) -> str:
    """The journal session id of a story's capsules (stable across rebuilds)."""
    return "theater-story-" + hashlib.sha256(f"{character}\x1f{story_id}".encode()).hexdigest()


def journal_events(character: str, window: Sequence[Turn]) -> list[tuple[str, list[Turn]]]:
    """The theater messages of ``window`` grouped by story as journal events, in window order."""
    grouped: dict[str, list[Turn]] = {}
    for turn in window:
        if is_theater(turn) and episode_key(turn)[0]:
            grouped.setdefault(episode_key(turn)[0], []).append(turn)
    return [(story_event_id(character, story_id), turns) for story_id, turns in grouped.items()]


def rendered_lines(window: Sequence[Turn], render: Any) -> dict[int, str | None]:
    """Window index -> the capsule text to show instead of the message (None: skip it).

    Each (story, session) is shown once, at its first position, from its latest metadata;
    only a story's latest run carries the story-wide count and endings. ``render`` is
    :func:`nekomem.domain.locale.theater.capsule_text` with language and names bound.
    """
    by_episode, latest = _latest(window)
    out: dict[int, str | None] = {}
    seen: set[tuple[str, str]] = set()
    for index, turn in enumerate(window):
        if not is_theater(turn):
            continue
        key = episode_key(turn)
        if key in seen:
            out[index] = None
            continue
        seen.add(key)
        meta = by_episode[key]
        newest = latest.get(key[0]) == key
        endings = meta.get("ending_titles_seen")
        out[index] = render(
            title=str(meta.get("story_title") or ""),
            status=str(meta.get("episode_status") or "paused"),
            ending=str(meta.get("ending_title") or ""),
            summary=_summary(meta),
            run_index=positive_int(meta.get("run_index")),
            story_run_count=positive_int(meta.get("story_run_count")) if newest else 0,
            ending_titles=[str(e) for e in endings] if newest and isinstance(endings, list) else [],
        )
    return out
