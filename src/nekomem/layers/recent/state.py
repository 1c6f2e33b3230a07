"""The recent window's store: the window (recent.json), recent_meta.json and the time
index in memory, the crash catch-up at load and the adoption of outside edits of
recent.json.

recent.json is written without fsync on appends; the time index is the durable copy (its
rows and the window base, stored with every other change of the window), so at load the
window is rebuilt as base + rows (see :mod:`nekomem.domain.window_rebuild`). The rows
after the post-turn cursor get their outbox record again from
:mod:`nekomem.layers.recent.post_turn`.

``window`` and ``tokens`` are only ever extended in place; any other change assigns a new
list. The encoded window and the token bound rely on it: while the list is the same
object, its known prefix is unchanged, so a write costs the new items only.
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path

import msgspec

from nekomem.actors.ports import LayerPorts
from nekomem.config.recent import RecentSettings
from nekomem.domain import context, recent_window, review, theater, window_rebuild
from nekomem.domain.post_turn import POST_TURN_CURSOR
from nekomem.domain.tokens import TokenCounter, get_counter
from nekomem.domain.turns import Turn, from_disk
from nekomem.domain.window_cache import ItemCache
from nekomem.runtime.clock import iso
from nekomem.runtime.reply import Reply
from nekomem.stores import timeindex_check
from nekomem.stores.atomic import atomic_write_bytes, drop_swap, encode_json, keep_rejected, read_json, swap_write_bytes
from nekomem.stores.recent_watch import RecentWatch, journal_adoption
from nekomem.stores.timeindex import IMPORTED_CURSOR, TimeIndex
from nekomem.stores.window_sources import WindowSources, item_key

_item_encoder = msgspec.json.Encoder()


def _encode_item(turn: Turn) -> bytes:
    return _item_encoder.encode(turn.to_disk())


def _stamp(path: Path) -> tuple[int, int, int] | None:
    """(inode, size, mtime in ns) of ``path``, None when it cannot be stat-ed."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def answer(reply: Reply | None, value: object) -> None:
    """Complete ``reply`` with ``value`` (a message sent without one waits for nothing)."""
    if reply is not None:
        reply.ok(value)


class RecentMeta(msgspec.Struct, kw_only=True):
    last_past_block_update_at: str | None = None
    compress_failures: int = 0
    last_compress_error: str | None = None
    last_compress_at: str | None = None
    compressions: int = 0
    hard_cap_trims: int = 0
    journal_row: int | None = None  # the last time-index row folded into recent.json
    # timeindex_check.journal_identity of time_indexed.db after its last full check that
    # found nothing: while it holds, an activation leaves SQLite's quick_check out.
    journal_checked: str | None = None
    review: review.ReviewState = msgspec.field(default_factory=review.ReviewState)


class RecentStore:
    """The window, its meta and the time index of one character (see the module).

    Built empty with the layer; :meth:`load` reads the files (again after each storage
    fault), and every other call needs a loaded store.
    """

    def __init__(self, ports: LayerPorts) -> None:
        self.ports = ports
        self.log = ports.log
        self.settings: RecentSettings = ports.settings.recent
        self.window: list[Turn] = []
        self.tokens: list[int] = []
        self.meta = RecentMeta()
        # Set by load (the counter may read a vocabulary, the watch stats recent.json).
        self.counter: TokenCounter
        self.watch: RecentWatch
        self._tindex: TimeIndex | None = None
        # The rows each edited window item came from (a forget matches edited items by them).
        self.sources = WindowSources(ports.paths.folder)
        self._encoded: ItemCache[bytes] = ItemCache(_encode_item)
        self._encoded_body = b""
        self._shown: ItemCache[str] = ItemCache(context.shown_text)
        self._bound_known: tuple[list[int], int, int] | None = None
        # recent_meta.json as this store last wrote it durably (bytes, stamp): see save_meta.
        self._meta_saved: tuple[bytes, tuple[int, int, int] | None] | None = None

    @property
    def tindex(self) -> TimeIndex:
        """The open time index. Raises RuntimeError before :meth:`load` (or after :meth:`close`)."""
        if self._tindex is None:
            raise RuntimeError("the recent window's time index is not open")
        return self._tindex

    @property
    def is_open(self) -> bool:
        """Whether a load opened the time index (and it is not closed yet)."""
        return self._tindex is not None

    def load(self) -> None:
        """Read recent.json, recent_meta.json and time_indexed.db, repair the journal and
        rebuild the window when a crash left them apart. Raises OSError (and the stores'
        decode errors) when the files cannot be read."""
        # Per-item work kept across writes (see the module docstring).
        self._encoded = ItemCache(_encode_item)
        self._encoded_body = b""
        self._shown = ItemCache(context.shown_text)
        self._bound_known = None
        self._meta_saved = None
        paths = self.ports.paths
        self.settings = self.ports.settings.recent
        self.counter = get_counter(self.settings.recent_tokenizer_encoding)
        self.sources.load()
        window, status, unreadable = self._read_window(paths.recent)
        meta_raw, _ = read_json(paths.recent_meta, default={})
        try:
            self.meta = msgspec.convert(meta_raw if isinstance(meta_raw, dict) else {}, RecentMeta, strict=False)
        except msgspec.ValidationError:
            self.meta = RecentMeta()
        self._tindex = TimeIndex(paths.time_index_db)
        with ExitStack() as held:
            checked = self._check_journal(held)
            # The writer opens while the check's connection holds the WAL index it built.
            self.tindex.max_row_id()
        self.watch = RecentWatch(paths.recent)
        found = window if status == "ok" else None  # missing, empty or torn: None
        self.window, rewrite = self._rebuild_window(found)
        self.tindex.shrink_memory()
        self.tokens = [self.counter.count(t.text) for t in self.window]
        self.meta.journal_row = self.tindex.max_row_id()
        noted = checked and self._note_checked()  # the file exists now
        if rewrite or unreadable:
            self.enforce_cap()
            self.save_window()  # durable, and the new base (unreadable items are kept aside)
            self.save_meta()
        elif noted:
            self.save_meta()  # before a crash can make the check's identity matter

    @staticmethod
    def _read_window(path: Path) -> tuple[list[Turn], str, int]:
        """(turns, read status, how many items were unreadable). Unreadable items are kept
        aside by keep_rejected; the caller rewrites the window without them."""
        raw, status = read_json(path, default=[])
        if status != "ok":
            return [], status, 0
        items: list[object] = raw if isinstance(raw, list) else []
        unreadable: list[object] = [] if isinstance(raw, list) else [raw]
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
        """Close the time index (nothing to do when it is not open)."""
        if self._tindex is not None:
            self._tindex.close()
            self._tindex = None

    # -- crash catch-up --------------------------------------------------------------
    def _check_journal(self, hold: ExitStack) -> bool:
        """A damaged time_indexed.db is kept aside and its readable rows go into a new one
        (see :mod:`nekomem.stores.timeindex_check`); the damage is reported to /health.
        The window base was in the damaged file: the window is then rebuilt as for a folder
        without one (recent.json as it is, or the salvaged rows when it is unreadable).

        SQLite's full check is left out when ``meta.journal_checked`` still names the file
        (checked before, no reboot, not replaced) and this is the layer's first load of the
        activation: a reload after a crash (maybe SQLite reading a damaged page) or a
        storage fault checks in full. Whether the journal is known sound now (a full check
        found nothing, or this writer makes the file: there was none, or it replaces a
        damaged one): its identity is then worth storing (:meth:`_note_checked`)."""
        path = self.ports.paths.time_index_db
        identity = timeindex_check.journal_identity(path)
        first = self.ports.first_load()
        full = not (first and identity is not None and identity == self.meta.journal_checked)
        found = timeindex_check.check_journal(path, self.meta.journal_row or 0, full=full, hold=hold)
        if found is None:
            return full
        damage, rows = found
        top = max((r[0] for r in rows), default=0)
        # Salvaged rows had their post-turn work done or recorded before the damage.
        self.tindex.restore_rows(rows, cursors={POST_TURN_CURSOR: top})
        self.meta.journal_row = min(self.meta.journal_row or 0, top)
        storage = self.ports.storage
        if storage is not None:
            storage.damaged(self.ports.character, damage.describe())
        return True

    def _note_checked(self) -> bool:
        """Store the open journal's identity in ``meta.journal_checked`` (after
        :meth:`_check_journal` found it sound); whether it changed (recent_meta.json is
        then to be saved)."""
        identity = timeindex_check.journal_identity(self.ports.paths.time_index_db)
        if identity is None or identity == self.meta.journal_checked:
            return False
        self.meta.journal_checked = identity
        return True

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

    def overlap_with_stored_tail(self, turns: list[Turn]) -> int:
        """How many leading turns of a settle batch repeat the stored tail (role + text)."""
        return recent_window.repeated_prefix(self.tindex.tail(len(turns)), turns)

    def append_token_counts(self, turns: list[Turn]) -> None:
        """Extend ``self.tokens`` for turns appended to the window. With an exact
        (byte-level BPE) counter a new turn first gets ``-len(utf-8 bytes)``: a token
        covers at least one byte, so the length bounds the count, and the exact count is
        taken only when the bounds no longer fit under the hard cap (see enforce_cap)."""
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
            # A slice, not islice: islice walks the known prefix to reach the new counts.
            total = known[2] + sum(map(abs, tokens[known[1] :]))
        else:
            total = sum(map(abs, tokens))
        self._bound_known = (tokens, len(tokens), total)
        return total

    def enforce_cap(self) -> bool:
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
        if window_rebuild.only_dropped(before, self.window):
            return False
        self._map_cut_items(before)
        return True

    def _map_cut_items(self, before: list[Turn]) -> None:
        """An item the hard cap cut (head and tail kept) no longer matches its row by
        text: it is mapped to that row (see :mod:`nekomem.stores.window_sources`)."""
        known = {item_key(t) for t in before}
        by_slot = {(t.role, t.ts): t for t in before}
        changed = False
        for item in self.window:
            old = by_slot.get((item.role, item.ts))
            if item_key(item) in known or old is None:
                continue
            rows = self.sources.rows_of(old) or self.tindex.row_ids_of(old)
            if rows:
                self.sources.edited(old, item, rows)
                changed = True
        if changed:
            self.sources.keep_only(self.window)
            self.sources.save()

    def save_window(self, *, durable: bool = True, looked: bool = False) -> None:
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
            drop_swap(self.ports.paths.recent)
            written = atomic_write_bytes(self.ports.paths.recent, data)
            self.tindex.set_window_base(data)
        else:
            written = swap_write_bytes(self.ports.paths.recent, self._window_bytes())
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
        raw, status = read_json(self.ports.paths.recent, default=[])
        items = raw if status == "ok" and isinstance(raw, list) else []
        ours = [t.to_disk() for t in self.window]
        if keep_ours or status != "ok" or not isinstance(raw, list):
            journal_adoption(self.ports.paths.folder, iso(self.ports.clock.now()), items, ours, reason + ":kept")
            self.watch.remember()
            return True
        journal_adoption(self.ports.paths.folder, iso(self.ports.clock.now()), ours, items, reason)
        self.window = [t for t in (from_disk(item) for item in items) if t is not None]
        self.tokens = [self.counter.count(t.text) for t in self.window]
        self.watch.remember()
        self.save_window(looked=True)  # durably, as the new window base
        self.log.info("adopted an outside edit of recent.json (%d items)", len(self.window))
        return True

    def save_meta(self, *, durable: bool = True) -> None:
        """Write recent_meta.json; nothing when this store last wrote the same bytes
        durably and the file is still that write (a recovery's flush follows a load that
        wrote it: one fsync'd replace fewer per recovered character). Raises OSError."""
        path = self.ports.paths.recent_meta
        data = encode_json(self.meta)
        if durable and self._meta_saved is not None and self._meta_saved[0] == data and _stamp(path) == self._meta_saved[1]:
            return
        self._meta_saved = None
        atomic_write_bytes(path, data, durable=durable)
        if durable:
            self._meta_saved = (data, _stamp(path))
