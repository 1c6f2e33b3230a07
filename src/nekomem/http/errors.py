"""The JSON error shape of every route: ``{"status": "error", "error_code", "message"}``
with a real HTTP status (400 bad input, 404 unknown id, 409 limited mode / conflict, 413
body too large, 415 body not JSON, 422 schema violation, 503 not ready or storage not
writable / failing, 507 storage full; the storage answers carry ``Retry-After``)."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from nekomem.http.runtime_access import runtime_of
from nekomem.runtime.reply import ActorFailure
from nekomem.stores.faults import FAULT_CODES, classify


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, **extra: Any) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.extra = extra


def error_response(status: int, code: str, message: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"status": "error", "error_code": code, "message": message, **extra}, status_code=status)


async def api_error_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return error_response(exc.status, exc.code, exc.message, **exc.extra)


def _retry_after(request: Request, response: JSONResponse) -> JSONResponse:
    seconds = runtime_of(request).settings.server.storage_retry_after_seconds
    response.headers["Retry-After"] = str(seconds)
    return response


async def actor_failure_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ActorFailure)
    response = error_response(exc.status, exc.code, exc.message)
    return _retry_after(request, response) if exc.code in FAULT_CODES else response


async def not_found_handler(request: Request, exc: Exception) -> JSONResponse:
    status = getattr(exc, "status_code", 404)
    if status == 405:
        return error_response(405, "method_not_allowed", f"{request.method} is not allowed on {request.url.path}")
    return error_response(404, "not_found", f"no route {request.url.path}")


async def os_error_handler(request: Request, exc: Exception) -> JSONResponse:
    """An OSError that reached a route (a write outside the actors, such as the
    powerful-memory switch): a storage fault answers 507/503, anything else 500."""
    fault = classify(exc)
    if fault is not None:
        storage = runtime_of(request).services.storage
        if storage is not None:
            storage.count("http", fault)
        return _retry_after(request, error_response(fault.status, fault.code, fault.message))
    return await internal_error_handler(request, exc)


async def internal_error_handler(request: Request, exc: Exception) -> JSONResponse:
    return error_response(500, "internal_error", f"internal error: {type(exc).__name__}")
