"""The recent window's theater: capsule upsert, story forget, archive retract.

A theater capsule lives in the recent window (recent.json) with its metadata, as in the
reference; the journal (time_indexed.db) mirrors the window's capsules as one event per
story, rebuilt from the window on every change (:meth:`TimeIndex.reconcile_theater`), so
after a forget or retract the capsule is gone from both. ``removed_time_index`` counts the
theater rows the rebuild deleted (the other stories' rows are deleted and stored again),
as the reference counts them. Capsules never enter post-turn
work (no facts, reflections or evidence come from them). The rules of the upsert are in
:mod:`nekomem.domain.theater`; the late-write tombstones in
:mod:`nekomem.stores.theater_marks`.
"""

from __future__ import annotations

from collections.abc import Sequence

from nekomem.actors.messages import TheaterForget, TheaterRetract, TheaterWrite
from nekomem.actors.ports import LayerPorts
from nekomem.domain import theater
from nekomem.domain.turns import Turn
from nekomem.layers.recent.state import RecentStore, answer
from nekomem.stores.theater_marks import TheaterMarks
from nekomem.wire.answers import TheaterForgetAnswer, TheaterRetractAnswer, WriteAnswer


class RecentTheater:
    """The theater messages of one character's recent window, applied to its store."""

    def __init__(self, ports: LayerPorts, store: RecentStore) -> None:
        self.ports = ports
        self.log = ports.log
        self.store = store

    def _marks(self) -> TheaterMarks:
        s = self.store.settings
        return TheaterMarks(self.ports.paths.folder, ttl_seconds=s.theater_tombstone_ttl_seconds, max_entries=s.theater_tombstones_max)

    def _reindex_theater(self, window: Sequence[Turn]) -> tuple[int, int]:
        """Rebuild the journal's theater rows from ``window``; (rows removed, rows stored)."""
        events = [
            (session_id, [(turn, theater.stored_performed_at(turn)) for turn in turns])
            for session_id, turns in theater.journal_events(self.ports.character, window)
        ]
        return self.store.tindex.reconcile_theater(events, theater.THEATER_SOURCE)

    def _commit_theater(self, window: list[Turn]) -> tuple[int, int]:
        """Journal first, then the window: a failed window write leaves the journal a
        rebuild of what is about to be the window (the next change reconciles it again)."""
        store = self.store
        counts = self._reindex_theater(window)
        store.window = window
        store.tokens = [store.counter.count(t.text) for t in store.window]
        store.enforce_cap()
        store.save_window()
        # The old window base (time_indexed.db) held the capsules as they were: it goes with
        # the WAL's old pages.
        store.tindex.scrub_wal()
        # The rebuilt rows are not turns to fold back into the window at load.
        store.meta.journal_row = store.tindex.max_row_id()
        store.save_meta()
        return counts

    def write(self, msg: TheaterWrite) -> None:
        """Upsert the capsule ``msg`` carries (unless the player declined or forgot its
        story meanwhile); answers ``{"status", "count"}``."""
        store = self.store
        store.adopt_outside_edit("write")
        story_id = theater.episode_key(msg.turn)[0]
        now = self.ports.clock.now().timestamp()
        if self._marks().write_refused(story_id, msg.archive_request_id, msg.archive_attempt, msg.forget_marker, now):
            self.log.info("dropped a theater archive write the player had declined or forgotten")
            answer(msg.reply, WriteAnswer(status="retracted", count=0))
            return
        s = store.settings
        window, stored, _kept = theater.merge_capsule(
            store.window, msg.turn, per_story=s.theater_episodes_per_story, total=s.theater_episodes_total
        )
        if window != store.window:
            self._commit_theater(window)
        self.log.info("theater capsule stored (%d capsules in the window)", sum(1 for t in window if theater.is_capsule(t)))
        answer(msg.reply, WriteAnswer(status="cached", count=1))

    def forget(self, msg: TheaterForget) -> None:
        """Drop a story's capsules from the window and the journal, leaving a tombstone;
        answers with the counts and the forget marker."""
        store = self.store
        store.adopt_outside_edit("write")
        # The tombstone first: a late archive of this story is dropped even when the rest
        # of this forget fails and is retried.
        marker = self._marks().record_forget(msg.story_id, self.ports.clock.now().timestamp())
        window = theater.without_story(store.window, msg.story_id)
        removed_recent = len(store.window) - len(window)
        removed_rows, _stored = self._commit_theater(window)
        answer(
            msg.reply, TheaterForgetAnswer(ok=True, removed_recent=removed_recent, removed_time_index=removed_rows, forget_marker=marker)
        )

    def retract(self, msg: TheaterRetract) -> None:
        """Undo an archive of a story's session up to a revision (recording the retraction
        when it names its archive request); answers with the counts."""
        store = self.store
        store.adopt_outside_edit("write")
        if msg.archive_request_id:
            self._marks().record_retraction(
                story_id=msg.story_id,
                session_id=msg.session_id,
                through_revision=msg.through_revision,
                request_id=msg.archive_request_id,
                attempt=msg.archive_attempt,
                now=self.ports.clock.now().timestamp(),
            )
        if not any(theater.matches_retraction(t, msg.story_id, msg.session_id, msg.through_revision) for t in store.window):
            answer(msg.reply, TheaterRetractAnswer(ok=True, removed_recent=0, removed_time_index=0))
            return
        window = theater.restore_retracted(store.window, msg.story_id, msg.session_id, msg.through_revision)
        removed_recent = sum(1 for t in store.window if theater.matches_retraction(t, msg.story_id, msg.session_id, msg.through_revision))
        removed_rows, _stored = self._commit_theater(window)
        answer(msg.reply, TheaterRetractAnswer(ok=True, removed_recent=removed_recent, removed_time_index=removed_rows))
