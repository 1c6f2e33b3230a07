"""Path B of FactActor: the AI self-disclosure pass over the raw journal.

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

from nekomem.actors.fact_state import FactState
from nekomem.actors.messages import ModelDone
from nekomem.domain import disclosure as dl
from nekomem.domain import facts as fl
from nekomem.domain import prompts_longterm as prompts
from nekomem.domain.gates import task_gate
from nekomem.domain.records import Fact
from nekomem.domain.turns import Turn, parse_timestamp
from nekomem.stores.atomic import atomic_write_json, read_json
from nekomem.stores.timeindex_read import TimeIndexReader, to_utc_iso


class SelfDisclosure(FactState):
    """Path-B state and scheduling on top of the fact state (FactActor is built on it)."""

    def load_views(self) -> None:
        """The fact state, then the persisted path-B cursor (a corrupt file is moved aside
        and read as empty: the next pass starts with the cold-start lookback)."""
        super().load_views()
        raw, _status = read_json(self.ctx.paths.self_disclosure, type=dl.DisclosureCursor, default=None)
        self.disclosure: dl.DisclosureCursor = raw if isinstance(raw, dl.DisclosureCursor) else dl.DisclosureCursor()
        self.disclosure_wanted = False  # enough path-A passes, or a backlog, since the last pass
        self.disclosure_inflight: int | None = None
        self.disclosure_gate = task_gate(self.s)
        self.passes_since_disclosure = 0
        self._disclosure_loaded_at: datetime = self.now()

    def _save_disclosure(self, cursor: dl.DisclosureCursor) -> None:
        if cursor != self.disclosure:
            atomic_write_json(self.ctx.paths.self_disclosure, msgspec.to_builtins(cursor))
            self.disclosure = cursor

    def path_a_done(self, turns: list[Turn], batch: bool) -> None:
        """Path A extracted ``turns`` (in a batch when ``batch``): the newest processed
        turn moves, and after enough batches a pass becomes due."""
        stamps: list[str] = []
        for turn in turns:
            try:
                stamps.append(to_utc_iso(turn.ts))
            except ValueError:
                continue
        self._save_disclosure(dl.note_path_a(self.disclosure, stamps))
        if batch:
            self.passes_since_disclosure += 1
            if fl.self_disclosure_due(self.passes_since_disclosure, self.s):
                self.passes_since_disclosure = 0
                self.disclosure_wanted = True
        self.maybe_disclose()

    def _idle_due_at(self) -> datetime | None:
        """When the idle rule makes a pass due (None: no uncovered turn, or path A still
        has work, which comes first)."""
        if not dl.lagging(self.disclosure) or self.extract_inflight is not None or self.queue.user_turns > 0:
            return None
        since = self.queue.last_activity_at or self._disclosure_loaded_at
        return since + timedelta(seconds=self.s.fact_self_disclosure_idle_seconds)

    def disclosure_wait(self, now: datetime, monotonic: float) -> float | None:
        """Monotonic time when the next pass may run, or None when none is due."""
        if self.disclosure_inflight is not None or not self.powerful() or not self.model_available("extract_self_disclosure"):
            return None
        gate = max(monotonic, self.disclosure_gate.not_before)
        if self.disclosure_wanted and dl.lagging(self.disclosure):
            return gate
        idle = self._idle_due_at()
        return None if idle is None else max(gate, monotonic + (idle - now).total_seconds())

    def maybe_disclose(self) -> None:
        """Start a pass when one is due and its gate is open."""
        mono = self.ctx.clock.monotonic()
        wait = self.disclosure_wait(self.now(), mono)
        if wait is None or wait > mono or self.disclosure_gate.blocked(mono):
            return
        window = self._read_window()
        if window is None:
            # Nothing readable up to the newest processed turn (e.g. unreadable rows): the
            # cursor catches up, so the pass is not due again until new turns arrive.
            self.disclosure_wanted = False
            cursor = self.disclosure
            if cursor.seen_until is not None and dl.lagging(cursor):
                self._save_disclosure(msgspec.structs.replace(cursor, checked_ts=cursor.seen_until, checked_row=-1))
            return
        if not window.turns:  # nothing a self-disclosure can come from: moved over
            self._save_disclosure(dl.after_pass(self.disclosure, window, self.now_iso()))
            self.disclosure_wanted = window.more
            self.maybe_disclose()
            return
        since = parse_timestamp(self.disclosure.last_pass_at) if self.disclosure.last_pass_at else None
        known = fl.known_pool(self.facts.values(), since, self.now(), self.s)
        messages = prompts.extract_self_disclosure_messages(window.turns, known, now=self.now(), **self.names())
        token = self.ask_model(
            "disclosure",
            "extract_self_disclosure",
            messages,
            context={"window": window},
            timeout=self.s.longterm_extract_timeout_seconds,
        )
        if token is None:  # pool full: still wanted, the timer tries again after the retry floor
            self.disclosure_wanted = True
            return
        self.disclosure_inflight = token
        self.disclosure_gate.start()

    def _read_window(self) -> dl.DisclosureWindow | None:
        cursor = self.disclosure
        if not dl.lagging(cursor) or cursor.seen_until is None:
            return None
        path = self.ctx.paths.time_index_db
        if not path.exists():
            return None
        start, after_row = dl.window_start(cursor, self.s)
        limit = self.s.fact_self_disclosure_max_window_messages
        with TimeIndexReader.read_only(path) as journal:
            rows = journal.rows_past(start.isoformat(), after_row, cursor.seen_until, limit + 1)
        return dl.plan_window([(r.id, r.turn) for r in rows], limit)

    def done_disclosure(self, msg: ModelDone) -> None:
        self.disclosure_inflight = None
        window: dl.DisclosureWindow = msg.context["window"]
        mono = self.ctx.clock.monotonic()
        if msg.error is not None:
            delay = self.disclosure_gate.failed_at(mono)
            failures = self.disclosure.failures + 1
            if failures >= self.s.longterm_liveness_max_attempts:
                self.log.warning("self-disclosure pass failed %d times; its window is given up", failures)
                self._save_disclosure(dl.after_pass(self.disclosure, window, self.now_iso()))
                self.disclosure_wanted = window.more
            else:
                self._save_disclosure(msgspec.structs.replace(self.disclosure, failures=failures))
                self.disclosure_wanted = True
                self.log.info("self-disclosure pass failed; retried in %.0f s", delay)
            return
        self.disclosure_gate.answered_at(mono)
        new: list[Fact] = fl.normalize_extraction(msg.output, now=self.now(), source="ai_disclosure", settings=self.s)
        self.add_facts(new)
        self._save_disclosure(dl.after_pass(self.disclosure, window, self.now_iso()))
        # A backlog longer than one window: the next pass continues at once.
        self.disclosure_wanted = window.more
        self.maybe_disclose()
