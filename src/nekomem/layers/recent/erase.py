"""Erasing turns from the recent window: the journal rows, then every copy of their text.

A forgotten turn leaves time_indexed.db (rows deleted with ``secure_delete``, the WAL
checkpointed and truncated), the window (recent.json, written durably and without its
swap file), the review state (a fingerprint keeps the turn's hash, not its first
characters), the edit history (recent_edits.ndjson), the fact actor's extraction queue and
the outbox's post-turn records (told with :class:`ScrubTexts`). What was *learned* from the turn before it was
forgotten (the summary memo, facts, reflections) stays: those are memories of their own
with their own ``forget`` (docs/OPERATIONS.md, "Forgetting").
"""

from __future__ import annotations

import hashlib

import msgspec

from nekomem.actors.messages import ForgetTurns, ScrubTexts
from nekomem.actors.ports import LayerPorts
from nekomem.domain.layers import RECENT
from nekomem.domain.turns import Turn
from nekomem.importer import neko_folder
from nekomem.layers.recent.state import RecentStore
from nekomem.runtime.reply import ActorFailure
from nekomem.stores.erasure import scrub_ndjson_file
from nekomem.stores.recent_watch import EDITS_FILE
from nekomem.stores.window_sources import item_key
from nekomem.wire.answers import ForgetTurnsAnswer

# A time range that is not a range of turns is refused, not guessed at.
_BAD_RANGE = "a time range needs both 'from' and 'to' (ISO 8601), 'from' not after 'to'"


def forget_turns(ports: LayerPorts, store: RecentStore, msg: ForgetTurns) -> None:
    """Erase the rows ``msg`` names and every copy of their text; the outbox answers
    ``msg.reply`` once its copies are gone too. Raises ActorFailure 400 for a bad range,
    404 when nothing matched."""
    store.adopt_outside_edit("erase")
    tindex = store.tindex
    if msg.start is not None or msg.end is not None:
        if msg.start is None or msg.end is None:
            raise ActorFailure("bad_range", _BAD_RANGE, 400)
        try:
            ids = tindex.row_ids_between(msg.start, msg.end)
        except ValueError:
            raise ActorFailure("bad_range", _BAD_RANGE, 400) from None
    else:
        ids = list(msg.row_ids)
    rows = tindex.delete_rows(ids)
    if not rows and not ids:
        raise ActorFailure("not_found", "no stored turn matched", 404)
    if not rows:
        raise ActorFailure("not_found", f"no stored turn {ids[0]}" if len(ids) == 1 else "no stored turn matched", 404)
    row_ids = {r.id for r in rows}
    # Window items edited from the erased rows go with them, and their edited texts with
    # the rows' texts (from the review state and the edit history).
    edited = [t for t in store.window if store.sources.from_rows(t, row_ids)]
    erased = [r.turn for r in rows]
    texts = sorted({t.text.strip() for t in [*erased, *edited] if t.text.strip()})
    _drop_from_review(store, [*erased, *edited])
    _drop_from_window(store, erased, row_ids)  # writes recent_meta.json too
    # The window base in time_indexed.db held the erased turns too: its new value is in the
    # WAL now, and the old page goes when the WAL is copied back and truncated.
    tindex.scrub_wal()
    scrub_ndjson_file(ports.paths.folder / EDITS_FILE, texts)
    if ports.paths.neko_folder:
        # The reference's copy of the journal held the turns too.
        neko_folder.mirror_journal(ports.paths, ports.settings.importer.import_source_timezone)
    ports.log.info("forgot %d stored turns", len(rows))
    answer = ForgetTurnsAnswer(forgotten=len(rows), rows=[r.id for r in rows])
    # Through every layer that holds copies of turns (the fact actor's extraction queue),
    # as their declarations say; the outbox comes last and answers.
    scrub = ScrubTexts(texts=texts, origin=RECENT, kind="turns", reply_value=answer, reply=msg.reply)
    ports.send(scrub.onward(RECENT), scrub)


def _drop_from_window(store: RecentStore, erased: list[Turn], row_ids: set[int]) -> None:
    """The window items that are the erased rows (role, text and time), and the edited
    items that came from them (by row id, :mod:`nekomem.stores.window_sources`)."""
    gone = {item_key(t) for t in erased}
    sources = store.sources
    # A new list (the window is only extended in place, see RecentStore).
    window = [t for t in store.window if item_key(t) not in gone and not sources.from_rows(t, row_ids)]
    if len(window) != len(store.window):
        store.window = window
        store.tokens = [store.counter.count(t.text) for t in window]
    if sources.keep_only(window):
        sources.save()
    store.save_window(looked=True)  # durable, and the swap file with the old window is dropped
    store.save_meta()


def _drop_from_review(store: RecentStore, erased: list[Turn]) -> None:
    """Fingerprint entries are ``role:sha256:prefix``: an erased turn's entry keeps its
    hash (it no longer matches anything in the window) and loses its prefix."""
    texts = [t.text for t in erased if t.text]
    hashes = {hashlib.sha256(t.encode()).hexdigest() for t in texts}
    state = store.meta.review

    def cut(entries: list[str] | None) -> list[str] | None:
        if not entries:
            return entries
        out = []
        for entry in entries:
            role, _, rest = entry.partition(":")
            digest, _, prefix = rest.partition(":")
            hit = digest in hashes or any(prefix and t.startswith(prefix) for t in texts)
            out.append(f"{role}:{digest}:" if hit else entry)
        return out

    store.meta.review = msgspec.structs.replace(
        state, last_reviewed_tail=cut(state.last_reviewed_tail), fail_fingerprint=cut(state.fail_fingerprint)
    )
