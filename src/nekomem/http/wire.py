"""A reply Struct on the wire.

An actor's answer that a route sends as it is leaves through :func:`answer_response`:
``msgspec.to_builtins`` (field order is key order, an ``UNSET`` field is left out), then
Starlette's JSON encoding, the one every route's body has always had, so a reply that
became a Struct keeps its bytes (``tests/test_wire_golden.py``).
"""

from __future__ import annotations

import msgspec
from starlette.responses import JSONResponse


def answer_response(answer: msgspec.Struct, status_code: int = 200) -> JSONResponse:
    """``answer`` as a JSON response."""
    return JSONResponse(msgspec.to_builtins(answer), status_code=status_code)
