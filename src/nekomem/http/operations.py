"""The route table's row: one :class:`Operation` per method of a path, which both the app's
router (:func:`starlette_routes`) and ``/openapi.json`` (``server/openapi.py``) read, so
a route cannot be served undocumented or documented unserved. Each route module declares
its own operations; ``server/app.py`` puts them in the router's order.

Also the OpenAPI parameters several modules share (the character name, entry ids, pages).
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import BaseRoute, Route

Endpoint = Callable[[Request], Awaitable[Response]]
Parameter = Mapping[str, Any]

# Answers that are not JSON: documented as a string of this media type.
TEXT = "text/plain"
HTML = "text/html"

NAME: Parameter = {"name": "name", "in": "path", "required": True, "schema": {"type": "string", "minLength": 1, "maxLength": 50}}
ID: Parameter = {"name": "entry_id", "in": "path", "required": True, "schema": {"type": "string", "minLength": 1}}
RID: Parameter = {"name": "reflection_id", "in": "path", "required": True, "schema": {"type": "string", "minLength": 1}}
# The {layer} path parameter: its enum is filled from the layer declarations when the
# document is built (server/openapi.py), so a declared layer is documented by itself.
LAYER: Parameter = {"name": "layer", "in": "path", "required": True, "schema": {"type": "string"}}
PAGE: list[Parameter] = [
    {"name": "offset", "in": "query", "required": False, "schema": {"type": "integer", "minimum": 0}},
    {"name": "limit", "in": "query", "required": False, "schema": {"type": "integer", "minimum": 1}},
    {"name": "status", "in": "query", "required": False, "schema": {"type": "string"}},
    {"name": "entity", "in": "query", "required": False, "schema": {"type": "string"}},
]
BROWSE_PAGE: list[Parameter] = [p for p in PAGE if p["name"] in ("offset", "limit")]
QUERY: Parameter = {"name": "query", "in": "path", "required": True, "schema": {"type": "string", "minLength": 1}}
SUBJECT_KEYS: Parameter = {
    "name": "subject",
    "in": "query",
    "required": False,
    "schema": {"type": "array", "items": {"type": "string"}, "maxItems": 64},
    "description": "a subject key <subject_kind>:<subject_id>, repeated",
}
# /release_character's claim (nekomem.runtime.release_claims): token and generation are required.
RELEASE_CLAIM: list[Parameter] = [
    {"name": "hold_derived_task_admission", "in": "query", "required": False, "schema": {"type": "boolean", "default": False}},
    {"name": "derived_task_claim_token", "in": "query", "required": True, "schema": {"type": "string", "minLength": 1}},
    {"name": "derived_task_claim_generation", "in": "query", "required": True, "schema": {"type": "integer"}},
]


def query(*names: str) -> list[Parameter]:
    """Optional string query parameters."""
    return [{"name": n, "in": "query", "required": False, "schema": {"type": "string"}} for n in names]


@dataclass(frozen=True)
class Operation:
    """One method of one path: what the router serves and what /openapi.json says of it.
    ``path`` is Starlette's path format (``/cache/{name:str}``); ``body`` the Struct a body
    is decoded into (None: no body); ``answer`` the Struct or type of a 200 answer, or
    :data:`TEXT` / :data:`HTML`."""

    path: str
    method: str
    endpoint: Endpoint
    summary: str
    params: Sequence[Parameter] = ()
    body: object = None
    answer: object = dict[str, Any]

    @property
    def document_path(self) -> str:
        """The path as OpenAPI writes it (``/cache/{name}``)."""
        return re.sub(r"\{(\w+):[^}]*\}", r"{\1}", self.path)


def starlette_routes(operations: Iterable[Operation]) -> list[BaseRoute]:
    """The router's routes, in table order: consecutive operations of one path and one
    endpoint share a Route (its methods together), as a PATCH and a DELETE of one entry."""
    grouped: list[tuple[str, Endpoint, list[str]]] = []
    for op in operations:
        last = grouped[-1] if grouped else None
        if last is not None and last[0] == op.path and last[1] is op.endpoint:
            last[2].append(op.method)
        else:
            grouped.append((op.path, op.endpoint, [op.method]))
    return [Route(path, endpoint, methods=methods) for path, endpoint, methods in grouped]
