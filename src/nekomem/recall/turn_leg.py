"""Beyond the reference: journal turns as recall candidates (tiers ``turn`` and ``journal``).

A :class:`TurnCorpus` is a BM25 index (the index's own lexical analysis) over a set of
journal rows. Recall builds one over the newest turns that no long-term memory covers
(:mod:`nekomem.stores.turn_coverage`: not mined yet, their extraction failed or is backed
off, or no model at all) and adds its ranking to the index's legs as one more leg of the
Reciprocal Rank Fusion: its rows are of tier ``turn``. A character without any long-term
entry searches its newest turns whether covered or not (tier ``journal``,
:mod:`nekomem.recall.journal_fallback`).

A turn row is a result row like a fact's, with the turn's time as ``created_at`` and
``event_start_at``, the speaker as ``entity`` (``master`` for the user, ``neko`` for the
character) and the write request that stored it as ``session_id``. Its id is
``turn_<row id>`` (``journal_<row id>``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from nekomem.config.recall import RecallSettings
from nekomem.domain.index_entry import IndexEntry
from nekomem.domain.theater import is_theater
from nekomem.domain.turns import parse_timestamp
from nekomem.recall.lexical import LexicalIndex
from nekomem.recall.query_text import LexicalAnalyzer
from nekomem.recall.timewindow import TimeWindow
from nekomem.stores.timeindex_read import TimeIndexRow

TURN_TIER = "turn"
JOURNAL_TIER = "journal"
TURN_TIERS = frozenset({TURN_TIER, JOURNAL_TIER})


class TurnCorpus:
    """BM25 over journal rows, as entries of ``tier``; system and theater rows and empty
    turns are left out. ``key`` is what the rows were read for (the caller's cache key);
    :meth:`sync` brings the corpus to another set of rows, indexing only the new ones."""

    def __init__(self, rows: Sequence[TimeIndexRow], tier: str, analyzer: LexicalAnalyzer, settings: RecallSettings, key: object = None) -> None:
        self.key = key
        self.tier = tier
        self.s = settings
        self.analyzer = analyzer
        self.lexical = LexicalIndex(settings)
        self.entries: dict[str, IndexEntry] = {}
        self.sessions: dict[str, str] = {}
        self.row_ids: set[int] = set()  # every row taken, indexed or left out
        self._add(rows)

    def _add(self, rows: Sequence[TimeIndexRow]) -> None:
        for row in rows:
            self.row_ids.add(row.id)
            turn = row.turn
            if turn.role == "system" or not turn.text.strip() or is_theater(turn):
                continue
            doc_id = f"{self.tier}_{row.id}"
            self.entries[doc_id] = IndexEntry(
                id=doc_id,
                tier=self.tier,
                text=turn.text,
                entity="master" if turn.role == "human" else "neko",
                created_at=turn.ts or None,
                event_start_at=turn.ts or None,
            )
            self.sessions[doc_id] = row.session_id or ""
            self.lexical.add(doc_id, self.analyzer.document(turn.text))

    def sync(self, ids: Sequence[int], fetch: Callable[[list[int]], Sequence[TimeIndexRow]], key: object) -> None:
        """Hold exactly the rows ``ids``: rows no longer among them (covered, erased, or
        pushed out by newer ones) are dropped, the new ones read through ``fetch`` and
        indexed. Raises what ``fetch`` raises (then the corpus is unchanged but for drops)."""
        wanted = set(ids)
        for row_id in self.row_ids - wanted:
            doc_id = f"{self.tier}_{row_id}"
            self.lexical.remove(doc_id)
            self.entries.pop(doc_id, None)
            self.sessions.pop(doc_id, None)
        self.row_ids &= wanted
        new = sorted(wanted - self.row_ids)
        if new:
            self._add(fetch(new))
            self.row_ids |= set(new)  # unreadable rows too: not fetched again
        self.key = key

    def __len__(self) -> int:
        return len(self.entries)

    def inside(self, window: TimeWindow) -> set[str]:
        """The ids of the turns whose time lies in ``window`` (undated turns never do)."""
        out: set[str] = set()
        for doc_id, entry in self.entries.items():
            if not entry.created_at:
                continue
            try:
                when = parse_timestamp(entry.created_at)
            except ValueError:
                continue
            if window.contains(when):
                out.add(doc_id)
        return out

    def leg(self, query: str, depth: int, allowed: set[str] | None = None) -> list[tuple[str, float]]:
        """The best ``depth`` turns for ``query`` (scores at least recall_bm25_threshold)
        inside ``allowed`` (None: all), best first. Never raises on text."""
        if allowed is not None and not allowed:
            return []
        return self.lexical.search(self.analyzer.query(query), depth, allowed, min_score=self.s.recall_bm25_threshold)
