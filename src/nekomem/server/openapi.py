"""``GET /openapi.json``: the API described from the msgspec types of
:mod:`nekomem.http.schemas` (the same types that decode the request bodies)."""

from __future__ import annotations

from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

import nekomem
from nekomem.cluster.schemas import DrainBody
from nekomem.domain.layers import listings
from nekomem.http import external_import as ei
from nekomem.http import identity as idn
from nekomem.http import knowledge as kn
from nekomem.http import lifecycle as lc
from nekomem.http import prompt_locale as pl
from nekomem.http import repetition as rp
from nekomem.http import schemas as s
from nekomem.http import scoped as sc
from nekomem.http import theater as th
from nekomem.http.importing import ImportNekoBody

NAME = {"name": "name", "in": "path", "required": True, "schema": {"type": "string", "minLength": 1, "maxLength": 50}}
ID = {"name": "entry_id", "in": "path", "required": True, "schema": {"type": "string", "minLength": 1}}
RID = {"name": "reflection_id", "in": "path", "required": True, "schema": {"type": "string", "minLength": 1}}
# The {layer} path parameter: its enum is filled from the layer declaration when the
# document is built (see layer_parameter), so a declared layer is documented by itself.
LAYER = {"name": "layer", "in": "path", "required": True, "schema": {"type": "string"}}


def layer_parameter() -> dict[str, Any]:
    """The {layer} parameter: "recent" and every declared layer's listing."""
    return {**LAYER, "schema": {"type": "string", "enum": ["recent", *listings()]}}


PAGE = [
    {"name": "offset", "in": "query", "required": False, "schema": {"type": "integer", "minimum": 0}},
    {"name": "limit", "in": "query", "required": False, "schema": {"type": "integer", "minimum": 1}},
    {"name": "status", "in": "query", "required": False, "schema": {"type": "string"}},
    {"name": "entity", "in": "query", "required": False, "schema": {"type": "string"}},
]
TEXT = "text/plain"
QUERY = {"name": "query", "in": "path", "required": True, "schema": {"type": "string", "minLength": 1}}
SUBJECT_KEYS = {
    "name": "subject",
    "in": "query",
    "required": False,
    "schema": {"type": "array", "items": {"type": "string"}, "maxItems": 64},
    "description": "a subject key <subject_kind>:<subject_id>, repeated",
}
HTML = "text/html"


def query(*names: str) -> list[dict[str, Any]]:
    """Optional string query parameters."""
    return [{"name": n, "in": "query", "required": False, "schema": {"type": "string"}} for n in names]


# /release_character's claim (nekomem.runtime.release_claims): token and generation are required.
RELEASE_CLAIM = [
    {"name": "hold_derived_task_admission", "in": "query", "required": False, "schema": {"type": "boolean", "default": False}},
    {"name": "derived_task_claim_token", "in": "query", "required": True, "schema": {"type": "string", "minLength": 1}},
    {"name": "derived_task_claim_generation", "in": "query", "required": True, "schema": {"type": "integer"}},
]
BROWSE_PAGE = [p for p in PAGE if p["name"] in ("offset", "limit")]
ASSET = {"name": "path", "in": "path", "required": True, "schema": {"type": "string"}}

# (path, method, parameters, request type, response type or TEXT, summary)
OPERATIONS: list[tuple[str, str, list[dict[str, Any]], type | None, Any, str]] = [
    ("/health", "get", [], None, s.HealthAnswer, "Liveness, launcher probe and storage state"),
    ("/metrics", "get", [], None, TEXT, "Prometheus metrics (text exposition format)"),
    ("/cache/{name}", "post", [NAME], s.HistoryBody, s.WriteAnswer, "Store finished turns"),
    ("/process/{name}", "post", [NAME], s.HistoryBody, s.WriteAnswer, "Store, then compress at session end"),
    ("/renew/{name}", "post", [NAME], s.HistoryBody, s.WriteAnswer, "Store, then compress in detailed mode"),
    ("/settle/{name}", "post", [NAME], s.HistoryBody, s.WriteAnswer, "Compress what is cached"),
    ("/new_dialog/{name}", "get", [NAME], None, TEXT, "The working context"),
    ("/get_recent_history/{name}", "get", [NAME], None, TEXT, "The recent window as text"),
    ("/last_conversation_gap/{name}", "get", [NAME], None, s.GapAnswer, "Seconds since the last turn"),
    ("/api/memory/powerful_memory_config", "get", [], None, s.EnabledAnswer, "The powerful-memory switch"),
    ("/api/memory/powerful_memory_config", "post", [], s.PowerfulMemoryBody, s.ToggleAnswer, "Set the powerful-memory switch"),
    ("/internal/memory/reset_confirmed_at", "post", [], None, s.CountAnswer, "Restart confirmed reflections' clocks"),
    ("/internal/storage/startup/continue", "post", [], s.StartupGateBody, dict[str, Any], "Leave limited mode (body optional)"),
    ("/internal/storage/startup/block", "post", [], s.StartupGateBody, dict[str, Any], "Enter limited mode again (body optional)"),
    ("/internal/storage/startup/activate", "post", [], s.StartupGateBody, dict[str, Any], "Second start-up step of the newest reference"),
    ("/shutdown", "post", [], None, dict[str, Any], "Stop the server gracefully (when shutdown_enabled)"),
    ("/reflect/{name}", "post", [NAME], None, s.ReflectAnswer, "Synthesise and promote now"),
    ("/followup_topics/{name}", "get", [NAME], None, dict[str, Any], "Reflections to bring up"),
    ("/record_surfaced/{name}", "post", [NAME], s.RecordSurfacedBody, dict[str, Any], "Record surfaced reflections"),
    ("/query_memory/{name}", "post", [NAME], s.QueryBody, s.RecallAnswer, "Recall"),
    ("/api/tools/recall_memory", "get", [], None, dict[str, Any], "The recall_memory tool schema"),
    ("/get_persona/{name}", "get", [NAME], None, dict[str, Any], "The persona in the reference's persona.json shape"),
    ("/search_for_memory/{name}/{query}", "get", [NAME, QUERY], None, str, "The recall block for a query, as a JSON string"),
    ("/cancel_correction/{name}", "post", [NAME], None, dict[str, Any], "Cancel pending context corrections"),
    ("/reload", "post", [], lc.ReloadBody, dict[str, Any], "Reload every character from disk, closing release claims (body optional)"),
    ("/release_character/{name}", "post", [NAME, *RELEASE_CLAIM], None, dict[str, Any], "Release a character's files under a claim"),
    ("/internal/memory/{name}/scoped_facts", "post", [NAME], sc.ScopedFactsBody, dict[str, Any], "Add facts about a scoped subject"),
    ("/internal/memory/{name}/scoped_history", "post", [NAME], sc.ScopedHistoryBody, dict[str, Any], "Store scoped conversation"),
    ("/internal/memory/{name}/scoped_context", "post", [NAME], sc.ScopedContextBody, dict[str, Any], "Context of scoped subjects"),
    ("/internal/memory/{name}/scoped_mentions", "post", [NAME], sc.ScopedMentionsBody, dict[str, Any], "Record scoped mentions"),
    ("/internal/memory/{name}/scoped_forget", "post", [NAME], sc.ScopedForgetBody, dict[str, Any], "Forget a scoped subject"),
    ("/internal/memory/{name}/scoped_subjects", "get", [NAME], None, dict[str, Any], "Scoped subjects"),
    ("/internal/memory/{name}/forget_epochs", "get", [NAME, SUBJECT_KEYS], None, dict[str, Any], "Erase generations of scoped subjects"),
    *th.OPERATIONS,
    *idn.OPERATIONS,
    *kn.OPERATIONS,
    ("/prompt-locale/{name}", "get", [NAME], None, dict[str, Any], "A character's context language"),
    ("/prompt-locale/{name}", "put", [NAME], pl.PromptLocaleBody, dict[str, Any], "Set a character's context language"),
    ("/internal/memory/{name}/repetition_insights", "post", [NAME], rp.RepetitionBody, dict[str, Any], "Phrases the character repeats"),
    (
        "/internal/memory/import_external_markdown",
        "post",
        [],
        ei.ExternalImportBody,
        ei.ExternalImportAnswer,
        "Import OpenClaw / Hermes Markdown candidates",
    ),
    ("/api/import/neko", "post", [], ImportNekoBody, dict[str, Any], "Import a reference memory folder (server-side path)"),
    ("/api/characters", "get", [], None, s.CharactersAnswer, "Every character"),
    ("/api/characters/{name}/card", "post", [NAME], s.CardBody, dict[str, Any], "Import a character card"),
    ("/api/characters/{name}/facts", "post", [NAME], s.FactsBody, s.ImportAnswer, "Import facts"),
    (
        "/api/characters/{name}/reflections/{reflection_id}/feedback",
        "post",
        [NAME, RID],
        s.FeedbackBody,
        dict[str, Any],
        "Confirm or deny a reflection",
    ),
    ("/api/characters/{name}/{layer}", "get", [NAME, LAYER, *PAGE], None, s.PageAnswer, "List a layer"),
    (
        "/api/characters/{name}/{layer}/{entry_id}",
        "patch",
        [NAME, LAYER, ID],
        s.EntryEdit,
        dict[str, Any],
        "Edit an entry (recent: by index, body {text})",
    ),
    ("/api/characters/{name}/{layer}/{entry_id}", "delete", [NAME, LAYER, ID], None, dict[str, Any], "Delete an entry"),
    ("/openapi.json", "get", [], None, dict[str, Any], "This document"),
    # The memory browser's page and its read/insight routes.
    ("/ui", "get", [], None, HTML, "The memory browser"),
    ("/ui/", "get", [], None, HTML, "The memory browser"),
    ("/ui/{path}", "get", [ASSET], None, HTML, "A file of the memory browser (scripts, styles)"),
    ("/api/browse/characters", "get", [], None, dict[str, Any], "Every character with counts, last conversation and trouble"),
    (
        "/api/browse/{name}/journal",
        "get",
        [NAME, *BROWSE_PAGE, *query("since", "until", "q", "order")],
        None,
        dict[str, Any],
        "A page of the raw conversation (order asc or desc)",
    ),
    (
        "/api/browse/{name}/facts",
        "get",
        [
            NAME,
            *BROWSE_PAGE,
            *query("status", "entity", "importance_min", "importance_max", "absorbed", "event_from", "event_to", "q", "ids"),
        ],
        None,
        dict[str, Any],
        "Facts by status, entity, importance, absorbed, event time, text or ids",
    ),
    ("/api/browse/{name}/reflections_archived", "get", [NAME, *BROWSE_PAGE], None, dict[str, Any], "A page of archived reflections"),
    (
        "/api/browse/{name}/reflections/{reflection_id}/evidence",
        "get",
        [NAME, RID],
        None,
        dict[str, Any],
        "A reflection's evidence changes and decayed curve",
    ),
    ("/api/browse/{name}/corrections", "get", [NAME], None, dict[str, Any], "The persona contradiction queue"),
    ("/api/browse/{name}/persona/{entry_id}/suppress", "post", [NAME, ID], s.SuppressBody, dict[str, Any], "Suppress a persona entry"),
    ("/api/browse/{name}/recall_explain", "post", [NAME], s.BrowseRecallBody, dict[str, Any], "Recall with every leg's scores"),
    (
        "/api/browse/{name}/context",
        "get",
        [NAME, *query("language", "master_name")],
        None,
        dict[str, Any],
        "The /new_dialog text by section",
    ),
    ("/api/memory/review_config", "get", [], None, s.EnabledAnswer, "The recent-memory review switch"),
    ("/api/memory/review_config", "post", [], s.ReviewConfigBody, s.ToggleAnswer, "Set the recent-memory review switch"),
]
# Erasure and backup (http/erasure.py, http/snapshot.py).
ROW = {"name": "row_id", "in": "path", "required": True, "schema": {"type": "integer", "minimum": 1}}
TURNS = [
    {"name": "ids", "in": "query", "required": False, "schema": {"type": "string"}, "description": "row ids, comma-separated"},
    {"name": "from", "in": "query", "required": False, "schema": {"type": "string", "format": "date-time"}},
    {"name": "to", "in": "query", "required": False, "schema": {"type": "string", "format": "date-time"}},
]
OPERATIONS += [
    ("/api/characters/{name}", "delete", [NAME], None, dict[str, Any], "Delete a character: stop it and remove its folder"),
    ("/api/characters/{name}/turns", "delete", [NAME, *TURNS], None, dict[str, Any], "Forget stored turns (ids or a time range)"),
    ("/api/characters/{name}/turns/{row_id}", "delete", [NAME, ROW], None, dict[str, Any], "Forget one stored turn"),
    (
        "/api/characters/{name}/export",
        "post",
        [NAME],
        s.ExportRequest,
        dict[str, Any],
        "The character as a nekomem-character document (holds the character: a POST with a JSON body, never a GET)",
    ),
    (
        "/api/knowledge/export",
        "post",
        [],
        s.ExportRequest,
        dict[str, Any],
        "The knowledge packs' registry and pack files, read under the service's lock (the source of nekomem backup)",
    ),
    (
        "/api/characters/{name}/rename",
        "post",
        [NAME],
        s.RenameBody,
        dict[str, Any],
        "Rename a character (every layer moves; 409 when the new name exists)",
    ),
    (
        "/api/characters/{name}/merge",
        "post",
        [NAME],
        s.MergeBody,
        dict[str, Any],
        "Merge a character into another existing one, then remove it",
    ),
]
# Served only in cluster mode (cluster_etcd_url set): listed only then.
CLUSTER_OPERATIONS: list[tuple[str, str, list[dict[str, Any]], type | None, Any, str]] = [
    ("/cluster/status", "get", [], None, dict[str, Any], "Every node's view: nodes, shards per node, moving shards"),
    ("/cluster/drain", "post", [], DrainBody, dict[str, Any], "Drain a node (its shards move to the others) or end the drain"),
]
ERRORS = ("400", "401", "403", "404", "409", "413", "415", "422", "503", "507")


def build_document(*, cluster: bool = False) -> dict[str, Any]:
    """The OpenAPI 3.1 document of every route (``cluster``: with the cluster-mode ones)."""
    operations = OPERATIONS + (CLUSTER_OPERATIONS if cluster else [])
    types: list[Any] = [s.ErrorBody]
    for _p, _m, _params, request, response, _summary in operations:
        if request is not None:
            types.append(request)
        if response not in (TEXT, HTML):
            types.append(response)
    schemas, components = msgspec.json.schema_components(types, ref_template="#/components/schemas/{name}")
    refs = dict(zip(map(id, types), schemas, strict=True))
    error = {"description": "error", "content": {"application/json": {"schema": refs[id(s.ErrorBody)]}}}
    paths: dict[str, dict[str, Any]] = {}
    for path, method, params, request, response, summary in operations:
        if response in (TEXT, HTML):
            ok = {"description": "ok", "content": {response: {"schema": {"type": "string"}}}}
        else:
            ok = {"description": "ok", "content": {"application/json": {"schema": refs[id(response)]}}}
        params = [layer_parameter() if param is LAYER else param for param in params]
        op: dict[str, Any] = {"summary": summary, "parameters": params, "responses": {"200": ok, **{c: error for c in ERRORS}}}
        if request is not None:
            op["requestBody"] = {"required": True, "content": {"application/json": {"schema": refs[id(request)]}}}
        paths.setdefault(path, {})[method] = op
    return {
        "openapi": "3.1.0",
        "info": {"title": "nekomem", "version": nekomem.__version__},
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }


async def openapi(request: Request) -> Response:
    document = getattr(request.app.state, "openapi", None)
    if document is None:
        cluster = getattr(request.app.state, "cluster", None) is not None
        document = request.app.state.openapi = build_document(cluster=cluster)
    return JSONResponse(document)
