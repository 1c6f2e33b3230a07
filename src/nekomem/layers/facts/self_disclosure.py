"""Path B of the fact layer: the AI self-disclosure pass over the raw journal.

With powerful memory on, a pass is due after ``fact_self_disclosure_every_n_passes``
successful path-A batches, or once the conversation has been idle
``fact_self_disclosure_idle_seconds`` while processed turns wait uncovered. A pass reads the
journal (read-only; RecentActor is its writer) after the persisted cursor up to the newest
turn path A processed, at most ``fact_self_disclosure_max_window_messages`` rows; a longer
backlog is read by further passes right after. A failed pass keeps the cursor and backs off
(the path-A gate rules); after ``longterm_liveness_max_attempts`` failures in a row the
cursor is forced over the window. With powerful memory off no pass runs, but path A still
moves the newest processed turn forward, so switching back on covers everything since.
See :mod:`nekomem.domain.disclosure` for the window rules.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import msgspec

from nekomem.actors.messages import ModelResult
from nekomem.actors.ports import LayerPorts
from nekomem.domain import disclosure as dl
from nekomem.domain import facts as fl
from nekomem.domain.gates import task_gate
from nekomem.domain.prompts import longterm as prompts
from nekomem.domain.records import Fact
from nekomem.domain.turns import Turn, parse_timestamp
from nekomem.layers.facts.extraction import FactExtraction
from nekomem.layers.facts.state import FactStore
from nekomem.stores.atomic import atomic_write_json, read_json
from nekomem.stores.timeindex_read import TimeIndexReader, to_utc_iso


class DisclosureDone(ModelResult, frozen=True):
    """An ``extract_self_disclosure`` pass over ``window`` finished."""

    window: dl.DisclosureWindow


class SelfDisclosure:
    """Path-B state (the persisted cursor in self_disclosure.json) and its scheduling.

    Path A (``extraction``) comes first: the idle rule waits while it has work.
    """

    def __init__(self, ports: LayerPorts, store: FactStore, extraction: FactExtraction) -> None:
        self.ports = ports
        self.s = ports.settings.longterm
        self.store = store
        self.extraction = extraction
        self.cursor = dl.DisclosureCursor()
        self.wanted = False  # enough path-A passes, or a backlog, since the last pass
        self.inflight: int | None = None
        self.gate = task_gate(self.s)
        self.passes_since = 0
        self.loaded_at: datetime = ports.now()

    def load(self) -> None:
        """Read the persisted path-B cursor (a corrupt file is moved aside and read as
        empty: the next pass starts with the cold-start lookback); the pass state starts
        afresh. Raises OSError."""
        raw, _status = read_json(self.ports.paths.self_disclosure, type=dl.DisclosureCursor, default=None)
        self.cursor = raw if isinstance(raw, dl.DisclosureCursor) else dl.DisclosureCursor()
        self.wanted = False
        self.inflight = None
        self.gate = task_gate(self.s)
        self.passes_since = 0
        self.loaded_at = self.ports.now()

    def _save(self, cursor: dl.DisclosureCursor) -> None:
        if cursor != self.cursor:
            atomic_write_json(self.ports.paths.self_disclosure, msgspec.to_builtins(cursor))
            self.cursor = cursor

    def path_a_done(self, turns: list[Turn], batch: bool) -> None:
        """Path A extracted ``turns`` (in a batch when ``batch``): the newest processed
        turn moves, and after enough batches a pass becomes due. Raises OSError."""
        stamps: list[str] = []
        for turn in turns:
            try:
                stamps.append(to_utc_iso(turn.ts))
            except ValueError:
                continue
        self._save(dl.note_path_a(self.cursor, stamps))
        if batch:
            self.passes_since += 1
            if fl.self_disclosure_due(self.passes_since, self.s):
                self.passes_since = 0
                self.wanted = True
        self.maybe_disclose()

    def _idle_due_at(self) -> datetime | None:
        """When the idle rule makes a pass due (None: no uncovered turn, or path A still
        has work, which comes first)."""
        queue = self.extraction.queue
        if not dl.lagging(self.cursor) or self.extraction.inflight is not None or queue.user_turns > 0:
            return None
        since = queue.last_activity_at or self.loaded_at
        return since + timedelta(seconds=self.s.fact_self_disclosure_idle_seconds)

    def wait(self, now: datetime, monotonic: float) -> float | None:
        """Monotonic time when the next pass may run, or None when none is due."""
        if self.inflight is not None or not self.ports.powerful() or not self.ports.model_available("extract_self_disclosure"):
            return None
        gate = max(monotonic, self.gate.not_before)
        if self.wanted and dl.lagging(self.cursor):
            return gate
        idle = self._idle_due_at()
        return None if idle is None else max(gate, monotonic + (idle - now).total_seconds())

    def maybe_disclose(self) -> None:
        """Start a pass when one is due and its gate is open. Raises OSError."""
        mono = self.ports.clock.monotonic()
        wait = self.wait(self.ports.now(), mono)
        if wait is None or wait > mono or self.gate.blocked(mono):
            return
        window = self._read_window()
        if window is None:
            # Nothing readable up to the newest processed turn (e.g. unreadable rows): the
            # cursor catches up, so the pass is not due again until new turns arrive.
            self.wanted = False
            cursor = self.cursor
            if cursor.seen_until is not None and dl.lagging(cursor):
                self._save(msgspec.structs.replace(cursor, checked_ts=cursor.seen_until, checked_row=-1))
            return
        if not window.turns:  # nothing a self-disclosure can come from: moved over
            self._save(dl.after_pass(self.cursor, window, self.ports.now_iso()))
            self.wanted = window.more
            self.maybe_disclose()
            return
        since = parse_timestamp(self.cursor.last_pass_at) if self.cursor.last_pass_at else None
        known = fl.known_pool(self.store.facts.values(), since, self.ports.now(), self.s)
        messages = prompts.extract_self_disclosure_messages(window.turns, known, now=self.ports.now(), **self.ports.names())
        token = self.ports.ask_model(
            "extract_self_disclosure",
            messages,
            lambda token, output, error: DisclosureDone(token=token, output=output, error=error, window=window),
            timeout=self.s.longterm_extract_timeout_seconds,
        )
        if token is None:  # pool full: still wanted, the timer tries again after the retry floor
            self.wanted = True
            return
        self.inflight = token
        self.gate.start()

    def _read_window(self) -> dl.DisclosureWindow | None:
        cursor = self.cursor
        if not dl.lagging(cursor) or cursor.seen_until is None:
            return None
        path = self.ports.paths.time_index_db
        if not path.exists():
            return None
        start, after_row = dl.window_start(cursor, self.s)
        limit = self.s.fact_self_disclosure_max_window_messages
        with TimeIndexReader.read_only(path) as journal:
            rows = journal.rows_past(start.isoformat(), after_row, cursor.seen_until, limit + 1)
        return dl.plan_window([(r.id, r.turn) for r in rows], limit)

    def done(self, msg: DisclosureDone) -> None:
        """A pass finished: store what it found and move the cursor over its window, or
        back off (giving the window up after too many failures). Raises OSError."""
        self.inflight = None
        window = msg.window
        mono = self.ports.clock.monotonic()
        if msg.error is not None:
            delay = self.gate.failed_at(mono)
            failures = self.cursor.failures + 1
            if failures >= self.s.longterm_liveness_max_attempts:
                self.ports.log.warning("self-disclosure pass failed %d times; its window is given up", failures)
                self._save(dl.after_pass(self.cursor, window, self.ports.now_iso()))
                self.wanted = window.more
            else:
                self._save(msgspec.structs.replace(self.cursor, failures=failures))
                self.wanted = True
                self.ports.log.info("self-disclosure pass failed; retried in %.0f s", delay)
            return
        self.gate.answered_at(mono)
        new: list[Fact] = fl.normalize_extraction(msg.output, now=self.ports.now(), source="ai_disclosure", settings=self.s)
        self.store.add_facts(new)
        self._save(dl.after_pass(self.cursor, window, self.ports.now_iso()))
        # A backlog longer than one window: the next pass continues at once.
        self.wanted = window.more
        self.maybe_disclose()
