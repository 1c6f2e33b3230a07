"""The one seam between the HTTP routes and the process's runtime.

Every route reaches the :class:`~nekomem.runtime.runtime.Runtime` through
:func:`runtime_of` and asks a character's actor through :func:`ask`, so the types the
routes work with are named here once instead of flowing as ``Any`` from Starlette's
untyped ``app.state`` and the registry's untyped replies.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar, cast

from starlette.applications import Starlette
from starlette.requests import Request

from nekomem.actors.messages import GetRecent, RecentView
from nekomem.runtime.reply import Reply
from nekomem.runtime.runtime import Runtime

T = TypeVar("T")

# The answer most actors give a route: a JSON-shaped dict (it is encoded as it is, or read
# field by field). Values are any JSON value, hence Any.
JsonAnswer = dict[str, Any]


def app_runtime(app: Starlette) -> Runtime:
    """The Runtime ``app`` serves (``create_app`` sets it on ``app.state`` before any
    request can arrive)."""
    runtime: Runtime = app.state.runtime
    return runtime


def runtime_of(request: Request) -> Runtime:
    """The Runtime of the app serving ``request``."""
    return app_runtime(request.app)


async def ask(
    runtime: Runtime,
    name: str,
    child: str,
    make: Callable[[Reply], object],
    answer: type[T],
    *,
    timeout: float | None = None,
) -> T:
    """Send ``make(reply)`` to actor ``child`` of character ``name`` and return its answer,
    typed ``answer`` (:meth:`CharacterRegistry.ask`; the default timeout is the
    ``ask_timeout_seconds`` setting).

    Raises AskTimeout when the actor does not answer in time and ActorFailure when it
    failed (both answered by the app's ActorFailure handler).
    """
    value = await runtime.registry.ask(name, child, make, timeout=timeout)
    # The registry is untyped (a Reply carries any value): this is the one place an
    # answer gets the type its message's handler answers with, as the caller states it.
    return cast(T, value)


async def recent_view(request: Request, name: str, *, wait_settle: bool) -> RecentView:
    rt = runtime_of(request)
    return await ask(
        rt,
        name,
        "recent",
        lambda reply: GetRecent(wait_settle=wait_settle, reply=reply),
        RecentView,
        timeout=rt.settings.server.settle_timeout_seconds,
    )
