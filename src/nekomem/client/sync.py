"""``NekomemClient``: the blocking facade of :class:`AsyncNekomemClient`.

It owns a private event loop on a thread (anyio's blocking portal) and runs each call of
the asynchronous client there: every method is the asynchronous one, not a second
implementation, with the same arguments, answers and errors.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Awaitable, Callable
from typing import Concatenate, ParamSpec, TypeVar

from anyio.from_thread import BlockingPortal, start_blocking_portal

from nekomem.client.aio import (
    DEFAULT_MAX_RETRY_WAIT_SECONDS,
    DEFAULT_MAX_STARTUP_WAIT_SECONDS,
    DEFAULT_RETRIES,
    DEFAULT_TIMEOUT_SECONDS,
    AsyncNekomemClient,
)

P = ParamSpec("P")
R = TypeVar("R")


def _blocking(method: Callable[Concatenate[AsyncNekomemClient, P], Awaitable[R]]) -> Callable[Concatenate[NekomemClient, P], R]:
    """The blocking form of an ``AsyncNekomemClient`` method, run on the facade's portal."""

    def call(self: NekomemClient, /, *args: P.args, **kwargs: P.kwargs) -> R:
        return self._portal.call(functools.partial(method, self._client, *args, **kwargs))

    call.__name__ = call.__qualname__ = method.__name__
    call.__doc__ = method.__doc__
    return call


class NekomemClient:
    """Blocking client with the arguments of :class:`AsyncNekomemClient`; use it as a
    context manager or call :meth:`close` (which stops its event-loop thread)."""

    def __init__(
        self,
        base_url: str | None = None,
        *,
        token: str | None = None,
        timeout: float = DEFAULT_TIMEOUT_SECONDS,
        retries: int = DEFAULT_RETRIES,
        max_retry_wait: float = DEFAULT_MAX_RETRY_WAIT_SECONDS,
        max_startup_wait: float = DEFAULT_MAX_STARTUP_WAIT_SECONDS,
    ) -> None:
        self._stack = contextlib.ExitStack()
        self._portal: BlockingPortal = self._stack.enter_context(start_blocking_portal())
        try:
            # Built on the portal's loop: the httpx pool belongs to that loop.
            self._client = self._portal.call(self._make, base_url, token, timeout, retries, max_retry_wait, max_startup_wait)
        except BaseException:
            self._stack.close()
            raise

    @staticmethod
    async def _make(
        base_url: str | None, token: str | None, timeout: float, retries: int, wait: float, startup_wait: float
    ) -> AsyncNekomemClient:
        return AsyncNekomemClient(
            base_url, token=token, timeout=timeout, retries=retries, max_retry_wait=wait, max_startup_wait=startup_wait
        )

    def __enter__(self) -> NekomemClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection pool and stop the event-loop thread (idempotent)."""
        if self._stack is None:
            return
        try:
            self._portal.call(self._client.aclose)
        finally:
            stack, self._stack = self._stack, None  # type: ignore[assignment]
            stack.close()

    health = _blocking(AsyncNekomemClient.health)
    characters = _blocking(AsyncNekomemClient.characters)
    cache = _blocking(AsyncNekomemClient.cache)
    process = _blocking(AsyncNekomemClient.process)
    renew = _blocking(AsyncNekomemClient.renew)
    settle = _blocking(AsyncNekomemClient.settle)
    new_dialog = _blocking(AsyncNekomemClient.new_dialog)
    recent_history = _blocking(AsyncNekomemClient.recent_history)
    last_conversation_gap = _blocking(AsyncNekomemClient.last_conversation_gap)
    recall = _blocking(AsyncNekomemClient.recall)
    add_facts = _blocking(AsyncNekomemClient.add_facts)
    import_card = _blocking(AsyncNekomemClient.import_card)
    entries = _blocking(AsyncNekomemClient.entries)
    persona = _blocking(AsyncNekomemClient.persona)
    edit_entry = _blocking(AsyncNekomemClient.edit_entry)
    delete_entry = _blocking(AsyncNekomemClient.delete_entry)
    feedback = _blocking(AsyncNekomemClient.feedback)
    confirm = _blocking(AsyncNekomemClient.confirm)
    deny = _blocking(AsyncNekomemClient.deny)
    reflect = _blocking(AsyncNekomemClient.reflect)
    followup_topics = _blocking(AsyncNekomemClient.followup_topics)


__all__ = ["NekomemClient"]
