"""Query and document text as the lexical index sees it, and time hints inside queries.

Lexical text goes through :func:`lexical_text` before the BM25 index (documents and queries
alike): the stop names are stripped, then plain ASCII words are cut to a light English
stem, so that "researched", "researching" and "research" meet. Queries also lose English
function words ("what did ... do"), which otherwise match unrelated memories by chance.
CJK, Hangul and other scripts pass through untouched (the index's tokenizer makes their
n-grams). :func:`query_time_hint` finds a time expression inside a query.
"""

from __future__ import annotations

import re
from datetime import datetime
from functools import lru_cache

from nekomem.config.recall import RecallSettings
from nekomem.recall.timewindow import TimeWindow, parse_time_window
from nekomem.recall.tokenize import fold_english, normalise, strip_stop_names

_WORD_SPLIT = re.compile(r"[a-z]+|[^a-z]+")
_VOWEL = re.compile(r"[aeiouy]")
QUERY_STOPWORDS = frozenset(
    """
a an the and or but if of to in on at by for with from about as into through after over between out during
without before under around among is are was were be been being am do does did doing done have has had having
will would shall should can could may might must what when where which who whom whose why how that this these
those there here i me my mine we us our ours you your yours he him his she her hers it its they them their
theirs not no so than too very just also only both each any all some such more most other another ever
""".split()
)


# Memoised: a long memory repeats the same few thousand words, and a wake stems them all.
_WORD_CACHE_SIZE = 1 << 16


@lru_cache(maxsize=_WORD_CACHE_SIZE)
def light_stem(word: str) -> str:
    """A light English stem of a lowercase ASCII word (plural, -ed, -ing, -ly, final e).

    Words of three letters or fewer are kept. Deterministic, so documents and queries meet.
    """
    if len(word) <= 3:
        return word
    w = word
    if w.endswith("ies") and len(w) > 4:
        w = w[:-3] + "y"
    elif w.endswith("sses"):
        w = w[:-2]
    elif w.endswith("s") and not w.endswith(("ss", "us", "is")) and len(w) > 4:
        w = w[:-1]
    for suffix in ("ingly", "edly", "ing", "ed", "ly"):
        if w.endswith(suffix) and len(w) - len(suffix) >= 3 and _VOWEL.search(w[: -len(suffix)]):
            w = w[: -len(suffix)]
            if suffix.startswith(("ing", "ed")) and len(w) > 3 and w[-1] == w[-2] and w[-1] not in "lsz":
                w = w[:-1]  # stopped -> stop, planned -> plan
            break
    if w.endswith("ied") and len(w) > 4:
        w = w[:-3] + "y"
    if w.endswith("e") and len(w) > 4:
        w = w[:-1]  # create / creating / created -> creat
    return w


def lexical_text(text: str, stop_names: tuple[str, ...], min_name_chars: int, *, stem: bool, query_stopwords: bool = False) -> str:
    """``text`` as the lexical index sees it (see the comment above)."""
    norm = normalise(text)
    if stop_names:
        norm = strip_stop_names(norm, stop_names, min_name_chars)
    if not stem and not query_stopwords:
        return norm
    out: list[str] = []
    for piece in _WORD_SPLIT.findall(norm):
        if not "a" <= piece[0] <= "z":  # _WORD_SPLIT: a piece is all [a-z] or has none
            out.append(piece)
        elif query_stopwords and piece in QUERY_STOPWORDS:
            out.append(" ")
        else:
            out.append(light_stem(piece) if stem else piece)
    return "".join(out)


_TIMEISH = re.compile(
    r"\d|today|tonight|yesterday|tomorrow|morning|afternoon|evening|night|week|weekend|month|year|ago|"
    r"monday|tuesday|wednesday|thursday|friday|saturday|sunday|january|february|march|april|may|june|"
    r"july|august|september|october|november|december|jan|feb|mar|apr|jun|jul|aug|sep|sept|oct|nov|dec|"
    r"mon|tue|tues|wed|thu|thur|thurs|fri|sat|sun",
    re.I,
)
# Single English words that are names of a month or a weekday but usually mean something
# else in a sentence ("may", "march", "sun"): never a time hint on their own.
_AMBIGUOUS_ALONE = frozenset(
    "may march sat sun wed mon tue tues thu thur thurs fri jan feb mar apr jun jul aug sep sept oct nov dec "
    "second night morning evening week month year weekend".split()
)
_TIME_FILLERS = frozenset("the in on at during over around by of".split())
_CJK_TIME_CHARS = re.compile(r"[0-9〇零一二两兩三四五六七八九十百年月日号號周週天昨今明先来來上下去前后後半夜晚朝昼午曜]")
_SPACELESS_RUN = re.compile(r"[^\sA-Za-z]+")


_Best = tuple[int, int, int, TimeWindow]  # (length, start, end, window) in characters


class _Attempts:
    """The parse budget shared by both scans of one query."""

    __slots__ = ("left",)

    def __init__(self, limit: int) -> None:
        self.left = limit

    def take(self) -> bool:
        self.left -= 1
        return self.left >= 0


def _spaced_hint(query: str, now: datetime, max_tokens: int, attempts: _Attempts) -> _Best | None:
    """The longest run of up to ``max_tokens`` whitespace tokens that parses as a time."""
    best: _Best | None = None
    tokens = [(m.start(), m.end()) for m in re.finditer(r"\S+", query)]
    for i in range(len(tokens)):
        for j in range(min(len(tokens), i + max_tokens), i, -1):
            start, end = tokens[i][0], tokens[j - 1][1]
            span = query[start:end]
            if not _TIMEISH.search(span):
                continue
            words = [w for w in re.findall(r"[a-z]+|\d+", span.lower()) if w not in _TIME_FILLERS]
            if len(words) == 1 and words[0] in _AMBIGUOUS_ALONE:
                continue
            if best is not None and end - start <= best[0]:
                continue
            if not attempts.take():
                break
            window = parse_time_window(span, now)
            if window is not None:
                best = (end - start, start, end, window)
                break
    return best


def _spaceless_hint(query: str, now: datetime, max_tokens: int, attempts: _Attempts, best: _Best | None) -> _Best | None:
    """Spaceless scripts: substrings of CJK runs that contain a date-like character."""
    for run in _SPACELESS_RUN.finditer(query):
        text = run.group()
        if not _CJK_TIME_CHARS.search(text) or text.isascii():
            continue
        for a in range(len(text)):
            if not _CJK_TIME_CHARS.match(text[a]):
                continue
            for b in range(min(len(text), a + 3 * max_tokens), a + 1, -1):
                if best is not None and b - a <= best[0]:
                    break
                if not attempts.take():
                    break
                window = parse_time_window(text[a:b], now)
                if window is not None:
                    best = (b - a, run.start() + a, run.start() + b, window)
                    break
    return best


def query_time_hint(query: str, now: datetime, max_tokens: int, max_attempts: int) -> tuple[TimeWindow | None, str]:
    """A time expression inside a query ("what did I eat on 8 December 2023", "昨日何を
    食べた") as a window, and the query without it. The longest span that parses wins;
    ``(None, query)`` when there is none. At most ``max_attempts`` parses are tried."""
    attempts = _Attempts(max_attempts)
    best = _spaceless_hint(query, now, max_tokens, attempts, _spaced_hint(query, now, max_tokens, attempts))
    if best is None:
        return None, query
    _, start, end, window = best
    rest = " ".join((query[:start] + " " + query[end:]).split())
    return window, rest


class LexicalAnalyzer:
    """One character's lexical analysis: its stop names and the recall settings."""

    def __init__(self, settings: RecallSettings, stop_names: tuple[str, ...]) -> None:
        self.settings = settings
        self.stop_names = stop_names

    def document(self, text: str) -> str:
        """An entry's text as the BM25 index stores it."""
        s = self.settings
        return lexical_text(text, self.stop_names, s.recall_stop_name_min_chars, stem=s.recall_stem_english)

    def query(self, text: str) -> str:
        """A query's text as BM25 searches it (function words dropped when configured)."""
        s = self.settings
        stripped = lexical_text(
            text, self.stop_names, s.recall_stop_name_min_chars, stem=s.recall_stem_english, query_stopwords=s.recall_query_stopwords
        )
        if s.recall_query_stopwords and not any(ch.isalnum() for ch in stripped):
            # Nothing but function words ("what did you do?"): search them rather than nothing.
            return self.document(text)
        return stripped


def stop_names_for(names: list[str]) -> tuple[str, ...]:
    """The normalised, deduplicated, sorted stop names of a character (empties dropped)."""
    return tuple(sorted({normalise(n).strip() for n in names if n and n.strip()}))


def forget_memoised_words() -> None:
    """Drop the memoised word folds and stems (they hold single words of memory text, in
    RAM only): called when entries leave an index, so an erased memory's words do not stay
    in the process until evicted."""
    fold_english.cache_clear()
    light_stem.cache_clear()
