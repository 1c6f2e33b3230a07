"""``/internal/knowledge/*``: the reference's public knowledge routes
(``app/memory_server/knowledge_routes.py``), over :mod:`nekomem.runtime.knowledge`.

Answers keep the reference's shapes, which N.E.K.O.'s chat server reads: a success is
``{"ok": true, ...payload, "ready", "enabled", "tool_available"}``; a refusal the service
decides (``not_found``, ``knowledge_busy``, a rejected pack) is ``{"ok": false, "reason",
...availability}`` with status 200. A malformed request is 400 (413 for a pack over the
limit) and carries both the reference's ``ok``/``reason`` and the project's
``status``/``error_code``/``message``. The routes sit behind the request guard (Host,
Origin, token; ``packs/import`` alone also takes ``multipart/form-data``, as the chat
server's upload proxy sends it) and limited mode (409 like every memory route).
docs/KNOWLEDGE.md has the route table.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import AsyncGenerator, Callable
from typing import Any

from starlette.datastructures import UploadFile
from starlette.formparsers import MultiPartParser
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from nekomem.domain.knowledge_pack import MATERIAL_TYPES, MAX_PACK_BYTES
from nekomem.http.errors import error_response
from nekomem.http.operations import Operation
from nekomem.http.runtime_access import runtime_of
from nekomem.runtime.knowledge import KnowledgeService, KnowledgeUnavailable
from nekomem.runtime.knowledge_lookup import DEFAULT_QUERY_BUDGET_MS, MAX_QUERY_BUDGET_MS

log = logging.getLogger("nekomem.http.knowledge")

PREFIX = "/internal/knowledge"
JSON_BODY_MAX_BYTES = 64 * 1024
PACK_BODY_MAX_BYTES = MAX_PACK_BYTES + 64 * 1024
# A query answers within its budget; this much more covers the thread hand-off.
QUERY_SLACK_SECONDS = 0.5
MAX_ENTRIES_LIMIT = 100
MAX_ENTRIES_OFFSET = 20_000


def _service(request: Request) -> KnowledgeService:
    return runtime_of(request).knowledge


def _refused(status: int, reason: str, message: str) -> JSONResponse:
    return error_response(status, reason, message, ok=False, reason=reason)


async def _call(request: Request, work: Callable[[KnowledgeService], dict[str, Any]]) -> Response:
    """Run ``work`` off the event loop and answer in the reference's envelope."""
    service = _service(request)
    try:
        payload = await asyncio.to_thread(work, service)
    except KnowledgeUnavailable as exc:
        return JSONResponse({"ok": False, "reason": exc.reason, **service.availability()})
    except Exception as exc:
        log.warning("a knowledge request failed: %s", type(exc).__name__, exc_info=True)
        return _refused(500, "knowledge_error", f"the knowledge request failed: {type(exc).__name__}")
    # The payload may carry its own ``ok`` (a refused cancel, a rejected pack).
    return JSONResponse({"ok": True, **payload, **service.availability()})


async def _read_bounded(request: Request, max_bytes: int) -> bytes | None:
    """The body, or None when it is (or declares to be) longer than ``max_bytes``."""
    try:
        declared = int(request.headers.get("content-length") or 0)
    except ValueError:
        declared = 0
    if declared > max_bytes:
        return None
    body = bytearray()
    async for chunk in request.stream():
        body.extend(chunk)
        if len(body) > max_bytes:
            return None
    return bytes(body)


async def _json_object(request: Request) -> dict[str, Any] | None:
    raw = await _read_bounded(request, JSON_BODY_MAX_BYTES)
    if raw is None:
        return None
    try:
        payload = json.loads(raw.decode("utf-8")) if raw.strip() else {}
    except (UnicodeDecodeError, ValueError):
        return None
    return payload if isinstance(payload, dict) else None


def _invalid() -> JSONResponse:
    return _refused(400, "invalid_request", "the request body is not a JSON object with the fields this route needs")


def _pack_id(payload: dict[str, Any]) -> str:
    value = payload.get("pack_id")
    return value.strip() if isinstance(value, str) else ""


def _int(value: object, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


# -- the chat session's side ---------------------------------------------------------


async def query(request: Request) -> Response:
    payload = await _json_object(request)
    if payload is None or not isinstance(payload.get("query"), str):
        return _invalid()
    text: str = payload["query"]
    language = payload.get("language")
    budget_ms = _int(payload.get("budget_ms"), DEFAULT_QUERY_BUDGET_MS)
    service = _service(request)

    def run(svc: KnowledgeService) -> dict[str, Any]:
        return svc.query(
            query=text,
            mode=str(payload.get("mode") or "lookup"),
            material_type=str(payload.get("material_type") or "auto"),
            limit=_int(payload.get("limit"), 3),
            budget_ms=budget_ms,
            language=language if isinstance(language, str) else None,
        )

    budget = min(max(budget_ms, 1), MAX_QUERY_BUDGET_MS) / 1000
    try:
        return await asyncio.wait_for(_call(request, run), timeout=budget + QUERY_SLACK_SECONDS)
    except TimeoutError:
        empty = {"result": "timeout", "context": "", "hits": [], "card_ids": [], "retrieval_mode": "", "elapsed_ms": int(budget * 1000)}
        return JSONResponse({"ok": True, **empty, **service.availability()})


async def availability(request: Request) -> Response:
    return JSONResponse({"ok": True, **_service(request).availability()})


# -- management: reads ---------------------------------------------------------------


async def status(request: Request) -> Response:
    return await _call(request, lambda svc: {"status": svc.status()})


async def entries(request: Request) -> Response:
    params = request.query_params
    pack_id = params.get("pack_id", "")
    try:
        limit = int(params.get("limit", "50"))
        offset = int(params.get("offset", "0"))
    except ValueError:
        return _refused(400, "invalid_request", "limit and offset must be integers")
    if not 1 <= limit <= MAX_ENTRIES_LIMIT or not 0 <= offset <= MAX_ENTRIES_OFFSET or len(pack_id) > 64:
        return _refused(400, "invalid_request", f"limit must be 1..{MAX_ENTRIES_LIMIT}, offset 0..{MAX_ENTRIES_OFFSET}")
    text = params.get("query", "")
    return await _call(request, lambda svc: svc.list_entries(query=text, pack_id=pack_id, limit=limit, offset=offset))


async def entry(request: Request) -> Response:
    pack_id = request.query_params.get("pack_id", "")
    title = request.query_params.get("title", "")
    if not 2 <= len(pack_id) <= 64 or not 1 <= len(title) <= 500:
        return _refused(400, "invalid_request", "pack_id (2..64 characters) and title (1..500) are required")
    return await _call(request, lambda svc: svc.get_entry(pack_id, title))


async def packs(request: Request) -> Response:
    return await _call(request, lambda svc: {"packs": svc.list_packs()})


async def jobs(request: Request) -> Response:
    return await _call(request, lambda svc: {"jobs": svc.list_jobs()})


async def diagnostics(request: Request) -> Response:
    return await _call(request, lambda svc: svc.diagnostics())


# -- management: writes --------------------------------------------------------------


async def settings(request: Request) -> Response:
    payload = await _json_object(request)
    if payload is None or not isinstance(payload.get("enabled"), bool):
        return _invalid()
    enabled: bool = payload["enabled"]
    return await _call(request, lambda svc: svc.set_enabled(enabled))


async def _uploaded(request: Request, body: bytes) -> bytes | None:
    """The uploaded file of a multipart import: the ``pack`` field, else the only file."""

    async def stream() -> AsyncGenerator[bytes, None]:
        yield body

    try:
        form = await MultiPartParser(request.headers, stream(), max_files=1, max_fields=8, max_part_size=JSON_BODY_MAX_BYTES).parse()
    except Exception:  # noqa: BLE001 - any malformed form is an invalid request
        return None
    try:
        uploads = [value for value in form.values() if isinstance(value, UploadFile)]
        named = form.get("pack")
        upload = named if isinstance(named, UploadFile) else (uploads[0] if len(uploads) == 1 else None)
        return await upload.read() if upload is not None else None
    finally:
        await form.close()


async def import_pack(request: Request) -> Response:
    """Import a pack sent as the JSON body or as a multipart file upload."""
    raw = await _read_bounded(request, PACK_BODY_MAX_BYTES)
    if raw is None:
        return _refused(413, "pack_too_large", f"a pack may have at most {MAX_PACK_BYTES} bytes")
    if request.headers.get("content-type", "").lower().startswith("multipart/form-data"):
        upload = await _uploaded(request, raw)
        if upload is None:
            return _refused(400, "invalid_request", "a multipart import carries one file (field 'pack')")
        raw = upload
    pack = raw
    return await _call(request, lambda svc: svc.import_pack(pack))


async def _job_action(request: Request, action: Callable[[KnowledgeService, str], bool]) -> Response:
    payload = await _json_object(request)
    job_id = payload.get("job_id") if payload else None
    if not isinstance(job_id, str) or not job_id:
        return _invalid()
    return await _call(request, lambda svc: {"ok": action(svc, job_id), "job_id": job_id})


async def cancel_job(request: Request) -> Response:
    return await _job_action(request, lambda svc, job_id: svc.cancel_job(job_id))


async def discard_job(request: Request) -> Response:
    return await _job_action(request, lambda svc, job_id: svc.discard_job(job_id))


async def entry_disabled(request: Request) -> Response:
    payload = await _json_object(request)
    if (
        payload is None
        or not _pack_id(payload)
        or not isinstance(payload.get("title"), str)
        or not isinstance(payload.get("disabled"), bool)
    ):
        return _invalid()
    pack_id, title, disabled = _pack_id(payload), str(payload["title"]), bool(payload["disabled"])
    return await _call(request, lambda svc: svc.set_entry_disabled(pack_id, title, disabled))


async def auto_context(request: Request) -> Response:
    payload = await _json_object(request)
    if payload is None or not _pack_id(payload) or not isinstance(payload.get("enabled"), bool):
        return _invalid()
    pack_id, enabled = _pack_id(payload), bool(payload["enabled"])
    return await _call(request, lambda svc: svc.set_auto_context(pack_id, enabled))


async def index_policy(request: Request) -> Response:
    payload = await _json_object(request)
    enabled = payload.get("local_embedding_enabled") if payload else None
    if payload is None or not _pack_id(payload) or not isinstance(enabled, bool):
        return _invalid()
    pack_id, on = _pack_id(payload), enabled
    return await _call(request, lambda svc: svc.set_local_embedding(pack_id, on))


async def material_type(request: Request) -> Response:
    payload = await _json_object(request)
    if payload is None or not _pack_id(payload):
        return _invalid()
    kind = payload.get("material_type")
    if kind is not None and kind not in MATERIAL_TYPES:
        return _invalid()
    pack_id = _pack_id(payload)
    return await _call(request, lambda svc: svc.set_material_type(pack_id, kind))


async def remove_pack(request: Request) -> Response:
    payload = await _json_object(request)
    if payload is None or not _pack_id(payload):
        return _invalid()
    pack_id = _pack_id(payload)
    return await _call(request, lambda svc: svc.remove_pack(pack_id))


TABLE: list[tuple[str, str, Any, str]] = [
    ("/query", "POST", query, "Look up (or sample) public knowledge entries within a time budget"),
    ("/availability", "GET", availability, "Whether the query_public_knowledge tool should be offered"),
    ("/status", "GET", status, "Overview: packs, entries, vectors, embedding state"),
    ("/entries", "GET", entries, "A page of entries (query, pack_id, limit, offset)"),
    ("/entry", "GET", entry, "One entry with its whole content (pack_id, title)"),
    ("/packs", "GET", packs, "Installed packs with their policies and vector state"),
    ("/packs/jobs", "GET", jobs, "Import jobs, newest first"),
    ("/diagnostics/recent", "GET", diagnostics, "The last lookups and vector batches (metadata only)"),
    ("/settings", "POST", settings, "Switch public knowledge on or off ({enabled})"),
    ("/packs/import", "POST", import_pack, "Import a pack (JSON body or multipart upload) as a durable job"),
    ("/packs/jobs/cancel", "POST", cancel_job, "Cancel a queued or building import ({job_id})"),
    ("/packs/jobs/discard", "POST", discard_job, "Forget a finished import job ({job_id})"),
    ("/entry/disabled", "POST", entry_disabled, "Disable or enable one entry ({pack_id, title, disabled})"),
    ("/packs/auto-context", "POST", auto_context, "A pack's automatic-context switch ({pack_id, enabled})"),
    ("/packs/index-policy", "POST", index_policy, "A pack's local vectors ({pack_id, local_embedding_enabled})"),
    ("/packs/material-type", "POST", material_type, "Override a pack's material type ({pack_id, material_type})"),
    ("/packs/remove", "POST", remove_pack, "Uninstall a pack: its file, index entries and vectors ({pack_id})"),
]


def _param(name: str, schema: dict[str, Any], required: bool = False) -> dict[str, Any]:
    return {"name": name, "in": "query", "required": required, "schema": schema}


PARAMETERS: dict[str, list[dict[str, Any]]] = {
    "/entries": [
        _param("query", {"type": "string"}),
        _param("pack_id", {"type": "string", "maxLength": 64}),
        _param("limit", {"type": "integer", "minimum": 1, "maximum": MAX_ENTRIES_LIMIT, "default": 50}),
        _param("offset", {"type": "integer", "minimum": 0, "maximum": MAX_ENTRIES_OFFSET, "default": 0}),
    ],
    "/entry": [
        _param("pack_id", {"type": "string", "minLength": 2, "maxLength": 64}, True),
        _param("title", {"type": "string", "minLength": 1, "maxLength": 500}, True),
    ],
}


def operations() -> list[Operation]:
    """Every route of the knowledge packs (a POST takes a JSON object)."""
    return [
        Operation(PREFIX + path, method, handler, summary, PARAMETERS.get(path, ()), dict[str, Any] if method == "POST" else None)
        for path, method, handler, summary in TABLE
    ]
