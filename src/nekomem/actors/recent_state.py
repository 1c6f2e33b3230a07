"""The state half of RecentActor: the window (recent.json), recent_meta.json and the
time index in memory, the crash catch-up at load, the post-turn cursor and the adoption
of outside edits of recent.json.

recent.json is written without fsync on appends; the time index is the durable copy (its
rows and the window base, stored with every other change of the window), so at load the
window is rebuilt as base + rows (see :mod:`nekomem.domain.window_rebuild`) and the rows
after the post-turn cursor get their outbox record again (see :mod:`nekomem.domain.post_turn`).

``window`` and ``tokens`` are only ever extended in place; any other change assigns a new
list. The encoded window and the token bound rely on it: while the list is the same
object, its known prefix is unchanged, so a write costs the new items only.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import msgspec

from nekomem.actors.base import ChildActor
from nekomem.actors.messages import Enqueue, OutboxAck
from nekomem.actors.recent_backlog import FactBacklog
from nekomem.domain import context, recent_window, review, theater, window_rebuild
from nekomem.domain.post_turn import POST_TURN_CURSOR, PostTurnCursor, session_runs
from nekomem.domain.tokens import get_counter
from nekomem.domain.turns import Turn, from_disk
from nekomem.domain.window_cache import ItemCache
from nekomem.runtime.clock import iso
from nekomem.stores import timeindex_check
from nekomem.stores.atomic import atomic_write_bytes, atomic_write_json, drop_swap, keep_rejected, read_json, swap_write_bytes
from nekomem.stores.fact_backlog import BACKLOG_ROWS_KEY
from nekomem.stores.recent_watch import RecentWatch, journal_adoption
from nekomem.stores.timeindex import IMPORTED_CURSOR, TimeIndex

_item_encoder = msgspec.json.Encoder()


def _encode_item(turn: Turn) -> bytes:
    return _item_encoder.encode(turn.to_disk())


OP_POST_TURN = "extract_facts"  # wire value of the reference's OP_POST_TURN_SIGNALS


class RecentMeta(msgspec.Struct, kw_only=True):
    last_past_block_update_at: str | None = None
    compress_failures: int = 0
    last_compress_error: str | None = None
    last_compress_at: str | None = None
    compressions: int = 0
    hard_cap_trims: int = 0
    journal_row: int | None = None  # the last time-index row folded into recent.json
    review: review.ReviewState = msgspec.field(default_factory=review.ReviewState)


class RecentState(ChildActor):
    """The window, its meta and the time index; the post-turn cursor."""

    def load(self) -> None:
        # Per-item work kept across writes (see the module docstring).
        self._encoded: ItemCache[bytes] = ItemCache(_encode_item)
        self._encoded_body = b""
        self._shown: ItemCache[str] = ItemCache(context.shown_text)
        self._bound_known: tuple[list[int], int, int] | None = None
        paths = self.ctx.paths
        self.settings = self.ctx.settings.recent
        self.counter = get_counter(self.settings.recent_tokenizer_encoding)
        window, status, unreadable = self._read_window(paths.recent)
        meta_raw, _ = read_json(paths.recent_meta, default={})
        try:
            self.meta = msgspec.convert(meta_raw if isinstance(meta_raw, dict) else {}, RecentMeta, strict=False)
        except msgspec.ValidationError:
            self.meta = RecentMeta()
        self.tindex = TimeIndex(paths.time_index_db)
        self._check_journal()
        self.watch = RecentWatch(paths.recent)
        found = window if status == "ok" else None  # missing, empty or torn: None
        self.window, rewrite = self._rebuild_window(found)
        self.tindex.shrink_memory()
        self.tokens = [self.counter.count(t.text) for t in self.window]
        self.meta.journal_row = self.tindex.max_row_id()
        if rewrite or unreadable:
            self._enforce_cap()
            self._save_window()  # durable, and the new base (unreadable items are kept aside)
            self._save_meta()
        self.backlog = FactBacklog(self.tindex, self.ctx.settings.longterm, self.ctx.services.backlog, self.ctx.name)
        self._replay_post_turn()
        self.feed_backlog()

    def flush(self) -> None:
        """Persist the post-turn cursor and recent_meta.json (with journal_row)."""
        self._save_cursor()
        self._save_meta()

    @staticmethod
    def _read_window(path: Path) -> tuple[list[Turn], str, int]:
        """(turns, read status, how many items were unreadable). Unreadable items are kept
        aside by keep_rejected; the caller rewrites the window without them."""
        raw, status = read_json(path, default=[])
        if status != "ok":
            return [], status, 0
        items = raw if isinstance(raw, list) else []
        unreadable: list[Any] = [] if isinstance(raw, list) else [raw]
        window: list[Turn] = []
        for item in items:
            turn = from_disk(item)
            if turn is None:
                unreadable.append(item)
            else:
                window.append(turn)
        if unreadable:
            keep_rejected(path, unreadable, "window items")
        return window, status, len(unreadable)

    def close(self) -> None:
        if getattr(self, "tindex", None) is not None:
            self._save_cursor()
            self.tindex.close()

    # -- crash catch-up --------------------------------------------------------------
    def _check_journal(self) -> None:
        """A damaged time_indexed.db is kept aside and its readable rows go into a new one
        (see :mod:`nekomem.stores.timeindex_check`); the damage is reported to /health.
        The window base was in the damaged file: the window is then rebuilt as for a folder
        without one (recent.json as it is, or the salvaged rows when it is unreadable)."""
        found = timeindex_check.check_journal(self.ctx.paths.time_index_db, self.meta.journal_row or 0)
        if found is None:
            return
        damage, rows = found
        top = max((r[0] for r in rows), default=0)
        # Salvaged rows had their post-turn work done or recorded before the damage.
        self.tindex.restore_rows(rows, cursors={POST_TURN_CURSOR: top})
        self.meta.journal_row = min(self.meta.journal_row or 0, top)
        storage = self.ctx.services.storage
        if storage is not None:
            storage.damaged(self.ctx.name, damage.describe())

    def _rebuild_window(self, found: list[Turn] | None) -> tuple[list[Turn], bool]:
        """The window at load (see :mod:`nekomem.domain.window_rebuild`) from the window
        base, the rows after it and recent.json's items (``found``; None when it was
        missing or unreadable), and whether recent.json must be rewritten (with a new base).

        Rows of an import are history (the import wrote the window it wanted): only rows
        after the ``imported`` cursor are folded in.
        """
        imported = self.tindex.cursor(IMPORTED_CURSOR) or 0
        stored = self.tindex.window_base()
        if stored is None:
            if not found and self.tindex.max_row_id() == 0:
                # A new character: its base is the empty window at row 0. No recent.json
                # can be older than that, so none needs to be made durable first.
                self.tindex.set_window_base(b"[]\n")
                return [], False
            return self._legacy_window(found, imported), True
        base_row, base_bytes = stored
        cover = max(base_row, imported)
        if found is not None:
            # The common cases, without reading every row since the base (with no model to
            # compress, that is the whole journal): recent.json is the base itself, or it
            # ends with the newest rows (it is the state after the last append).
            top = self.tindex.max_row_id()
            if top <= cover:
                if self._encoded_equal(found, base_bytes):
                    return found, False
            elif self._is_capped_current(found, top - cover):
                return found, False
        # Theater rows are a mirror of the window's capsules, not turns to fold back.
        rows = [row.turn for row in self.tindex.rows_after(cover) if not theater.is_theater(row.turn)]
        base = [t for t in (from_disk(item) for item in msgspec.json.decode(base_bytes)) if t is not None]
        result = window_rebuild.rebuild(base, rows, found)
        if result.how == "current":
            return result.window, False
        if result.how == "adopted":
            self.log.warning("recent.json was edited while the server was stopped; adopted (%d items)", len(result.window))
        else:
            self.log.warning(
                "recent.json was %s; rebuilt from the journal (%d rows folded in)",
                "missing or unreadable" if found is None else "behind the journal",
                result.added,
            )
        return result.window, True

    def _legacy_window(self, found: list[Turn] | None, imported: int) -> list[Turn]:
        """A folder without a window base (from before it existed, an import, or a fresh
        journal): recent.json plus the rows after ``meta.journal_row`` that it does not
        already end with; without a readable recent.json (or with an empty one and no
        ``journal_row``), every row after an import."""
        if found is None or (not found and self.meta.journal_row is None):
            window = [row.turn for row in self.tindex.rows_after(imported) if not theater.is_theater(row.turn)]
            if window:
                self.log.warning(
                    "recent.json was missing or unreadable and no window base was stored; rebuilt from %d journal rows", len(window)
                )
            return window
        top = self.tindex.max_row_id()
        if self.meta.journal_row is None or self.meta.journal_row > top:
            return found  # a folder from before the cursor existed
        # Theater rows are a mirror of the window's capsules, not turns to fold back.
        missing = [row.turn for row in self.tindex.rows_after(max(self.meta.journal_row, imported)) if not theater.is_theater(row.turn)]
        skip = recent_window.repeated_prefix(found, missing)
        if len(missing) > skip:
            self.log.info("recent.json caught up with %d stored turns", len(missing) - skip)
        return [*found, *missing[skip:]]

    def _is_capped_current(self, found: list[Turn], since_base: int) -> bool:
        """Whether ``found`` is exactly the window base + rows would give when the hard cap
        has dropped rows since the base (``since_base`` rows were stored after it): its
        items after a leading memo are the newest rows, and the row before them would not
        have fitted. With fewer rows since the base than items, the full rebuild is as
        cheap, and is taken."""
        raw = found[1:] if found and found[0].role == "system" else found
        if not raw or since_base <= len(raw):
            return False
        tail = self.tindex.tail(len(raw) + 1)
        if len(tail) != len(raw) + 1 or any(a.role != b.role or a.text != b.text for a, b in zip(tail[1:], raw, strict=True)):
            return False
        total = sum(self.counter.count(t.text) for t in found) + self.counter.count(tail[0].text)
        return total > self.settings.recent_hard_cap_tokens

    def _encoded_equal(self, found: list[Turn], data: bytes) -> bool:
        """Whether ``found`` encodes to ``data`` (recent.json's bytes as this server writes them)."""
        self.window = found
        return self._window_bytes() == data

    def _replay_post_turn(self) -> None:
        """Enqueue again the post-turn work of rows after the cursor (answered before their
        record was acknowledged); the outbox drops ranges it already holds."""
        saved = self.tindex.cursor(POST_TURN_CURSOR)
        top = self.tindex.max_row_id()
        if saved is None:
            # Before the cursor existed every record was written before the answer.
            self.tindex.set_cursors({POST_TURN_CURSOR: top})
            saved = top
        self.post_turn = PostTurnCursor(saved)
        if top <= saved:
            return
        rows = [row for row in self.tindex.rows_after(saved) if not theater.is_theater(row.turn)]  # no post-turn work
        for run in session_runs(rows):
            self._enqueue_post_turn([r.turn for r in run], run[0].session_id or "", run[0].id, run[-1].id, replay=True)
        self.log.info("re-enqueued post-turn work of %d stored turns", len(rows))

    def _enqueue_post_turn(
        self, turns: list[Turn], session_id: str, first: int, last: int, write_id: int = 0, *, replay: bool = False
    ) -> None:
        ack = OutboxAck(write_id=write_id, row=last)
        self.post_turn.sent(last)
        if not self.model_available("extract_facts"):
            # No model can extract facts: the record would only announce the turns and be
            # finished unrun (FactActor.on_RunOp), so the turns are announced here, with no
            # record, and count as done (a write that waits hears it as from the outbox).
            # They stay in the fact backlog, mined once such a model is configured.
            self.announce_stored_turns(list(turns))
            self.backlog.extend(first, last)
            if write_id:
                self.ctx.send("recent", ack)
            else:
                self.post_turn.acked(last)
            return
        payload = {"messages": [t.to_disk() for t in turns], "session_id": session_id, "rows": [first, last]}
        self.ctx.send("outbox", Enqueue(op_type=OP_POST_TURN, payload=payload, reply_value=ack, replay=replay, turns=list(turns)))

    def feed_backlog(self) -> None:
        """Hand the fact backlog's next batch to the fact actor, as a post-turn record
        marked ``backlog`` (see :mod:`nekomem.actors.recent_backlog`), when a model can
        extract facts and no batch is being mined."""
        if not self.model_available("extract_facts"):
            return
        batch = self.backlog.next_batch()
        if batch is None:
            return
        # "backlog_rows", not "rows": the outbox's replay check takes every row under its
        # floor as recorded, and these rows are older than that.
        payload = {
            "messages": [t.to_disk() for t in batch.turns],
            "session_id": batch.session_id,
            BACKLOG_ROWS_KEY: [batch.first, batch.last],
        }
        self.log.info("fact backlog: rows %d..%d handed to extraction", batch.first, batch.last)
        self.ctx.send("outbox", Enqueue(op_type=OP_POST_TURN, payload=payload, turns=list(batch.turns)))

    def cursor_updates(self) -> dict[str, int] | None:
        """The post-turn and fact-backlog cursors that moved since they were last stored
        (stored with the next time-index transaction), or None."""
        update = {**(self.post_turn.update() or {}), **self.backlog.update()}
        return update or None

    def _save_cursor(self) -> None:
        update = self.cursor_updates() if hasattr(self, "post_turn") else None
        if update:
            self.tindex.set_cursors(update)

    def _overlap_with_stored_tail(self, turns: list[Turn]) -> int:
        """How many leading turns of a settle batch repeat the stored tail (role + text)."""
        return recent_window.repeated_prefix(self.tindex.tail(len(turns)), turns)

    def _append_token_counts(self, turns: list[Turn]) -> None:
        """Extend ``self.tokens`` for turns appended to the window. With an exact
        (byte-level BPE) counter a new turn first gets ``-len(utf-8 bytes)``: a token
        covers at least one byte, so the length bounds the count, and the exact count is
        taken only when the bounds no longer fit under the hard cap (see _enforce_cap)."""
        if self.counter.exact:
            self.tokens.extend(-len(t.text.encode("utf-8")) for t in turns)
        else:
            self.tokens.extend(self.counter.count(t.text) for t in turns)

    def _token_bound(self) -> int:
        """``sum(map(abs, self.tokens))``, adding only the counts appended since the last
        call while ``tokens`` is the same list (it is only ever extended in place)."""
        tokens = self.tokens
        known = self._bound_known
        if known is not None and known[0] is tokens and len(tokens) >= known[1]:
            total = known[2] + sum(map(abs, itertools.islice(tokens, known[1], None)))
        else:
            total = sum(map(abs, tokens))
        self._bound_known = (tokens, len(tokens), total)
        return total

    def _enforce_cap(self) -> bool:
        """Bound the window by the hard cap; True when that cut a text (not only dropped
        the oldest items): the window is then no longer base + rows, and the caller must
        write it durably (a new base)."""
        cap = self.settings.recent_hard_cap_tokens
        if self._token_bound() <= cap:
            return False  # exact counts, or upper bounds of them, fit
        if any(n < 0 for n in self.tokens):
            self.tokens = [n if n >= 0 else self.counter.count(t.text) for n, t in zip(self.tokens, self.window, strict=True)]
            if sum(self.tokens) <= cap:
                return False
        before = self.window
        self.window = recent_window.enforce_hard_cap(self.window, self.settings, self.counter)
        self.tokens = [self.counter.count(t.text) for t in self.window]
        self.meta.hard_cap_trims += 1
        self.log.info("hard cap trimmed the window to %d items", len(self.window))
        return not window_rebuild.only_dropped(before, self.window)

    def _save_window(self, *, durable: bool = True, looked: bool = False) -> None:
        """Replace recent.json with the window (an outside edit since the last look is
        journaled first; ``looked``: the caller looked, with adopt_outside_edit, just before
        building this window, in the same message)."""
        if not looked:
            self.adopt_outside_edit("write", keep_ours=True)
        if durable:
            # Edits, deletions, compression: no older window may stay in the swap file. The
            # file is durable before it becomes the window base (see set_window_base).
            # The swap file goes first, so the folder fsync of the write makes its removal
            # durable too (after a deletion no older window may come back with a power loss).
            data = self._window_bytes()
            drop_swap(self.ctx.paths.recent)
            written = atomic_write_bytes(self.ctx.paths.recent, data)
            self.tindex.set_window_base(data)
        else:
            written = swap_write_bytes(self.ctx.paths.recent, self._window_bytes())
        self.watch.remember(written)

    def _window_bytes(self) -> bytes:
        """recent.json's content: the same bytes as encoding ``[t.to_disk() ...]`` whole,
        but each item is encoded once while it stays in the window, and a write that only
        appended joins the new items to the join it kept."""
        parts, start = self._encoded.update(self.window)
        body = self._encoded_body
        if start == 0:
            body = b",".join(parts)
        elif start < len(parts):
            body = body + b"," + b",".join(parts[start:])
        self._encoded_body = body
        return b"[" + body + b"]\n"

    def shown_texts(self) -> list[str]:
        """Each window item's text as a context shows it (:func:`context.shown_text`), in
        order; a copy, safe to hand to another thread."""
        return list(self._shown.update(self.window)[0])

    def adopt_outside_edit(self, reason: str, *, keep_ours: bool = False) -> bool:
        """If recent.json was changed by someone else, adopt it as the window (or, with
        ``keep_ours``, only journal it before it is overwritten); True when it was changed."""
        if not self.watch.changed():
            return False
        raw, status = read_json(self.ctx.paths.recent, default=[])
        items = raw if status == "ok" and isinstance(raw, list) else []
        ours = [t.to_disk() for t in self.window]
        if keep_ours or status != "ok" or not isinstance(raw, list):
            journal_adoption(self.ctx.paths.folder, iso(self.ctx.clock.now()), items, ours, reason + ":kept")
            self.watch.remember()
            return True
        journal_adoption(self.ctx.paths.folder, iso(self.ctx.clock.now()), ours, items, reason)
        self.window = [t for t in (from_disk(item) for item in items) if t is not None]
        self.tokens = [self.counter.count(t.text) for t in self.window]
        self.watch.remember()
        self._save_window(looked=True)  # durably, as the new window base
        self.log.info("adopted an outside edit of recent.json (%d items)", len(self.window))
        return True

    def _save_meta(self, *, durable: bool = True) -> None:
        atomic_write_json(self.ctx.paths.recent_meta, self.meta, durable=durable)
