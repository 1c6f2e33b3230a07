"""Names inside a query (recall/names.py): which capitalised words count, the query without
them, and the blended query vector."""

from __future__ import annotations

import numpy as np
import pytest

from nekomem.recall.names import blend_query_vectors, name_spans, query_vector_texts, without_names


def names(query: str) -> list[str]:
    return [query[a:b] for a, b in name_spans(query)]


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("What activities does Melanie partake in?", ["Melanie"]),
        ("Who is Tim and John's favorite basketball player?", ["Tim", "John's"]),
        ("Melanie's kids like what?", ["Melanie's"]),  # sentence-initial, but possessive
        ("Melanie likes what?", []),  # any first word is capitalised
        ("When did Caroline go? Then Joanna came.", ["Caroline", "Joanna"]),  # "Then" opens a sentence
        ("What did LeBron do in New York?", ["LeBron", "New", "York"]),
        ("Would she like Dr. Seuss books?", ["Dr", "Seuss"]),  # a title's dot ends no sentence
        ("What did Tim do in August on Monday?", ["Tim"]),  # calendar words belong to time hints
        ("What Did The cat Do?", []),  # function words, whatever their case
        ("what did i eat yesterday", []),
        ("昨日何を食べた", []),
        ("Where is O'Brien from?", ["O'Brien"]),
    ],
)
def test_which_words_are_names(query: str, expected: list[str]) -> None:
    assert names(query) == expected


def test_without_names() -> None:
    assert without_names("What activities does Melanie partake in?") == "What activities does partake in?"
    assert without_names("Who is Tim and John's favorite player?") == "Who is and favorite player?"
    assert without_names("what did i eat yesterday") is None  # names nothing
    assert without_names("Who is Melanie?") is None  # nothing but function words would be left
    assert without_names("And Melanie?") is None


def test_query_vector_texts() -> None:
    assert query_vector_texts("What does Melanie paint?", 0.5) == ["What does Melanie paint?", "What does paint?"]
    assert query_vector_texts("What does Melanie paint?", 0.0) == ["What does Melanie paint?"]
    assert query_vector_texts("what do I paint?", 0.5) == ["what do I paint?"]


def test_blend_query_vectors() -> None:
    asked = np.array([1.0, 0.0, 0.0], dtype=np.float32)
    unnamed = np.array([0.0, 1.0, 0.0], dtype=np.float32)
    half = blend_query_vectors([asked, unnamed], 0.5)
    assert half.dtype == np.float32 and np.allclose(half, [2**-0.5, 2**-0.5, 0.0], atol=1e-6)
    quarter = blend_query_vectors([asked, unnamed], 0.25)
    assert np.linalg.norm(quarter) == pytest.approx(1.0, abs=1e-6) and quarter[0] == pytest.approx(3 * quarter[1], rel=1e-5)
    assert np.array_equal(blend_query_vectors([asked], 0.5), asked)  # one text embedded
    assert np.array_equal(blend_query_vectors([asked, unnamed], 0.0), asked)
    assert np.array_equal(blend_query_vectors([asked, -asked], 0.5), asked)  # they cancel: the query as asked
    with pytest.raises(ValueError):
        blend_query_vectors([], 0.5)
