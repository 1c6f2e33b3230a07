"""Replies from actors to callers, and the asyncio bridge.

Messages carry a :class:`Reply`. The handling actor (or whichever actor finishes the work)
completes it exactly once. Completion from an actor thread reaches the event loop through
``loop.call_soon_threadsafe``, so awaiting a reply never blocks the loop; pykka's own
``await future`` would.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading


class ActorFailure(Exception):
    """Raised to a caller when an actor failed while handling its message.

    ``status`` is the HTTP status the front end should answer with; ``code`` a stable
    machine-readable error code.
    """

    def __init__(self, code: str, message: str, status: int = 500) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status = status


class AskTimeout(ActorFailure):
    def __init__(self, what: str, seconds: float) -> None:
        super().__init__("actor_timeout", f"{what} did not answer within {seconds:g} s", 503)


class Reply:
    """A one-shot reply slot, completed by ``ok`` or ``fail`` from any thread.

    With a loop it resolves an asyncio future on that loop; without one it resolves a
    ``concurrent.futures.Future`` (for callers on plain threads and for tests).
    Completing twice is a no-op: a late duplicate result changes nothing.
    """

    __slots__ = ("_loop", "_afut", "_cfut", "_done", "_lock")

    def __init__(self, loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._loop = loop
        self._afut: asyncio.Future[object] | None = loop.create_future() if loop else None
        self._cfut: concurrent.futures.Future[object] | None = None if loop else concurrent.futures.Future()
        self._done = False
        self._lock = threading.Lock()

    @property
    def done(self) -> bool:
        return self._done

    def _claim(self) -> bool:
        with self._lock:
            if self._done:
                return False
            self._done = True
            return True

    def ok(self, value: object = None) -> None:
        if not self._claim():
            return
        if self._afut is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(_set_result, self._afut, value)
        elif self._cfut is not None:
            self._cfut.set_result(value)

    def fail(self, exc: BaseException) -> None:
        if not self._claim():
            return
        if self._afut is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(_set_exception, self._afut, exc)
        elif self._cfut is not None:
            self._cfut.set_exception(exc)

    async def wait(self, timeout: float, what: str = "the actor") -> object:
        """Await the reply on its loop; raises AskTimeout after ``timeout`` seconds (a
        reply that comes later is dropped). One timer handle, no extra task per wait."""
        fut, loop = self._afut, self._loop
        assert fut is not None and loop is not None, "wait() needs a Reply created with a loop"
        if fut.done():
            return fut.result()
        timer = loop.call_later(timeout, _time_out, fut, what, timeout)
        try:
            return await fut
        finally:
            timer.cancel()

    def result(self, timeout: float, what: str = "the actor") -> object:
        """Block the calling (non-loop) thread for the reply; raises AskTimeout."""
        assert self._cfut is not None, "result() needs a Reply created without a loop"
        try:
            return self._cfut.result(timeout)
        except concurrent.futures.TimeoutError:
            raise AskTimeout(what, timeout) from None


def _set_result(fut: asyncio.Future[object], value: object) -> None:
    if not fut.done():
        fut.set_result(value)


def _time_out(fut: asyncio.Future[object], what: str, seconds: float) -> None:
    if not fut.done():
        fut.set_exception(AskTimeout(what, seconds))


def _set_exception(fut: asyncio.Future[object], exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)
