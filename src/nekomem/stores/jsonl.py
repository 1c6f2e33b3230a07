"""Append-only newline-delimited JSON files (outbox.ndjson, events.ndjson).

One record is one compact JSON object on one line. An append writes every line of the
batch with one ``write`` on an ``O_APPEND`` descriptor and fsyncs before returning, so a
returned append is durable. A crash in the middle of an append can leave the last line
torn (no final newline, half an object). Readers ignore such a tail, and the next append
cuts it off before writing, so a new record is never glued to a fragment. A tail that *is*
a complete JSON object (only the newline was lost) is kept and terminated instead.

The object is not thread-safe: it belongs to the single actor that owns the file.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from nekomem.domain.turns import parse_timestamp
from nekomem.stores import fence
from nekomem.stores.atomic import atomic_write_bytes, fsync_dir
from nekomem.stores.private import private_folder

log = logging.getLogger(__name__)

T = TypeVar("T")

# Backward scan step when looking for the last line boundary of a file.
_SCAN_CHUNK_BYTES = 64 * 1024
_NEWLINE = b"\n"


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _read_range(fd: int, start: int, length: int) -> bytes:
    os.lseek(fd, start, os.SEEK_SET)
    parts: list[bytes] = []
    while length > 0:
        chunk = os.read(fd, length)
        if not chunk:
            break
        parts.append(chunk)
        length -= len(chunk)
    return b"".join(parts)


def _is_json(raw: bytes) -> bool:
    try:
        msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return False
    return True


class NdjsonLog:
    """An append-only ndjson file owned by one actor.

    ``append`` / ``rewrite`` take already-encoded JSON values (one per line, without the
    newline). ``read_records`` decodes every line into a msgspec type, skipping lines that
    do not decode (logged at WARNING with the line number only, never the content).
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._tail_clean = False  # known to end on a line boundary (checked or self-written)
        self._lines: int | None = None

    # -- writing -----------------------------------------------------------------------

    def append(self, lines: Sequence[bytes], *, durable: bool = True) -> None:
        """Append the encoded values as lines, then fsync (unless ``durable`` is False: a
        killed process still leaves the lines, a power loss may not). Raises OSError.

        Each value must be a single line (compact msgspec JSON always is). On failure
        the file is cut back to its length before the call, so that none of its lines is
        stored (a full disk still allows the cut, which frees space). Only when the cut fails
        too may they be absent, torn or present; a later append repairs a torn tail.
        """
        if not lines:
            return
        for line in lines:
            if _NEWLINE in line:
                raise ValueError("an ndjson record must not contain a raw newline")
        data = b"".join(line + _NEWLINE for line in lines)
        # Appended to (or checked) before in this process: the file is there, no stat.
        existed = self._tail_clean or self.path.exists()
        flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | getattr(os, "O_BINARY", 0)
        try:
            fd = os.open(self.path, flags, 0o600)
        except FileNotFoundError:  # the folder is missing: create it (once, not per append)
            private_folder(self.path.parent)
            fd = os.open(self.path, flags, 0o600)
        size: int | None = None
        try:
            fence.check(self.path)  # cluster mode: before the first byte is appended
            if not self._tail_clean:
                self._repair_tail(fd)
            size = os.fstat(fd).st_size
            _write_all(fd, data)
            if durable:
                os.fsync(fd)
        except BaseException:
            self._tail_clean = False
            self._lines = None
            if size is not None:
                self._cut_back(fd, size)
            raise
        finally:
            os.close(fd)
        if not existed:
            fsync_dir(self.path.parent)  # the new file's folder entry must survive a crash too
        self._tail_clean = True
        if self._lines is not None:
            self._lines += len(lines)

    def sync(self) -> None:
        """fsync the file, making every line appended with ``durable=False`` durable (a
        missing file is nothing to sync). Raises OSError."""
        try:
            fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_BINARY", 0))
        except FileNotFoundError:
            return
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def rewrite(self, lines: Sequence[bytes]) -> None:
        """Atomically replace the whole file with these lines (see atomic_write_bytes)."""
        for line in lines:
            if _NEWLINE in line:
                raise ValueError("an ndjson record must not contain a raw newline")
        atomic_write_bytes(self.path, b"".join(line + _NEWLINE for line in lines))
        self._tail_clean = True
        self._lines = len(lines)

    def _cut_back(self, fd: int, size: int) -> None:
        """Truncate to ``size`` after a failed append, and sync the cut (best effort: the
        append's own error is the one raised)."""
        try:
            os.ftruncate(fd, size)
            os.fsync(fd)
        except OSError:
            return
        self._tail_clean = True

    def _repair_tail(self, fd: int) -> None:
        size = os.fstat(fd).st_size
        if size == 0:
            self._tail_clean = True
            return
        tail_start = 0
        pos = size
        while pos > 0:
            start = max(0, pos - _SCAN_CHUNK_BYTES)
            chunk = _read_range(fd, start, pos - start)
            index = chunk.rfind(_NEWLINE)
            if index >= 0:
                tail_start = start + index + 1
                break
            pos = start
        if tail_start < size:
            tail = _read_range(fd, tail_start, size - tail_start)
            if _is_json(tail):
                _write_all(fd, _NEWLINE)
                log.warning("%s: last line had no newline; terminated it", self.path.name)
            else:
                os.ftruncate(fd, tail_start)
                log.warning(
                    "%s: cut a torn last line (%d bytes) left by an interrupted append",
                    self.path.name,
                    size - tail_start,
                )
                self._lines = None
            os.fsync(fd)
        self._tail_clean = True

    # -- reading -----------------------------------------------------------------------

    def read_lines(self) -> list[tuple[int, bytes]]:
        """Every non-blank line as ``(1-based line number, raw bytes)``; a torn tail is left out.

        A missing file reads as empty. Other OSErrors propagate.
        """
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            self._lines = 0
            return []
        pieces = data.split(_NEWLINE)
        tail = pieces.pop()  # b"" when the file ends with a newline
        count = len(pieces)
        if tail.strip():
            if _is_json(tail):
                pieces.append(tail)
                count += 1
            else:
                log.warning("%s: ignoring a torn last line (%d bytes)", self.path.name, len(tail))
        self._lines = count
        return [(number, raw) for number, raw in enumerate(pieces, start=1) if raw.strip()]

    def read_records(self, type: type[T] | Any, *, what: str = "record") -> list[T]:
        """Decode every line into ``type``; undecodable lines are skipped with a WARNING."""
        decoder: msgspec.json.Decoder[Any] = msgspec.json.Decoder(type)
        records: list[T] = []
        for number, raw in self.read_lines():
            try:
                records.append(decoder.decode(raw))
            except msgspec.DecodeError as exc:
                log.warning(
                    "%s line %d: skipping a corrupt %s (%s)",
                    self.path.name,
                    number,
                    what,
                    exc.__class__.__name__,
                )
        return records

    @property
    def line_count(self) -> int:
        """Number of lines in the file (a torn tail excluded); read once, then kept up to date."""
        if self._lines is None:
            self.read_lines()
        assert self._lines is not None
        return self._lines


def require_iso(value: Any, what: str = "timestamp") -> str:
    """Return ``value`` unchanged if it is a parseable ISO 8601 string, else raise ValueError."""
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{what} must be a non-empty ISO 8601 string")
    try:
        parse_timestamp(value)
    except ValueError:
        raise ValueError(f"{what} {value!r} is not ISO 8601") from None
    return value
