"""The advisory lock of a memory root: ``<root>/.nekomem.lock``.

A running server holds the lock *shared* for its whole life; an offline tool that rewrites
character folders behind the server's back (``nekomem import-neko``) must hold it
*exclusive*, and is refused while any server holds the root. The lock is an ``flock`` on an
open file descriptor, so the kernel drops it when the holder exits or is killed: a crashed
server never leaves a stale lock behind. The file's content (pid, role) is only a hint for
the message shown to a refused caller.

On platforms without ``fcntl`` (Windows) locking is not available: :func:`acquire` then
returns a lock that holds nothing and says so in ``enforced``.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Literal

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

LOCK_FILE = ".nekomem.lock"
LockMode = Literal["shared", "exclusive"]


class RootLocked(RuntimeError):
    """The memory root is held by another process in a conflicting mode.

    ``holder`` is the hint written by the current holder (e.g. ``"serve pid 1234"``), or
    an empty string when unknown.
    """

    def __init__(self, root: Path, wanted: LockMode, holder: str) -> None:
        who = f" ({holder})" if holder else ""
        if wanted == "exclusive":
            message = (
                f"the memory root {root} is in use by a running nekomem server{who}; stop it first, or import through POST /api/import/neko"
            )
        else:
            message = f"the memory root {root} is locked by another tool{who}; wait until it finishes"
        super().__init__(message)
        self.root = root
        self.holder = holder


class RootLock:
    """A held lock; :meth:`release` (or leaving the ``with`` block) lets it go."""

    def __init__(self, path: Path, fd: int | None, mode: LockMode) -> None:
        self.path = path
        self.mode = mode
        self._fd = fd

    @property
    def enforced(self) -> bool:
        """False when the platform has no ``flock`` and nothing is actually held."""
        return self._fd is not None

    def release(self) -> None:
        """Drop the lock (idempotent)."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)

    def __enter__(self) -> RootLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _holder_hint(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace").strip()[:100]
    except OSError:
        return ""


def acquire(root: Path, mode: LockMode, role: str) -> RootLock:
    """Take the root's lock without waiting; create the root and the lock file if missing.

    ``role`` (e.g. ``"serve"``, ``"import-neko"``) is written with the pid as a hint for
    refused callers. Raises :class:`RootLocked` when another holder conflicts and OSError
    when the root cannot be created or the lock file opened.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    path = root / LOCK_FILE
    if fcntl is None:  # pragma: no cover - Windows
        log.warning("file locking is not available on this platform; the memory root is not locked")
        return RootLock(path, None, mode)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    flag = fcntl.LOCK_EX if mode == "exclusive" else fcntl.LOCK_SH
    try:
        fcntl.flock(fd, flag | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise RootLocked(root, mode, _holder_hint(path)) from None
    except BaseException:
        os.close(fd)
        raise
    # Two shared holders may both rewrite the hint; it is only a hint.
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{role} pid {os.getpid()}\n".encode(), 0)
    return RootLock(path, fd, mode)
