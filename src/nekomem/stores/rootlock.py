"""The lock of a memory root: ``<root>/.nekomem.lock``.

One single-node server serves a root: it holds the lock *exclusive* for its whole life,
as does an offline tool that rewrites character folders behind a server's back
(``import-neko``, ``export-neko``, ``restore``, ``cluster shard-root`` ...). Two servers on
one root would each keep their own view of a character in memory and overwrite each
other's files, losing acknowledged writes. Only cluster nodes share a root: they hold the
lock *shared*, and each writes only the shards it owns (the fence, ``stores/fence.py``), so
a single-node server or an offline tool is refused while any node runs, and blocks them.

The lock belongs to an open file descriptor, so the kernel drops it when the holder exits
or is killed: a crashed server never leaves a stale lock behind.

- POSIX: ``flock`` (shared or exclusive), per open file description: two holders in one
  process conflict as two processes do.
- Windows: ``msvcrt.locking`` byte-range locks, which are exclusive only; shared is built
  from them (:class:`RangeLocker`): a shared holder locks one byte of a slot range far past
  the file's text, an exclusive holder the whole range.

After locking, the holder writes who it is (pid, role, port, URL, start time) as one JSON
line into the file; a refused caller reads it to name the holder and say what to do.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Literal, Protocol

log = logging.getLogger(__name__)

LOCK_FILE = ".nekomem.lock"
LockMode = Literal["shared", "exclusive"]
# Roles that serve the root (the rest are offline tools that finish on their own); a
# cluster node's role is "cluster node <id>".
SERVER_ROLES = ("serve", "neko")
CLUSTER_ROLE = "cluster node"
_HINT_MAX = 2000  # bytes of the holder line read back


@dataclass(frozen=True)
class Holder:
    """Who holds a root: written by the holder, read by a refused caller."""

    pid: int
    role: str
    mode: str = "exclusive"
    port: int | None = None
    url: str = ""
    started: str = ""

    def describe(self) -> str:
        """E.g. ``serve pid 1234, port 48912 (http://127.0.0.1:48912), since 2026-12-06T11:00:00Z``."""
        text = f"{self.role} pid {self.pid}"
        if self.port is not None:
            text += f", port {self.port}"
        if self.url:
            text += f" ({self.url})"
        if self.started:
            text += f", since {self.started}"
        return text

    @property
    def serves(self) -> bool:
        return is_server_role(self.role)


def is_server_role(role: str) -> bool:
    """True for the roles of a server (which runs until stopped), False for offline tools."""
    return role in SERVER_ROLES or role.startswith(CLUSTER_ROLE)


def read_holder(root: Path) -> Holder | None:
    """The holder line of ``root``'s lock file, or None when absent or unreadable (an
    older server wrote ``"serve pid N"``: that is parsed too)."""
    try:
        with open(Path(root) / LOCK_FILE, "rb") as f:
            raw = f.read(_HINT_MAX).decode("utf-8", errors="replace").strip()
    except OSError:
        return None
    if not raw:
        return None
    try:
        data = json.loads(raw.splitlines()[0])
        port = data.get("port")
        return Holder(
            pid=int(data["pid"]),
            role=str(data.get("role", "")),
            mode=str(data.get("mode", "exclusive")),
            port=int(port) if isinstance(port, int) else None,
            url=str(data.get("url", "")),
            started=str(data.get("started", "")),
        )
    except (ValueError, KeyError, TypeError, AttributeError):
        role, sep, pid = raw.splitlines()[0].rpartition(" pid ")
        if sep and pid.strip().isdigit():
            return Holder(pid=int(pid), role=role.strip())
        return None


class RootLocked(RuntimeError):
    """The memory root is held by another holder in a conflicting mode.

    The message names the holder (pid, role, port) when it wrote itself into the lock
    file, and what the refused caller (``role``) can do instead.
    """

    def __init__(self, root: Path, wanted: LockMode, holder: Holder | None, role: str = "") -> None:
        url = holder.url if holder is not None else ""
        if holder is not None and holder.serves:
            who = holder.describe()
            status = f"nekomem status --url {url}" if url else "nekomem status"
            if is_server_role(role):
                todo = (
                    f"only one server may serve a memory root (two would lose each other's writes): use the running one "
                    f"({status}), or stop it (Ctrl+C or kill {holder.pid}) before starting this one, or give this one "
                    "another --memory-root"
                )
            elif role == "import-neko":
                todo = f"stop it first (kill {holder.pid}), or import through the running server: POST /api/import/neko"
            else:
                todo = f"stop it first (kill {holder.pid}), or work through the running server ({status}; the data commands take --url)"
            message = f"the memory root {root} is in use by a running nekomem server ({who}); {todo}"
        else:
            who = f" ({holder.describe()})" if holder is not None else ""
            message = f"the memory root {root} is locked by another tool{who}; wait until it finishes"
        super().__init__(message)
        self.root = root
        self.holder = holder
        self.wanted = wanted


class Locker(Protocol):
    """Takes and drops a lock on an open file, without waiting."""

    def lock(self, fd: int, mode: LockMode) -> bool:
        """True once held; False when another holder conflicts. Raises OSError otherwise."""
        ...

    def unlock(self, fd: int, mode: LockMode) -> None:
        """Drop what :meth:`lock` took on ``fd``."""
        ...


if sys.platform != "win32":
    import fcntl

    class FlockLocker:
        """POSIX ``flock``: shared and exclusive locks of the kernel."""

        def lock(self, fd: int, mode: LockMode) -> bool:
            try:
                fcntl.flock(fd, (fcntl.LOCK_EX if mode == "exclusive" else fcntl.LOCK_SH) | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            return True

        def unlock(self, fd: int, mode: LockMode) -> None:
            fcntl.flock(fd, fcntl.LOCK_UN)


# Windows locks are mandatory: the locked bytes sit far past the holder line, so reading
# the line is never blocked. One byte per shared holder; an exclusive holder takes all.
RANGE_BASE = 1 << 20
RANGE_SLOTS = 64


class RangeLocker:
    """Shared and exclusive out of exclusive byte-range locks (``msvcrt.locking``).

    ``try_lock(fd, offset, length)`` locks a range without waiting (False when any byte
    is held elsewhere); ``unlock(fd, offset, length)`` drops exactly such a range. An
    exclusive holder locks all ``RANGE_SLOTS`` bytes at once, so it conflicts with any
    holder; a shared holder locks the first free single byte, so shared holders (up to
    ``RANGE_SLOTS``) coexist and each conflicts with an exclusive one.
    """

    def __init__(self, try_lock: Callable[[int, int, int], bool], unlock: Callable[[int, int, int], None]) -> None:
        self._try_lock = try_lock
        self._unlock = unlock
        self._held: dict[int, tuple[int, int]] = {}  # fd -> (offset, length)

    def lock(self, fd: int, mode: LockMode) -> bool:
        if mode == "exclusive":
            if not self._try_lock(fd, RANGE_BASE, RANGE_SLOTS):
                return False
            self._held[fd] = (RANGE_BASE, RANGE_SLOTS)
            return True
        for slot in range(RANGE_SLOTS):
            if self._try_lock(fd, RANGE_BASE + slot, 1):
                self._held[fd] = (RANGE_BASE + slot, 1)
                return True
        return False

    def unlock(self, fd: int, mode: LockMode) -> None:
        held = self._held.pop(fd, None)
        if held is not None:
            self._unlock(fd, *held)


def platform_locker() -> Locker:
    """The locker of this platform: ``flock`` on POSIX, byte ranges on Windows."""
    if sys.platform != "win32":
        return FlockLocker()
    import msvcrt

    def try_lock(fd: int, offset: int, length: int) -> bool:
        os.lseek(fd, offset, os.SEEK_SET)
        try:
            msvcrt.locking(fd, msvcrt.LK_NBLCK, length)
        except OSError as exc:
            if exc.errno in (errno.EACCES, errno.EDEADLOCK):  # the CRT's "held elsewhere"
                return False
            raise
        return True

    def unlock(fd: int, offset: int, length: int) -> None:
        os.lseek(fd, offset, os.SEEK_SET)
        msvcrt.locking(fd, msvcrt.LK_UNLCK, length)

    return RangeLocker(try_lock, unlock)


class RootLock:
    """A held lock; :meth:`release` (or leaving the ``with`` block) lets it go."""

    def __init__(self, path: Path, fd: int, mode: LockMode, locker: Locker, holder: Holder) -> None:
        self.path = path
        self.mode = mode
        self.holder = holder
        self._fd: int | None = fd
        self._locker = locker

    def describe(self, port: int | None, url: str) -> None:
        """Rewrite the holder line with the port and URL (once the port is bound)."""
        self.holder = replace(self.holder, port=port, url=url)
        if self._fd is not None:
            _write_holder(self._fd, self.holder)

    def release(self) -> None:
        """Drop the lock (idempotent)."""
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                self._locker.unlock(fd, self.mode)
            finally:
                os.close(fd)

    def __enter__(self) -> RootLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def _write_holder(fd: int, holder: Holder) -> None:
    line = json.dumps(asdict(holder), ensure_ascii=False) + "\n"
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    os.write(fd, line.encode("utf-8"))


def acquire(
    root: Path,
    mode: LockMode,
    role: str,
    *,
    port: int | None = None,
    url: str = "",
    locker: Locker | None = None,
) -> RootLock:
    """Take the root's lock without waiting; create the root and the lock file if missing,
    then write the holder line (pid, ``role``, ``port``, ``url``, start time).

    ``locker`` defaults to the platform's. Raises :class:`RootLocked` when another holder
    conflicts and OSError when the root cannot be created or the lock file opened.
    """
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = root / LOCK_FILE
    locker = platform_locker() if locker is None else locker
    holder = Holder(
        pid=os.getpid(),
        role=role,
        mode=mode,
        port=port,
        url=url,
        started=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    )
    fd = os.open(path, os.O_RDWR | os.O_CREAT | getattr(os, "O_BINARY", 0), 0o600)
    try:
        taken = locker.lock(fd, mode)
    except BaseException:
        os.close(fd)
        raise
    if not taken:
        os.close(fd)
        raise RootLocked(root, mode, read_holder(root), role)
    # Shared holders (cluster nodes) overwrite each other's line: it names one of them.
    try:
        _write_holder(fd, holder)
    except OSError:
        log.warning("the holder line of %s could not be written", path)
    return RootLock(path, fd, mode, locker, holder)
