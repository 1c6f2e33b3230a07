"""What a user recall will search, decided before any embedding is computed.

An explicit ``time`` restricts the pool to the entries inside its window (a hard filter).
Without one, a time expression inside the query itself ("what did I eat yesterday") is
taken out of the searched text and its window's entries get a pair of legs of their own
(a month named without a year that holds no memories means the latest earlier one that does).
The texts the vector leg embeds are decided here too (:mod:`nekomem.recall.names`: the
query, and the query without the names it mentions).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from nekomem.config.recall import RecallSettings
from nekomem.domain.subjects import restrict
from nekomem.recall.index import RecallIndex
from nekomem.recall.names import query_vector_texts
from nekomem.recall.query_text import query_time_hint
from nekomem.recall.time_lookback import latest_remembered, names_month_without_year
from nekomem.recall.timewindow import TimeWindow, parse_time_window


@dataclass(frozen=True)
class QueryPlan:
    """``query`` as asked (trimmed, capped), ``search`` the text searched, ``spec`` the
    explicit time expression and ``window`` its parse (None when absent or not
    understood), ``allowed`` the ids inside that window (None: no filter), ``hinted`` the
    ids inside a window named by the query itself, ``started`` a perf_counter stamp,
    ``vector_texts`` the texts whose embeddings blend into the query vector, ``hint`` the
    time window the query itself names (None: none, or an explicit window was given),
    ``scoped`` whether a subject scope restricts what the query may see (then the owner's
    private journal turns are never candidates)."""

    query: str
    search: str
    spec: str
    window: TimeWindow | None
    allowed: set[str] | None
    hinted: set[str] | None
    started: float
    vector_texts: tuple[str, ...] = ()
    hint: TimeWindow | None = None
    scoped: bool = False


def hinted_ids(query: str, hint: TimeWindow, index: RecallIndex, settings: RecallSettings, visible: set[str] | None) -> set[str] | None:
    """The ids inside the time hint ``hint`` of ``query`` (None: none); a month named
    without a year falls back to the latest earlier year that has memories then
    (:mod:`nekomem.recall.time_lookback`)."""

    def ids_in(window: TimeWindow) -> set[str] | None:
        return restrict(index.in_window(window), visible) or None

    hinted = ids_in(hint)
    if hinted is None and settings.recall_query_time_year_lookback and names_month_without_year(query):
        hinted = latest_remembered(hint, settings.recall_query_time_year_lookback, ids_in)
    return hinted


def plan_query(
    query: str,
    spec: str,
    now: datetime,
    index: RecallIndex,
    settings: RecallSettings,
    started: float,
    visible: set[str] | None = None,
    *,
    scoped: bool = False,
) -> QueryPlan:
    """The plan of recall ``query`` with time expression ``spec`` resolved against ``now``;
    ``visible`` (None: everything) is a hard filter on every id the plan allows; ``scoped``:
    the query names subjects (a group chat), so it is not the owner's private read."""
    spec = spec.strip()
    window = parse_time_window(spec, now) if spec else None
    search, hint, hinted = query, None, None
    if query and window is None and settings.recall_query_time_hints:
        hint, rest = query_time_hint(query, now, settings.recall_query_time_max_tokens, settings.recall_query_time_max_attempts)
        if hint is not None:
            hinted = hinted_ids(query, hint, index, settings, visible)
            search = rest or query
    allowed = restrict(index.in_window(window) if window is not None else None, visible)
    vector_texts = tuple(query_vector_texts(search, settings.recall_query_unnamed_weight)) if search else ()
    return QueryPlan(query, search, spec, window, allowed, hinted, started, vector_texts, hint, scoped)
