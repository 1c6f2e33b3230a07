"""Beyond the reference: the turns a fact was learnt from as more keys of that fact (the
key expansion of LongMemEval), behind ``recall_turn_keys``.

A fact extracted from the journal names the time span of its source turns
(``source_ref = {"kind": "turns", "from", "to"}``, carried on its index entry as
``source_from`` / ``source_to``). Recall searches the newest covered turns by BM25
(a :class:`~nekomem.recall.turn_leg.TurnCorpus`); :class:`TurnKeys` turns that ranking of
turns into a ranking of facts: each matching turn, best first, brings the facts whose span
holds its time (facts of one extraction share a span), each fact once. That ranking is one
more leg of the fusion; the turns themselves are never returned as rows.
"""

from __future__ import annotations

import bisect
from collections.abc import Collection, Iterable, Sequence
from datetime import tzinfo

from nekomem.recall.entry import IndexedDoc, epoch_seconds

# Spans of facts nearest before a turn that are looked at for it (spans of one character's
# extractions barely overlap: the nearest few hold the turn if any does).
_SPANS_LOOKED_AT = 64


class TurnKeys:
    """The facts of an index by the time span of their source turns (built once per change
    of the index; see the module docstring)."""

    def __init__(self, docs: Iterable[tuple[str, IndexedDoc]], tz: tzinfo) -> None:
        by_span: dict[tuple[float, float], list[str]] = {}
        for doc_id, doc in docs:
            entry = doc.entry
            start, end = epoch_seconds(entry.source_from, tz), epoch_seconds(entry.source_to, tz)
            if start is None or end is None:
                continue
            by_span.setdefault((min(start, end), max(start, end)), []).append(doc_id)
        self._spans = sorted(by_span)
        self._starts = [span[0] for span in self._spans]
        self._facts = [by_span[span] for span in self._spans]
        self.tz = tz

    def __len__(self) -> int:
        return len(self._spans)

    def facts_at(self, when: float) -> list[str]:
        """The facts whose source span holds the instant ``when`` (epoch seconds)."""
        out: list[str] = []
        stop = bisect.bisect_right(self._starts, when)
        for i in range(stop - 1, max(-1, stop - 1 - _SPANS_LOOKED_AT), -1):
            if self._spans[i][1] >= when:
                out += self._facts[i]
        return out

    def leg(self, turn_times: Sequence[str | None], depth: int, allowed: Collection[str] | None) -> list[str]:
        """The facts of the turns at ``turn_times`` (ISO 8601, best turn first), each fact
        once, cut to ``depth``; only ids in ``allowed`` when it is given."""
        out: list[str] = []
        seen: set[str] = set()
        for stamp in turn_times:
            when = epoch_seconds(stamp, self.tz)
            if when is None:
                continue
            for doc_id in self.facts_at(when):
                if doc_id in seen or (allowed is not None and doc_id not in allowed):
                    continue
                seen.add(doc_id)
                out.append(doc_id)
                if len(out) >= depth:
                    return out
        return out
