"""``POST /internal/memory/{name}/repetition_insights``: the memory browser's review of
phrases the character keeps repeating (see :mod:`nekomem.domain.repetition`).

Body ``{"language": en|es|pt|ru|ja|ko|zh-CN|zh-TW, "assistant_message_limit": 3..100
(default 100)}``; the answer has the reference's shape: ``{"success": true,
"schema_version", "artifact_type", "character_name", "language", "parameters":
{assistant_message_limit, message_count_threshold}, "summary": {assistant_message_count,
candidate_count, returned_candidate_count, candidates_truncated, source_available},
"candidates": [{phrase, normalized_phrase, language, message_count, occurrence_count,
covered_by_rule_ids, status}]}``. Read only: nothing is written, no model is called, and
an unknown character is analysed as having no replies (``source_available: false``).
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path
from typing import Annotated, Literal

from msgspec import Meta
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from nekomem.domain import repetition
from nekomem.http.bodies import character_name, decode_body
from nekomem.http.runtime_access import runtime_of
from nekomem.http.schemas import Body
from nekomem.stores.timeindex_read import TimeIndexReader


class RepetitionBody(Body):
    language: Literal["en", "es", "pt", "ru", "ja", "ko", "zh-CN", "zh-TW"]
    assistant_message_limit: Annotated[int, Meta(ge=3, le=100)] = 100


def _replies(path: Path, limit: int, scan_max: int) -> tuple[list[str], bool]:
    if not path.exists():
        return [], False
    try:
        with TimeIndexReader.read_only(path) as reader:
            texts, _skipped = reader.latest_texts("ai", limit, scan_max)
    except sqlite3.Error:
        return [], False
    return texts, True


async def repetition_insights(request: Request) -> Response:
    rt = runtime_of(request)
    name = character_name(request)
    body = await decode_body(request, RepetitionBody)
    s = rt.settings.recent
    paths = rt.character_paths(name)
    replies, available = await asyncio.to_thread(_replies, paths.time_index_db, body.assistant_message_limit, s.repetition_scan_rows)
    report = await asyncio.to_thread(
        repetition.mine, replies, body.language, min_messages=s.repetition_min_messages, max_candidates=s.repetition_max_candidates
    )
    summary = {
        "assistant_message_count": len(replies),
        "candidate_count": report["candidate_count"],
        "returned_candidate_count": report["returned_candidate_count"],
        "candidates_truncated": report["candidates_truncated"],
        "source_available": available,
    }
    return JSONResponse(
        {
            "success": True,
            "schema_version": repetition.SCHEMA_VERSION,
            "artifact_type": repetition.ARTIFACT_TYPE,
            "character_name": name,
            "language": body.language,
            "parameters": {"assistant_message_limit": body.assistant_message_limit, "message_count_threshold": s.repetition_min_messages},
            "summary": summary,
            "candidates": report["candidates"],
        }
    )
