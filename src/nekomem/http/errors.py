"""The JSON error shape of every route: ``{"status": "error", "error_code", "message"}``
with a real HTTP status (400 bad input, 404 unknown id, 409 limited mode / conflict, 413
body too large, 422 schema violation, 503 not ready)."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse

from nekomem.runtime.reply import ActorFailure


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


async def actor_failure_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ActorFailure)
    return error_response(exc.status, exc.code, exc.message)


async def not_found_handler(request: Request, exc: Exception) -> JSONResponse:
    status = getattr(exc, "status_code", 404)
    if status == 405:
        return error_response(405, "method_not_allowed", f"{request.method} is not allowed on {request.url.path}")
    return error_response(404, "not_found", f"no route {request.url.path}")


async def internal_error_handler(request: Request, exc: Exception) -> JSONResponse:
    return error_response(500, "internal_error", f"internal error: {type(exc).__name__}")
