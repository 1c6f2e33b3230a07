"""``POST /internal/memory/import_external_markdown``: the memory browser's import of an
OpenClaw / Hermes workspace (already parsed and previewed by the chat server).

Body (the reference's): ``{character_name, source_format: "openclaw"|"hermes",
imported_files: [str], candidates: [{text, entity: master|neko|relationship, target:
persona|facts, source_file, source_section?, event_date?}], warning_count?}``. Answer:
``{"status": "success", character_name, source_format, imported_files, added_persona,
added_facts, skipped_duplicates, warning_count}``.

Implemented differently from the reference, which fuses persona candidates with an LLM
(to fit its persona token budget) and runs fact extraction over daily journals: here a
persona candidate becomes one ordinary (not protected) persona entry of source
``external_import`` whose id is derived from its text (importing twice adds nothing), and
every facts candidate becomes one fact (importance 7, its ``event_date`` as event time,
the file/section/format kept in ``source_ref.external_import``), deduplicated like any
imported fact. The working context's persona budget still bounds what is shown. No model
is called, so the import cannot fail half-way on a model error.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from nekomem.actors.messages import ImportCard, ImportFacts
from nekomem.domain.layers import FACTS, PERSONA
from nekomem.domain.turns import parse_iso
from nekomem.http.bodies import decode_body
from nekomem.http.character_origin import is_new, note_created
from nekomem.http.errors import ApiError
from nekomem.http.runtime_access import ask, runtime_of
from nekomem.http.schemas import Body
from nekomem.runtime.clock import iso
from nekomem.stores.layout import InvalidName, validate_name
from nekomem.wire.answers import CardImportAnswer, ImportAnswer

ENTITIES = ("master", "neko", "relationship")


class ExternalImportBody(Body):
    character_name: str
    source_format: str
    imported_files: list[str] = []
    candidates: list[Any] = []
    warning_count: int = 0
    language: str | None = None
    render_language: str | None = None


def _candidate(raw: Any, index: int, max_chars: int) -> dict[str, Any]:
    """One checked candidate; ApiError 400 naming it otherwise."""
    if not isinstance(raw, dict):
        raise ApiError(400, "bad_candidate", f"candidates[{index}] must be an object")
    text = str(raw.get("text") or "").strip()
    entity = str(raw.get("entity") or "master")
    target = raw.get("target")
    source_file = str(raw.get("source_file") or "")
    if not text or len(text) > max_chars:
        raise ApiError(400, "bad_candidate", f"candidates[{index}].text must have 1..{max_chars} characters")
    if entity not in ENTITIES or target not in ("persona", "facts") or not source_file:
        raise ApiError(400, "bad_candidate", f"candidates[{index}] needs entity in {ENTITIES}, target persona|facts and a source_file")
    return {**raw, "text": text, "entity": entity, "source_file": source_file}


async def import_external_markdown(request: Request) -> Response:
    rt = runtime_of(request)
    body = await decode_body(request, ExternalImportBody)
    limits = rt.settings.importer
    try:
        name = validate_name(body.character_name, rt.settings.server.name_max_length)
    except InvalidName as exc:
        raise ApiError(400, exc.code, exc.message) from None
    if body.source_format not in ("openclaw", "hermes"):
        raise ApiError(400, "bad_source_format", "source_format must be openclaw or hermes")
    if not 1 <= len(body.candidates) <= limits.external_import_max_entries:
        raise ApiError(400, "bad_candidate_count", f"candidates must hold 1..{limits.external_import_max_entries} items")
    candidates = [_candidate(c, i, limits.external_import_max_entry_chars) for i, c in enumerate(body.candidates)]
    imported_at = iso(rt.clock.now())
    persona = [{"entity": c["entity"], "text": c["text"]} for c in candidates if c["target"] == "persona"]
    facts: list[Mapping[str, object]] = []
    for c in candidates:
        if c["target"] != "facts":
            continue
        # A journal's date is a local calendar day: a naive value is read in this zone.
        event = parse_iso(str(c.get("event_date") or "").strip() or None, naive_tz=None)
        if event is not None and event.tzinfo is None:
            event = event.astimezone()
        origin = {"format": body.source_format, "file": c["source_file"], "section": str(c.get("source_section") or "")}
        origin.update(event_date=c.get("event_date"), imported_at=imported_at)
        fact: dict[str, Any] = {"text": c["text"], "importance": 7, "entity": c["entity"], "source": {"external_import": origin}}
        if event is not None:
            fact["event_start_at"] = event.isoformat()
        facts.append(fact)
    timeout = rt.settings.server.settle_timeout_seconds
    new = await is_new(request, name)
    added_persona = skipped = added_facts = 0
    if persona:
        card = await ask(
            rt,
            name,
            PERSONA,
            lambda reply: ImportCard(entries=persona, source="external_import", protected=False, reply=reply),
            CardImportAnswer,
            timeout=timeout,
        )
        added_persona, skipped = len(card.added), card.skipped_existing
    if facts:
        done = await ask(rt, name, FACTS, lambda reply: ImportFacts(facts=facts, reply=reply), ImportAnswer, timeout=timeout)
        added_facts, skipped = len(done.added), skipped + done.skipped_duplicates
    if new:
        await note_created(request, name)
    return JSONResponse(
        {
            "status": "success",
            "character_name": name,
            "source_format": body.source_format,
            "imported_files": body.imported_files,
            "added_persona": added_persona,
            "added_facts": added_facts,
            "skipped_duplicates": skipped,
            "warning_count": max(0, body.warning_count),
        }
    )


class ExternalImportAnswer(msgspec.Struct):
    status: str
    character_name: str
    source_format: str
    imported_files: list[str]
    added_persona: int
    added_facts: int
    skipped_duplicates: int
    warning_count: int
