"""Storage faults: the disk is full, read-only or failing.

These are faults of the environment, not of nekomem's state: the right answer is to refuse
the write with a clear status (507 / 503 and ``Retry-After``), keep the in-memory state
equal to what is on disk, and carry on as soon as the disk recovers, never to mark a
character failed. :func:`classify` recognises them in an exception (an ``OSError`` errno
or an SQLite result code, also when wrapped); :class:`StorageHealth` keeps what ``/health``
reports.
"""

from __future__ import annotations

import errno
import os
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# SQLite primary result codes (the low byte of an extended code).
_SQLITE_PERM, _SQLITE_READONLY, _SQLITE_IOERR, _SQLITE_FULL, _SQLITE_CANTOPEN = 3, 8, 10, 13, 14
# SQLITE_IOERR_SHMSIZE: the WAL index (-shm) could not be grown. SQLite writes to the file
# to grow it, so that no room on the disk shows as this error rather than a crash: on a
# full disk it is the first error a journal's reopening meets, and it means "full".
_SQLITE_IOERR_SHMSIZE = 4874


@dataclass(frozen=True)
class StorageFault:
    """One class of storage trouble: ``code`` is the API ``error_code``."""

    code: str
    status: int
    message: str


FULL = StorageFault("storage_full", 507, "the memory folder's disk is full; nothing was stored. Free space and retry")
READ_ONLY = StorageFault("storage_read_only", 503, "the memory folder is not writable; nothing was stored. Restore write access and retry")
IO_ERROR = StorageFault("storage_io_error", 503, "the memory folder's disk reported an I/O error; nothing was stored. Retry later")
TOO_MANY_FILES = StorageFault(
    "too_many_open_files",
    503,
    "the server has as many files open as its open-file limit (RLIMIT_NOFILE) allows; nothing was stored. "
    "Retry later, or raise the limit or lower max_active_characters",
)
# Cluster mode: the node lost (or may be losing) the shard the file belongs to.
FENCED = StorageFault("shard_fenced", 503, "this node does not own the character's shard now; nothing was stored. Retry shortly")
FAULT_CODES = frozenset(f.code for f in (FULL, READ_ONLY, IO_ERROR, TOO_MANY_FILES, FENCED))

_ERRNO = {
    errno.ENOSPC: FULL,
    errno.EDQUOT: FULL,
    errno.EFBIG: FULL,
    errno.EROFS: READ_ONLY,
    errno.EACCES: READ_ONLY,
    errno.EPERM: READ_ONLY,
    errno.EIO: IO_ERROR,
    errno.EMFILE: TOO_MANY_FILES,
    errno.ENFILE: TOO_MANY_FILES,
}
_SQLITE = {_SQLITE_FULL: FULL, _SQLITE_READONLY: READ_ONLY, _SQLITE_PERM: READ_ONLY, _SQLITE_CANTOPEN: READ_ONLY, _SQLITE_IOERR: IO_ERROR}
_SQLITE_TEXT = (("disk is full", FULL), ("readonly database", READ_ONLY), ("disk i/o error", IO_ERROR), ("unable to open", READ_ONLY))


class StorageError(OSError):
    """An OSError the store layer has classified (``fault``); still an OSError, so every
    ``except OSError`` keeps working."""

    def __init__(self, fault: StorageFault, cause: BaseException) -> None:
        super().__init__(getattr(cause, "errno", None) or errno.EIO, f"{fault.code}: {cause}")
        self.fault = fault


def classify(exc: BaseException | None) -> StorageFault | None:
    """The storage fault behind ``exc`` (or its cause / context chain), or None."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, StorageError):
            return exc.fault
        if isinstance(exc, OSError) and exc.errno in _ERRNO:
            return _ERRNO[exc.errno]
        if isinstance(exc, sqlite3.Error):
            code = getattr(exc, "sqlite_errorcode", None)
            # SQLite reports a failed open as CANTOPEN whatever the cause: out of file
            # descriptors is told apart by trying to open one.
            if (code is not None and code & 0xFF == _SQLITE_CANTOPEN or "unable to open" in str(exc).lower()) and out_of_fds():
                return TOO_MANY_FILES
            if code == _SQLITE_IOERR_SHMSIZE:
                return FULL
            if code is not None and code & 0xFF in _SQLITE:
                return _SQLITE[code & 0xFF]
            text = str(exc).lower()
            for needle, fault in _SQLITE_TEXT:
                if needle in text:
                    return fault
        exc = exc.__cause__ or exc.__context__
        seen += 1
    return None


def out_of_fds(margin: int = 16) -> bool:
    """True when this process is out of file descriptors, or within ``margin`` of its
    soft RLIMIT_NOFILE (a failed open may have released a few by the time it is
    classified: SQLite closes the database when its journal will not open)."""
    try:
        fd = os.open(os.devnull, os.O_RDONLY)
    except OSError as exc:
        return exc.errno in (errno.EMFILE, errno.ENFILE)
    os.close(fd)
    try:
        import resource

        soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        count = len(os.listdir("/proc/self/fd" if os.path.isdir("/proc/self/fd") else "/dev/fd"))
    except (ImportError, OSError) as exc:
        return getattr(exc, "errno", None) in (errno.EMFILE, errno.ENFILE)
    return soft != resource.RLIM_INFINITY and count >= soft - margin


def raise_classified(exc: OSError) -> None:
    """Re-raise ``exc`` as a StorageError when it is a storage fault (else unchanged)."""
    fault = classify(exc)
    if fault is not None and not isinstance(exc, StorageError):
        raise StorageError(fault, exc) from exc
    raise exc


class StorageHealth:
    """Storage trouble seen by the actors, per character and layer (thread-safe), plus a
    direct look at the memory root's file system, for ``/health``."""

    def __init__(self, root: Path) -> None:
        self.root = Path(root)
        self._lock = threading.Lock()
        self._faults: dict[tuple[str, str], tuple[str, float]] = {}
        self._unrebuilt: dict[tuple[str, str], str] = {}
        self._damaged: dict[str, str] = {}
        self._errors: dict[tuple[str, str], int] = {}

    def report(self, character: str, layer: str, fault: StorageFault) -> None:
        """Layer ``layer`` of ``character`` hit ``fault`` (kept for /health until cleared)."""
        with self._lock:
            self._faults.setdefault((character, layer), (fault.code, time.time()))
        self.count(layer, fault)

    def count(self, where: str, fault: StorageFault) -> None:
        """Count one storage error met by ``where`` (a layer, ``supervisor`` or ``http``)."""
        with self._lock:
            self._errors[(fault.code, where)] = self._errors.get((fault.code, where), 0) + 1

    def error_counts(self) -> dict[tuple[str, str], int]:
        """Storage errors since start per (error code, where), for /metrics."""
        with self._lock:
            return dict(self._errors)

    def fault_count(self) -> int:
        """Layers currently reporting a storage fault."""
        with self._lock:
            return len(self._faults)

    def has_fault(self, character: str) -> bool:
        """Whether a layer of ``character`` reports a storage fault now."""
        with self._lock:
            return any(c == character for c, _layer in self._faults)

    def clear(self, character: str, layer: str) -> None:
        with self._lock:
            self._faults.pop((character, layer), None)

    def forget_character(self, character: str) -> None:
        """Drop everything reported about ``character`` (its folder was deleted or renamed)."""
        with self._lock:
            self._faults = {k: v for k, v in self._faults.items() if k[0] != character}
            self._unrebuilt = {k: v for k, v in self._unrebuilt.items() if k[0] != character}
            self._damaged.pop(character, None)

    def unrebuilt(self, character: str, view: str, detail: str) -> None:
        """A corrupt view could not be rebuilt completely (``detail`` says what is missing)."""
        with self._lock:
            self._unrebuilt[(character, view)] = detail

    def damaged(self, character: str, detail: str) -> None:
        """The character's journal (time_indexed.db) was found damaged at load and kept
        aside (``detail`` says what and what is served instead); reported until restart."""
        with self._lock:
            self._damaged[character] = detail

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            if any(code == TOO_MANY_FILES.code for code, _since in self._faults.values()) and not out_of_fds():
                # A fault of the process, not of a layer's files: gone once descriptors can be
                # opened again (each such layer reloads at its next message anyway).
                self._faults = {k: v for k, v in self._faults.items() if v[0] != TOO_MANY_FILES.code}
            damaged = [{"character": c, "detail": d} for c, d in self._damaged.items()]
            faults = [
                {"character": c, "layer": layer, "error_code": code, "since": since} for (c, layer), (code, since) in self._faults.items()
            ]
            unrebuilt = [{"character": c, "view": v, "detail": d} for (c, v), d in self._unrebuilt.items()]
        disk = self.probe()
        state = "ok"
        if disk.get("read_only"):
            state = READ_ONLY.code
        elif disk.get("free_bytes") == 0:
            state = FULL.code
        elif faults:
            # A fault of the process (out of file descriptors) before the disk's.
            codes = [str(f["error_code"]) for f in faults]
            state = TOO_MANY_FILES.code if TOO_MANY_FILES.code in codes else codes[0]
        elif damaged:
            state = "journal_damaged"
        return {"state": state, **disk, "faults": faults, "unrebuilt_views": unrebuilt, "damaged_journals": damaged}

    def probe(self) -> dict[str, Any]:
        """Free bytes and the read-only flag of the memory root's file system."""
        folder = self.root
        while not folder.exists() and folder.parent != folder:
            folder = folder.parent
        try:
            st = os.statvfs(folder)
        except (OSError, AttributeError):
            return {}
        return {"free_bytes": st.f_bavail * st.f_frsize, "read_only": bool(st.f_flag & os.ST_RDONLY)}
