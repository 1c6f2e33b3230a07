"""Crash-safe whole-file writes and tolerant JSON reads.

Every JSON view of a character is replaced atomically: the new content goes to a temp file
in the same folder (``.nkatmp<8 hex>.tmp``, created exclusively with mode 0600), is flushed
and fsync'd, renamed over the target with :func:`os.replace`, and then the folder itself is
fsync'd so that the rename survives a power loss. A reader therefore always sees either the
complete old file or the complete new one.

A file that cannot be decoded is never deleted: :func:`read_json` renames it aside to
``<name>.corrupt-<UTC timestamp>`` and hands back the caller's default, so one bad file
degrades to "not there" instead of stopping the server. Likewise single records of a view
that decode as JSON but fail validation are never dropped: :func:`read_records` copies them
to ``<name>.rejected-<UTC timestamp>`` before the next view write could lose them.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import itertools
import logging
import os
import re
import secrets
import sys
import time
from collections.abc import Callable, Mapping, Sized
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal, TypeVar, cast

import msgspec

from nekomem.stores import fence
from nekomem.stores.private import private_folder

log = logging.getLogger(__name__)

T = TypeVar("T")

ReadStatus = Literal["ok", "missing", "corrupt"]

TEMP_PREFIX = ".nkatmp"
TEMP_SUFFIX = ".tmp"
_TEMP_RE = re.compile(r"^\.nkatmp[0-9a-f]{8}\.tmp$")
# Temp names count up from a random start per process (no random read per write); a
# name taken by another process is skipped by O_EXCL. The bound only stops a pathological
# folder (say, one full of directories with our names) from looping forever.
_TEMP_NAME_TRIES = 32
_temp_numbers = itertools.count(secrets.randbits(32))

_encoder = msgspec.json.Encoder()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def fsync_dir(folder: Path) -> None:
    """fsync a folder so that entries created, renamed or removed in it are durable.

    A no-op on platforms that cannot open a folder (Windows). Raises OSError otherwise.
    """
    if os.name == "nt":
        return
    fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _open_temp(folder: Path) -> tuple[int, Path]:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0) | getattr(os, "O_NOFOLLOW", 0)
    last_error: OSError | None = None
    for _ in range(_TEMP_NAME_TRIES):
        candidate = folder / f"{TEMP_PREFIX}{next(_temp_numbers) & 0xFFFFFFFF:08x}{TEMP_SUFFIX}"
        try:
            return os.open(candidate, flags, 0o600), candidate
        except FileExistsError as exc:
            last_error = exc
        except IsADirectoryError as exc:  # a folder squatting on the name
            last_error = exc
    raise FileExistsError(errno.EEXIST, f"no free temp file name in {folder}") from last_error


def atomic_write_bytes(path: Path, data: bytes, *, durable: bool = True) -> os.stat_result:
    """Replace ``path`` with ``data`` atomically and durably; returns the new file's stat
    (taken before the rename, which changes neither its inode, size nor mtime).

    Creates missing parent folders. When this returns, the new content is on disk (file and
    folder fsync'd). On any exception (including KeyboardInterrupt) the temp file is removed
    and ``path`` still holds its previous content. Raises OSError on I/O failure.

    ``durable=False`` skips both fsyncs: readers and a killed process still see the old or
    the new content whole, but a power loss may keep the old one. Only for views rebuilt at
    start-up from a store that is durable.
    """
    path = Path(path)
    folder = path.parent
    try:
        fd, temp = _open_temp(folder)
    except FileNotFoundError:  # the folder is missing: create it (not a mkdir per write)
        private_folder(folder)
        fd, temp = _open_temp(folder)
    try:
        try:
            _write_all(fd, data)
            if durable:
                os.fsync(fd)
            written = os.fstat(fd)
        finally:
            os.close(fd)
        fence.check(path)  # cluster mode: the last look before the rename commits
        os.replace(temp, path)
    except BaseException:
        try:
            os.unlink(temp)
        except OSError:
            pass
        raise
    if durable:
        fsync_dir(folder)
    return written


SWAP_PREFIX = ".nkatmp-swap-"  # <prefix><view name>: the standing second inode of a view


def _load_renameat2() -> Callable[..., int] | None:
    """libc's ``renameat2`` (Linux), or None where there is none."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    exchange: Callable[..., int] = fn
    return exchange


_renameat2 = _load_renameat2()
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
_SWAP_FLAGS = os.O_WRONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_NO_EXCHANGE = {errno.EINVAL, errno.ENOSYS, getattr(errno, "EOPNOTSUPP", errno.EINVAL)}


@functools.lru_cache(maxsize=4096)
def _swap_names(path: Path) -> tuple[bytes, bytes]:
    """The encoded names of a view and of its swap file (built once per view: every
    request writes the view)."""
    path = Path(path)
    return os.fsencode(path), os.fsencode(path.with_name(SWAP_PREFIX + path.name))


def swap_write_bytes(path: Path, data: bytes) -> os.stat_result:
    """Replace ``path`` with ``data`` atomically, without fsync (see ``durable=False`` of
    :func:`atomic_write_bytes`), for a view rewritten on every request; returns the new
    file's stat.

    Where the file system can (Linux ``renameat2(RENAME_EXCHANGE)``), the data goes into
    a standing second file, ``.nkatmp-swap-<name>`` next to ``path``, which is then
    exchanged with ``path`` in one step: readers and a killed process see the old or the
    new content whole, as with a rename, but no inode is created or freed per write (on
    ext4 that is most of a rename-replace's CPU). The swap file then holds the previous
    content, and is overwritten by the next write. Elsewhere, or when the exchange is
    refused, this is ``atomic_write_bytes(path, data, durable=False)``. Raises OSError.
    """
    if _renameat2 is None:
        return atomic_write_bytes(path, data, durable=False)
    target, swap = _swap_names(path)
    try:
        fd = os.open(swap, _SWAP_FLAGS, 0o600)
    except OSError:  # a missing folder, or something squatting on the name
        return atomic_write_bytes(path, data, durable=False)
    try:
        view = memoryview(data)
        offset = 0
        while offset < len(data):
            offset += os.pwrite(fd, view[offset:], offset)
        written = os.fstat(fd)
        if written.st_size > len(data):  # the view shrank (a trim): cut the older tail
            os.ftruncate(fd, len(data))
            written = os.fstat(fd)
    finally:
        os.close(fd)
    fence.check(path)
    if _renameat2(_AT_FDCWD, swap, _AT_FDCWD, target, _RENAME_EXCHANGE) == 0:
        return written
    err = ctypes.get_errno()
    if err == errno.ENOENT or err in _NO_EXCHANGE:
        # No file to exchange with yet (the first write), or a file system without
        # exchange: an ordinary rename (which uses the swap file up).
        os.replace(swap, target)
        return written
    raise OSError(err, os.strerror(err), str(path))


def drop_swap(path: Path) -> None:
    """Remove the swap file of ``path`` (see :func:`swap_write_bytes`), which holds an
    older content of the view: after an edit that must not linger, such as a deletion.
    The removal is durable only with the next fsync of the folder: call it right before
    a durable :func:`atomic_write_bytes` into the same folder, whose folder fsync covers it."""
    try:
        os.unlink(Path(path).with_name(SWAP_PREFIX + Path(path).name))
    except FileNotFoundError:
        pass


def atomic_write_text(path: Path, text: str) -> None:
    """:func:`atomic_write_bytes` of ``text`` encoded as UTF-8."""
    atomic_write_bytes(path, text.encode("utf-8"))


def encode_json(obj: Any) -> bytes:
    """Encode ``obj`` (plain values or msgspec Structs) as compact UTF-8 JSON with a final newline.

    Compact, not indented: indentation costs bytes per nesting level on every line, so a
    view's size would grow with the square of its depth rather than with its content.
    Raises TypeError for values msgspec cannot encode.
    """
    return _encoder.encode(obj) + b"\n"


def atomic_write_json(path: Path, obj: Any, *, durable: bool = True) -> None:
    """Atomically replace ``path`` with ``obj`` as compact JSON (see :func:`encode_json`).

    The value is encoded before anything touches the disk, so an unencodable value raises
    TypeError and leaves the file alone. Raises OSError on I/O failure. ``durable`` as in
    :func:`atomic_write_bytes`.
    """
    atomic_write_bytes(path, encode_json(obj), durable=durable)


def _aside_name(path: Path, tag: str = "corrupt") -> Path:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%S%fZ")
    candidate = path.with_name(f"{path.name}.{tag}-{stamp}")
    counter = 1
    while candidate.exists():
        candidate = path.with_name(f"{path.name}.{tag}-{stamp}-{counter}")
        counter += 1
    return candidate


def move_aside(path: Path, reason: str) -> Path:
    """Rename a damaged file to ``<name>.corrupt-<UTC timestamp>`` (never deleting it).

    Logs a WARNING with the reason (metadata only) and returns the new path. Raises OSError
    if the rename fails.
    """
    target = _aside_name(path)
    fence.check(path)
    os.replace(path, target)
    try:
        fsync_dir(path.parent)
    except OSError:
        log.debug("could not fsync %s after moving a corrupt file aside", path.parent, exc_info=True)
    log.warning("corrupt file %s moved aside to %s: %s", path, target.name, reason)
    return target


def read_json(path: Path, *, type: Any = None, default: Any = None) -> tuple[Any, ReadStatus]:
    """Read and decode a JSON file.

    ``type`` (a msgspec-compatible type, e.g. a Struct) makes the decode strict: a file that
    parses but does not match the schema counts as corrupt. Returns ``(value, "ok")``,
    ``(default, "missing")`` when the file does not exist, or ``(default, "corrupt")`` after
    moving an undecodable file aside (see :func:`move_aside`). Other OSErrors (permissions,
    a folder in place of the file) propagate: answering "missing" there would let the next
    write clobber data that is merely unreadable right now.
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return default, "missing"
    try:
        if type is None:
            value = msgspec.json.decode(raw)
        else:
            value = msgspec.json.decode(raw, type=type)
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError) as exc:
        # RecursionError: nesting deeper than any decoder can follow is as unreadable as
        # broken syntax, and must not fail every start of the character.
        reason = f"{exc.__class__.__name__}: {exc}" if isinstance(exc, msgspec.ValidationError) else "not valid JSON"
        try:
            move_aside(path, reason)
        except OSError:
            log.warning("corrupt file %s could not be moved aside (%s)", path, reason, exc_info=True)
        return default, "corrupt"
    return value, "ok"


def _read_typed(path: Path, record_type: type[T]) -> list[T] | None:
    """The view ``path`` decoded as ``list[record_type]``, or None when it is missing or
    any part of it does not decode so (the slow path then sorts it out)."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    decoder = _TYPED_DECODERS.get(record_type)
    if decoder is None:
        decoder = _TYPED_DECODERS[record_type] = msgspec.json.Decoder(list[record_type], strict=False)  # type: ignore[valid-type]
    try:
        return cast("list[T]", decoder.decode(raw))
    except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
        return None


_TYPED_DECODERS: dict[type[Any], msgspec.json.Decoder[Any]] = {}


def keep_rejected(path: Path, rejected: list[Any], what: str) -> Path:
    """Write the raw ``rejected`` records of view ``path`` to ``<name>.rejected-<UTC
    timestamp>`` (atomically, next to the view) and log a WARNING with their count only.

    Called before the view is rewritten without them, so nothing that could not be read is
    ever lost. Raises OSError (the caller must then not rewrite the view) or TypeError for
    a value that cannot be encoded.
    """
    target = _aside_name(Path(path), "rejected")
    atomic_write_json(target, rejected)
    log.warning("%d unreadable %s of %s kept in %s", len(rejected), what, Path(path).name, target.name)
    return target


def read_records(
    path: Path,
    convert: Callable[[Any], T],
    what: str,
    on_corrupt: Callable[[Path], None] | None = None,
    *,
    fast: tuple[type[T], Callable[[T], T]] | None = None,
) -> tuple[list[T], int]:
    """The records of the JSON list view ``path``, each passed through ``convert``, and how
    many were set aside (the caller should rewrite the view, so they are kept only once).

    A missing file gives no record; an undecodable one is moved aside (see
    :func:`read_json`). Records ``convert`` rejects (msgspec.ValidationError, TypeError,
    ValueError), or a whole value that is not a list, are kept by :func:`keep_rejected` and
    left out of the result. Raises OSError when the file or the rejected records cannot be
    read or written. ``on_corrupt(path)`` is called when the file was undecodable (so the
    caller can rebuild it from elsewhere).

    ``fast = (record type, check)``: the view is first decoded straight into a list of that
    msgspec Struct (lax, as ``msgspec.convert(strict=False)``) and each record passed
    through ``check`` only, which skips building a dict per record (most of a long view's
    load); when any record does not decode so, the view is read record by record as above.
    """
    if fast is not None:
        typed = _read_typed(path, fast[0])
        if typed is not None:
            return [fast[1](record) for record in typed], 0
    raw, status = read_json(path, default=[])
    if status == "corrupt" and on_corrupt is not None:
        on_corrupt(path)
    if status != "ok":
        return [], 0
    items = raw if isinstance(raw, list) else None
    result: list[T] = []
    rejected: list[Any] = [raw] if items is None else []
    for item in items or []:
        try:
            result.append(convert(item))
        except (msgspec.ValidationError, TypeError, ValueError):
            rejected.append(item)
    if rejected:
        keep_rejected(path, rejected, what)
    return result, len(rejected)


def shard_counts(folder: Path, pending: Mapping[str, Sized]) -> dict[str, int]:
    """Entries per archive shard file: those on disk in ``folder`` (``*.json``) plus
    ``pending`` ones not written yet (shard name -> entries)."""
    counts: dict[str, int] = {}
    if Path(folder).exists():
        for shard in Path(folder).glob("*.json"):
            raw, _ = read_json(shard, default=[])
            counts[shard.name] = len(raw) if isinstance(raw, list) else 0
    for name, entries in pending.items():
        counts[name] = counts.get(name, 0) + len(entries)
    return counts


def sweep_temp_files(folder: Path, older_than_seconds: float, *, now: float | None = None) -> int:
    """Remove leftover ``.nkatmp<8 hex>.tmp`` files in ``folder`` older than the given age.

    Such files are what a crash between temp-file creation and rename leaves behind; they
    never hold the only copy of anything. Only regular files matching the exact temp name
    are touched, and the scan is not recursive. ``now`` defaults to ``time.time()``.
    Returns how many files were removed; a missing folder removes nothing.
    """
    folder = Path(folder)
    cutoff = (time.time() if now is None else now) - older_than_seconds
    removed = 0
    try:
        entries = list(os.scandir(folder))
    except FileNotFoundError:
        return 0
    for entry in entries:
        if not _TEMP_RE.match(entry.name):
            continue
        try:
            if not entry.is_file(follow_symlinks=False):
                continue
            if entry.stat(follow_symlinks=False).st_mtime >= cutoff:
                continue
            os.unlink(entry.path)
            removed += 1
        except FileNotFoundError:
            continue
        except OSError:
            log.warning("could not remove stale temp file %s", entry.path, exc_info=True)
    if removed:
        log.info("removed %d stale temp file(s) in %s", removed, folder)
    return removed


def file_identity(path: Path) -> tuple[int, int, int] | None:
    """(inode, size, mtime in ns) of ``path``, or None when it cannot be stat'ed: a file
    re-read only when this changes (an edit in place or a replacing rename both change it)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)
