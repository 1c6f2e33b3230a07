"""``GET /openapi.json``: the API described from the app's route table
(:class:`~nekomem.http.operations.Operation`, ``server/app.py``'s ``operations``: the same
rows the router is built from) and the msgspec types of its bodies and answers (the same
types that decode the request bodies)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

import nekomem
from nekomem.domain.layers import listings
from nekomem.http import schemas as s
from nekomem.http.operations import HTML, LAYER, TEXT, Operation, Parameter

ERRORS = ("400", "401", "403", "404", "409", "413", "415", "422", "503", "507")


def layer_parameter() -> dict[str, Any]:
    """The {layer} parameter: "recent" and every declared layer's listing."""
    return {**LAYER, "schema": {"type": "string", "enum": ["recent", *listings()]}}


def _parameter(param: Parameter) -> Parameter:
    return layer_parameter() if param is LAYER else param


def build_document(operations: Sequence[Operation]) -> dict[str, Any]:
    """The OpenAPI 3.1 document of ``operations`` (the app's: ``app.state.operations``)."""
    types: list[Any] = [s.ErrorBody]
    for op in operations:
        if op.body is not None:
            types.append(op.body)
        if op.answer not in (TEXT, HTML):
            types.append(op.answer)
    schemas, components = msgspec.json.schema_components(types, ref_template="#/components/schemas/{name}")
    refs = dict(zip(map(id, types), schemas, strict=True))
    error = {"description": "error", "content": {"application/json": {"schema": refs[id(s.ErrorBody)]}}}
    paths: dict[str, dict[str, Any]] = {}
    for op in operations:
        if op.answer in (TEXT, HTML):
            ok = {"description": "ok", "content": {op.answer: {"schema": {"type": "string"}}}}
        else:
            ok = {"description": "ok", "content": {"application/json": {"schema": refs[id(op.answer)]}}}
        document: dict[str, Any] = {
            "summary": op.summary,
            "parameters": [_parameter(param) for param in op.params],
            "responses": {"200": ok, **{c: error for c in ERRORS}},
        }
        if op.body is not None:
            document["requestBody"] = {"required": True, "content": {"application/json": {"schema": refs[id(op.body)]}}}
        paths.setdefault(op.document_path, {})[op.method.lower()] = document
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
        document = request.app.state.openapi = build_document(request.app.state.operations)
    return JSONResponse(document)
