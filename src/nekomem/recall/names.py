"""Names inside a query, and the query vector that does not let them dominate.

A question that names a person ("What activities does Melanie partake in?") embeds close
to every memory that mentions that person, so the vector leg fills up with generic facts
about them ("Melanie values her family") and the specific ones that answer the question
("Melanie is going swimming with the kids") fall below the budget. The query is therefore
embedded twice, as asked and with its names cut out, and the two vectors are blended
(:func:`blend_query_vectors`): the name still counts, but half as much.

A name is a capitalised word of a Latin-script query (``Melanie``, ``Melanie's``,
``LeBron``, ``New York``) that is not an English function word, a month or a weekday (the
time hints own those), and not the first word of a sentence unless it is possessive
("Melanie's kids"), since any first word is capitalised. Scripts without capitals (Chinese,
Japanese) have no names here and keep the single vector.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from nekomem.recall.query_text import QUERY_STOPWORDS

_CAPITALISED = re.compile(r"(?<![\w'’.\-])[A-Z][\w\-]*(?:['’][A-Za-z]+)?")
_POSSESSIVE = re.compile(r"['’]s$")
_SENTENCE_END = re.compile(r"[.!?:;]$")
_TITLE = re.compile(r"(?:^|\s)[A-Z][a-z]{0,2}\.$")  # Dr. / Mr. / Mrs. / St. before a name
_CALENDAR_WORDS = frozenset(
    "january february march april may june july august september october november december "
    "monday tuesday wednesday thursday friday saturday sunday".split()
)


def name_spans(query: str) -> list[tuple[int, int]]:
    """The ``(start, end)`` character spans of the names in ``query``, in order (see the
    module docstring for what counts as a name); a possessive ``'s`` is part of the span."""
    spans: list[tuple[int, int]] = []
    for match in _CAPITALISED.finditer(query):
        word = match.group()
        possessive = bool(_POSSESSIVE.search(word))
        base = _POSSESSIVE.sub("", word).lower()
        if base in QUERY_STOPWORDS or base in _CALENDAR_WORDS:
            continue
        if not possessive and _starts_sentence(query[: match.start()].rstrip()):
            continue
        spans.append(match.span())
    return spans


def _starts_sentence(before: str) -> bool:
    """Whether a word after ``before`` (the query up to it, stripped) opens a sentence."""
    return not before or (bool(_SENTENCE_END.search(before)) and not _TITLE.search(before))


def without_names(query: str) -> str | None:
    """``query`` with its names cut out and the spaces tidied; None when it names nothing
    or when nothing but function words would be left."""
    spans = name_spans(query)
    if not spans:
        return None
    out = query
    for start, end in reversed(spans):
        out = out[:start] + " " + out[end:]
    rest = " ".join(out.split())
    # "Who is Melanie?" without the name asks nothing: no second vector for it.
    return rest if any(w.lower() not in QUERY_STOPWORDS for w in re.findall(r"\w+", rest)) else None


def query_vector_texts(search: str, unnamed_weight: float) -> list[str]:
    """The texts to embed for the vector leg of ``search``: the query itself, then (when
    ``unnamed_weight`` is above 0 and the query names someone) the query without names."""
    if unnamed_weight <= 0:
        return [search]
    unnamed = without_names(search)
    return [search] if unnamed is None else [search, unnamed]


def blend_query_vectors(rows: Sequence[npt.NDArray[np.float32]], unnamed_weight: float) -> npt.NDArray[np.float32]:
    """One unit query vector from the rows of :func:`query_vector_texts`: the first row
    alone, or ``(1 - w) * asked + w * unnamed`` renormalised. Raises ValueError when
    ``rows`` is empty."""
    if not len(rows):
        raise ValueError("no query vector to blend")
    first = np.asarray(rows[0], dtype=np.float32)
    if len(rows) < 2 or unnamed_weight <= 0:
        return first
    mixed = (1.0 - unnamed_weight) * first + unnamed_weight * np.asarray(rows[1], dtype=np.float32)
    norm = float(np.linalg.norm(mixed))
    return first if norm == 0.0 or not np.isfinite(norm) else (mixed / norm).astype(np.float32)
