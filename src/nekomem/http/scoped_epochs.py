"""Scoped forgetting by generation: ``forget_epoch`` on ``scoped_forget``,
``subject_epochs`` on ``scoped_history`` and ``GET /internal/memory/{name}/forget_epochs``.

See :mod:`nekomem.stores.forget_epochs` for the meaning. ``GET forget_epochs`` takes the
subject keys as repeated ``subject`` query parameters (at most 64, as the reference's
client batches them) and answers ``{"epochs": {key: epoch}}`` with only the keys that have
a tombstone. The tombstone file is written here, under one lock per character (the routes
of one process share one event loop); it is a sidecar like the theater's, not a memory
layer, so it does not go through an actor.
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from nekomem.domain.subjects import Subject
from nekomem.http.bodies import character_name
from nekomem.http.errors import ApiError
from nekomem.http.runtime_access import runtime_of
from nekomem.runtime.clock import iso
from nekomem.stores.forget_epochs import ForgetEpochs

MAX_KEYS = 64
MAX_KEY_CHARS = 256
_locks: dict[str, asyncio.Lock] = {}


def _store(request: Request, name: str) -> ForgetEpochs:
    rt = runtime_of(request)
    return ForgetEpochs(rt.character_paths(name).folder)


def check_epochs(raw: Any) -> dict[str, int] | None:
    """``subject_epochs`` of a request: None when absent; ApiError 422 unless an object
    of subject key -> non-negative int."""
    if raw is None:
        return None
    if not isinstance(raw, dict) or not all(
        isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v >= 0 for k, v in raw.items()
    ):
        raise ApiError(422, "bad_subject_epochs", "subject_epochs must map subject keys to non-negative integers")
    return raw


async def record_forget(request: Request, name: str, subject: Subject, epoch: int | None) -> int | None:
    """Raise the subject's tombstone to ``epoch`` (when given); returns the stored value."""
    if epoch is None:
        return None
    if epoch < 0:
        raise ApiError(422, "bad_forget_epoch", "forget_epoch must be a non-negative integer")
    rt = runtime_of(request)
    async with _locks.setdefault(name, asyncio.Lock()):
        rt.character_paths(name).ensure()
        return _store(request, name).raise_to(subject.key, epoch, iso(rt.clock.now()))


async def fenced(request: Request, name: str, subjects: list[Subject], epochs: dict[str, int] | None) -> set[str]:
    """Keys of ``subjects`` whose stamped generation (in ``epochs``) is older than their
    tombstone: the write was produced before an erase and is dropped. An unstamped request
    (``epochs`` None, an older client) is never fenced."""
    if epochs is None:
        return set()
    stored = _store(request, name).get(s.key for s in subjects)
    return {key for key, tomb in stored.items() if epochs.get(key, -1) < tomb}


async def forget_epochs(request: Request) -> Response:
    name = character_name(request)
    keys = list(dict.fromkeys(request.query_params.getlist("subject")))
    if len(keys) > MAX_KEYS:
        raise ApiError(422, "too_many_subjects", f"at most {MAX_KEYS} subject keys per request")
    if any(not k.strip() or len(k) > MAX_KEY_CHARS for k in keys):
        raise ApiError(422, "bad_subject", f"each subject key must have 1..{MAX_KEY_CHARS} characters")
    if not keys:
        return JSONResponse({"epochs": {}})
    # Read only: a missing file (or folder) is no tombstone, and nothing is created.
    return JSONResponse({"epochs": _store(request, name).get(keys)})
