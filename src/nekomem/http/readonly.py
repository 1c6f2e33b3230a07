"""Helpers of the read routes: nothing is created on disk for an unknown character, and
times are shown in the display time zone.

A read route (``/new_dialog``, ``/get_recent_history``, ``/last_conversation_gap``,
``/query_memory``, ``/followup_topics``, the scoped reads, the ``/api/characters`` listings)
first asks :func:`character_exists`; for an unknown character it answers the reference's
empty answer without activating the character, because activation opens (and so creates)
its files.
"""

from __future__ import annotations

import asyncio
from datetime import tzinfo
from typing import Any

from starlette.requests import Request

from nekomem.domain.turns import parse_iso
from nekomem.http.runtime_access import runtime_of

TIME_FIELDS = ("created_at", "event_start_at", "event_end_at", "surfaced_at", "feedback_at", "confirmed_at")


async def character_exists(request: Request, name: str) -> bool:
    """True when ``name`` has a folder with at least one known file, or is active now."""
    rt = runtime_of(request)
    if rt.registry.is_active(name):
        return True
    paths = rt.character_paths(name)
    return await asyncio.to_thread(paths.exists)


def local_iso(value: Any, tz: tzinfo | None) -> Any:
    """An ISO time with an offset converted to ``tz`` (naive and unparsable values are
    returned as they are: a naive stored time already is local)."""
    if not isinstance(value, str) or tz is None:
        return value
    parsed = parse_iso(value, None)
    if parsed is None or parsed.tzinfo is None:
        return value
    return parsed.astimezone(tz).isoformat()


def localise_times(row: Any, tz: tzinfo | None) -> Any:
    """``row`` with its time fields (:data:`TIME_FIELDS`) in ``tz``; a non-dict is returned as is."""
    if not isinstance(row, dict):
        return row
    return {k: local_iso(v, tz) if k in TIME_FIELDS else v for k, v in row.items()}
