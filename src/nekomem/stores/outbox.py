"""The per-character outbox (outbox.ndjson): durable records of re-runnable background work.

A piece of background work is registered (``pending``) before it starts; every failed run
adds an ``attempt`` line and the end is a ``done`` line (``dead: true`` for a dead letter,
i.e. given up after too many attempts). All three are appended one line each and fsync'd
(a pending or done line may instead be held in memory and written, with every other held
line, by the next append or :meth:`Outbox.sync`: one write and one fsync for all; a done
line may also be left unsynced; a record that finishes while its pending line is still
held can be dropped from memory with :meth:`Outbox.drop_held` and never reach the file):

- ``{"status": "pending", "op_id", "type", "payload", "ts"}``
- ``{"status": "attempt", "op_id", "ts", "error"}``
- ``{"status": "done", "op_id", "ts", "dead"}``

The reference's lines (no ``error`` / ``dead`` keys) read the same way. Delivery is
at-least-once: at activation every pending record is replayed, so handlers must be
idempotent. How many attempts make a dead letter is the OutboxActor's policy, not this
file's. Not thread-safe: one owning actor per character.
"""

from __future__ import annotations

import itertools
import logging
import uuid
from collections.abc import Collection, Iterable, Mapping
from pathlib import Path
from typing import Any

import msgspec

from nekomem.stores.erasure import scrub_value
from nekomem.stores.jsonl import NdjsonLog, require_iso

log = logging.getLogger(__name__)

# An attempt's error text is diagnostic metadata (exception class and message); a stack
# trace or an echoed model reply must not bloat the file.
DEFAULT_ERROR_MAX_CHARS = 500


class _PendingLine(msgspec.Struct, tag_field="status", tag="pending"):
    op_id: str
    type: str
    ts: str
    payload: dict[str, Any] = msgspec.field(default_factory=dict)


class _AttemptLine(msgspec.Struct, tag_field="status", tag="attempt"):
    op_id: str
    ts: str
    error: str = ""


class _DoneLine(msgspec.Struct, tag_field="status", tag="done"):
    op_id: str
    ts: str
    dead: bool = False


_Line = _PendingLine | _AttemptLine | _DoneLine


class OutboxRecord(msgspec.Struct, frozen=True):
    """A registered operation as the scan sees it.

    ``attempts`` counts failed runs so far; ``last_error`` is the newest attempt's error;
    ``done_ts`` is set only for finished records (dead letters).
    """

    op_id: str
    type: str
    payload: dict[str, Any]
    attempts: int
    ts: str
    last_error: str = ""
    done_ts: str | None = None


class _Scan(msgspec.Struct):
    pending: dict[str, _PendingLine]
    attempts: dict[str, list[_AttemptLine]]
    done: dict[str, _DoneLine]
    raw: list[tuple[str, str, bytes]]  # (op_id, status, raw line) of every readable line


_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder(_Line)
_OP_PREFIX = uuid.uuid4().hex[:16]
_op_numbers = itertools.count(1)


class Outbox:
    """Append-only log of background operations.

    ``known_types``, when given, is the registry of op types; :meth:`add` refuses anything
    else with ValueError. Op type strings are a wire format: never rename one.
    """

    def __init__(
        self,
        path: Path,
        *,
        known_types: Iterable[str] | None = None,
        error_max_chars: int = DEFAULT_ERROR_MAX_CHARS,
    ) -> None:
        self.path = Path(path)
        self.known_types = frozenset(known_types) if known_types is not None else None
        self.error_max_chars = error_max_chars
        self._log = NdjsonLog(self.path)
        # Lines of ``defer`` calls, not yet in the file, encoded only when written (a
        # record dropped by drop_held is never encoded).
        self._held: list[_Line] = []
        # Lines may be in the file without an fsync (appended with durable=False, or left
        # by an earlier process): sync() fsyncs only then.
        self._dirty = True

    def _append(self, line: _Line, *, durable: bool, defer: bool) -> None:
        if defer:
            self._held.append(line)
            return
        encoded = _encoder.encode(line)  # before the held lines are taken: a TypeError loses none
        self._log.append([*self._take_held(), encoded], durable=durable)  # held lines first: file order is call order
        self._dirty = not durable

    @property
    def held(self) -> int:
        """Lines of ``defer`` calls that are not in the file yet."""
        return len(self._held)

    def _take_held(self) -> list[bytes]:
        encoded = [_encoder.encode(line) for line in self._held]
        self._held = []
        return encoded

    def drop_held(self, op_id: str) -> bool:
        """Forget every held line of ``op_id`` when its pending line is still held (the
        record finished before any line of it was written: the file needs none of them);
        True when they were dropped, False (nothing changed) when the pending line is
        already in the file or was never held."""
        if not any(isinstance(line, _PendingLine) and line.op_id == op_id for line in self._held):
            return False
        self._held = [line for line in self._held if line.op_id != op_id]
        return True

    def write_held(self) -> None:
        """Append the held lines without fsync (a killed process keeps them). Raises OSError."""
        self._log.append(self._take_held(), durable=False)
        self._dirty = True

    # -- writing -----------------------------------------------------------------------

    def add(self, type: str, payload: Mapping[str, Any], ts: str, *, durable: bool = True, defer: bool = False) -> str:
        """Register a pending operation durably; return its op_id (32 hex digits: a random
        prefix per process and a counter, unique across restarts without a random read each).
        ``durable=False`` appends without fsync (a killed process keeps the line); the
        caller then makes it durable with :meth:`sync` before relying on it. ``defer``
        holds the line in memory until the next append or :meth:`sync` writes it (a killed
        process loses it: only for records the caller can rebuild after a crash); it is
        encoded only then, so a held payload must be plain JSON data.

        Raises ValueError (unknown type, bad ts, payload not a mapping), TypeError
        (payload not JSON encodable) before writing, OSError if the write fails.
        """
        if self.known_types is not None and type not in self.known_types:
            raise ValueError(f"unknown outbox op type {type!r}")
        if not isinstance(payload, Mapping):
            raise ValueError("outbox payload must be a mapping")
        op_id = f"{_OP_PREFIX}{next(_op_numbers):016x}"
        line = _PendingLine(op_id=op_id, type=type, ts=require_iso(ts, "outbox ts"), payload=dict(payload))
        self._append(line, durable=durable, defer=defer)
        return op_id

    def sync(self) -> None:
        """Write the held lines and fsync the file: every line so far is durable (one
        write and one fsync for all of them; no fsync when every line in the file is
        durable already and none is held). Raises OSError."""
        if self._held:
            self._log.append(self._take_held())
        elif self._dirty:
            self._log.sync()
        self._dirty = False

    def attempt(self, op_id: str, error: str, ts: str) -> None:
        """Record one failed run of ``op_id`` (error text is cut to ``error_max_chars``).

        Raises ValueError for a bad ts, OSError if the write fails; a caller that cannot
        persist the attempt should treat the failure as transient (the op stays pending).
        """
        text = error if len(error) <= self.error_max_chars else error[: self.error_max_chars] + "…"
        line = _AttemptLine(op_id=op_id, ts=require_iso(ts, "outbox ts"), error=text)
        self._append(line, durable=True, defer=False)

    def done(self, op_id: str, ts: str, dead: bool = False, *, durable: bool = True, defer: bool = False) -> None:
        """Record that ``op_id`` finished (``dead=True``: given up as a dead letter).
        ``durable=False`` skips the fsync, ``defer`` holds the line as in :meth:`add`: a
        done line lost to a crash only means the (idempotent) op runs once more.

        Raises ValueError for a bad ts, OSError if the write fails.
        """
        line = _DoneLine(op_id=op_id, ts=require_iso(ts, "outbox ts"), dead=dead)
        self._append(line, durable=durable, defer=defer)

    # -- reading -----------------------------------------------------------------------

    def _scan(self) -> _Scan:
        if self._held:
            self.write_held()  # a reader sees every line
        scan = _Scan(pending={}, attempts={}, done={}, raw=[])
        for number, raw in self._log.read_lines():
            try:
                line = _decoder.decode(raw)
            except msgspec.DecodeError as exc:
                log.warning("%s line %d: skipping a corrupt record (%s)", self.path.name, number, exc.__class__.__name__)
                continue
            if isinstance(line, _PendingLine):
                if line.op_id in scan.pending:
                    log.warning("%s line %d: duplicate op_id %s ignored", self.path.name, number, line.op_id)
                    continue
                scan.pending[line.op_id] = line
                scan.raw.append((line.op_id, "pending", raw))
            elif isinstance(line, _AttemptLine):
                scan.attempts.setdefault(line.op_id, []).append(line)
                scan.raw.append((line.op_id, "attempt", raw))
            else:
                scan.done.setdefault(line.op_id, line)
                scan.raw.append((line.op_id, "done", raw))
        return scan

    @staticmethod
    def _record(scan: _Scan, op_id: str) -> OutboxRecord:
        line = scan.pending[op_id]
        attempts = scan.attempts.get(op_id, [])
        done = scan.done.get(op_id)
        return OutboxRecord(
            op_id=op_id,
            type=line.type,
            payload=line.payload,
            attempts=len(attempts),
            ts=line.ts,
            last_error=attempts[-1].error if attempts else "",
            done_ts=done.ts if done is not None else None,
        )

    def pending(self) -> list[OutboxRecord]:
        """Unfinished operations in registration order, each with its attempt count.

        Corrupt lines and a torn last line are skipped (WARNING); attempt or done lines of
        an unknown op_id are ignored.
        """
        scan = self._scan()
        return [self._record(scan, op_id) for op_id in scan.pending if op_id not in scan.done]

    def records(self) -> list[OutboxRecord]:
        """Every registered operation still in the file (finished ones too), in order."""
        scan = self._scan()
        return [self._record(scan, op_id) for op_id in scan.pending]

    def dead_letters(self) -> list[OutboxRecord]:
        """Operations finished as dead letters, in registration order (until compacted away)."""
        scan = self._scan()
        return [self._record(scan, op_id) for op_id in scan.pending if op_id in scan.done and scan.done[op_id].dead]

    # -- maintenance ---------------------------------------------------------------------

    def compact(self, *, keep_dead_letters: bool = False) -> int:
        """Rewrite the file atomically with only the unfinished pending lines and their
        attempts (plus the dead letters' lines when asked); return the lines kept.

        Lines are kept byte for byte and in their original order. Corrupt lines go.
        Raises OSError.
        """
        scan = self._scan()
        keep = {op_id for op_id in scan.pending if op_id not in scan.done}
        if keep_dead_letters:
            keep |= {op_id for op_id in scan.pending if op_id in scan.done and scan.done[op_id].dead}
        kept = [raw for op_id, _status, raw in scan.raw if op_id in keep]
        before = self._log.line_count
        self._log.rewrite(kept)
        log.info("%s compacted: %d of %d lines kept", self.path.name, len(kept), before)
        return len(kept)

    def scrub(self, texts: Collection[str]) -> int:
        """Rewrite the file (atomically) with every copy of the erased ``texts`` removed
        from the payloads of its records, finished ones too (see
        :func:`nekomem.stores.erasure.scrub_value`); returns the records changed. Raises
        OSError."""
        scan = self._scan()
        lines: list[bytes] = []
        changed = 0
        for op_id, status, raw in scan.raw:
            if status == "pending":
                line = scan.pending[op_id]
                payload, hit = scrub_value(line.payload, texts)
                if hit:
                    changed += 1
                    raw = _encoder.encode(msgspec.structs.replace(line, payload=payload if isinstance(payload, dict) else {}))
            lines.append(raw)
        if changed:
            self._log.rewrite(lines)
        return changed

    @property
    def line_count(self) -> int:
        """Lines in outbox.ndjson (a torn tail excluded) and held lines."""
        return self._log.line_count + len(self._held)
