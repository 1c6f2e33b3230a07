"""``theater_retractions.json``: tombstones that stop late theater archive writes.

The reference's theater may time out on an archive (``/cache``) that the memory server
still commits later. Two tombstones, kept next to recent.json in the reference's file and
shape (``{"schema": "neko.theater.retractions.v1", "entries": [...],
"forgotten_stories": [...]}``), make such a late write a no-op:

- a **retraction** (``theater/retract`` with an ``archive_request_id``) covers every
  attempt of that archive request up to ``through_attempt``; a later attempt (the player
  chose to remember after all) is stored;
- a **story forget** (``theater/forget``) stores a fresh random ``forget_marker`` that the
  theater attaches to the archives it issues afterwards; a write of that story without the
  current marker was issued before the forget and is dropped.

Both stop applying after a retention time. The file is replaced atomically; an invalid one
reads as empty (it is only ever written whole by this module).
"""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

from nekomem.stores.atomic import atomic_write_json, read_json

FILE_NAME = "theater_retractions.json"
SCHEMA = "neko.theater.retractions.v1"


def _number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class TheaterMarks:
    """The tombstones of one character folder. ``now`` values are epoch seconds."""

    def __init__(self, folder: Path, *, ttl_seconds: float, max_entries: int) -> None:
        self.path = Path(folder) / FILE_NAME
        self.ttl = ttl_seconds
        self.max_entries = max_entries

    def _load(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        raw, status = read_json(self.path, default={})
        if status != "ok" or not isinstance(raw, dict):
            return [], []
        lists = []
        for key in ("entries", "forgotten_stories"):
            values = raw.get(key)
            lists.append([v for v in values if isinstance(v, dict)] if isinstance(values, list) else [])
        return lists[0], lists[1]

    def _save(self, entries: list[dict[str, Any]], forgotten: list[dict[str, Any]]) -> None:
        atomic_write_json(
            self.path,
            {"schema": SCHEMA, "entries": entries[-self.max_entries :], "forgotten_stories": forgotten[-self.max_entries :]},
        )

    def _fresh(self, stamp: object, now: float) -> bool:
        return not _number(stamp) or now - float(stamp) < self.ttl  # type: ignore[arg-type]

    def write_refused(self, story_id: str, request_id: str, attempt: int | None, marker: str | None, now: float) -> bool:
        """True when an archive write must be dropped: its attempt was retracted, or its
        story was forgotten after the write was issued (it lacks the current marker)."""
        entries, forgotten = self._load()
        if request_id:
            for entry in entries:
                if str(entry.get("archive_request_id") or "") != request_id or not self._fresh(entry.get("retracted_at"), now):
                    continue
                through = entry.get("through_attempt")
                if not isinstance(through, int) or isinstance(through, bool) or attempt is None or attempt <= through:
                    return True
        if story_id:
            for entry in forgotten:
                if str(entry.get("story_id") or "") != story_id or not self._fresh(entry.get("forgotten_at"), now):
                    continue
                current = entry.get("forget_marker")
                if not isinstance(current, str) or not current or marker != current:
                    return True
        return False

    def record_retraction(
        self, *, story_id: str, session_id: str, through_revision: int, request_id: str, attempt: int, now: float
    ) -> None:
        """Remember that attempts up to ``attempt`` of ``request_id`` were declined."""
        entries, forgotten = self._load()
        entries = [e for e in entries if str(e.get("archive_request_id") or "") != request_id and self._fresh(e.get("retracted_at"), now)]
        entries.append(
            {
                "story_id": story_id,
                "session_id": session_id,
                "archive_through_revision": through_revision,
                "archive_request_id": request_id,
                "through_attempt": attempt,
                "retracted_at": now,
            }
        )
        self._save(entries, forgotten)

    def record_forget(self, story_id: str, now: float) -> str:
        """Remember that ``story_id`` was forgotten; returns the new forget marker."""
        entries, forgotten = self._load()
        marker = secrets.token_hex(16)
        forgotten = [f for f in forgotten if str(f.get("story_id") or "") != story_id and self._fresh(f.get("forgotten_at"), now)]
        forgotten.append({"story_id": story_id, "forget_marker": marker, "forgotten_at": now})
        self._save(entries, forgotten)
        return marker
