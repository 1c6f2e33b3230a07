"""The one seam between the HTTP routes and the process's runtime.

Every route reaches the :class:`~nekomem.runtime.runtime.Runtime` through
:func:`runtime_of` and asks a character's actor through :func:`ask`, so the types the
routes work with are named here once instead of flowing as ``Any`` from Starlette's
untyped ``app.state`` and the registry's untyped replies.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from starlette.applications import Starlette
from starlette.requests import Request

from nekomem.actors.messages import GetRecent, RecentView
from nekomem.domain.layers import RECENT, Address
from nekomem.runtime.protocol import Message
from nekomem.runtime.reply import ActorFailure, Reply
from nekomem.runtime.runtime import Runtime

T = TypeVar("T")


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
    child: Address,
    make: Callable[[Reply], Message],
    answer: type[T],
    *,
    timeout: float | None = None,
) -> T:
    """Send ``make(reply)`` to the layer at ``child`` (one of the addresses declared in
    :mod:`nekomem.domain.layers`) of character ``name`` and return its answer, an
    instance of ``answer`` (:meth:`CharacterRegistry.ask`; the default timeout is the
    ``ask_timeout_seconds`` setting).

    Raises AskTimeout when the actor does not answer in time, ActorFailure when it failed
    (both answered by the app's ActorFailure handler), and ActorFailure 500
    ``unexpected_reply`` when it answered something other than ``answer``.
    """
    value = await runtime.registry.ask(name, child, make, timeout=timeout)
    # A Reply carries any value: the answer is checked here, once, against the type the
    # caller names (a reply Struct, or str/int/bool), instead of being cast to it.
    if not isinstance(value, answer):
        raise ActorFailure("unexpected_reply", f"the {child} layer answered {type(value).__name__}, not {answer.__name__}", 500)
    return value


async def recent_view(request: Request, name: str, *, wait_settle: bool) -> RecentView:
    rt = runtime_of(request)
    return await ask(
        rt,
        name,
        RECENT,
        lambda reply: GetRecent(wait_settle=wait_settle, reply=reply),
        RecentView,
        timeout=rt.settings.server.settle_timeout_seconds,
    )
