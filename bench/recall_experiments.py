"""Ideas for the query recall that were measured on LoCoMo and not shipped, kept runnable.

    .venv/bin/python -m bench.recall_offline --configs both --experiments char-ngrams,one-per-day

Each experiment changes the legs a search fuses, on top of a configuration of
``bench.locomo_quality``: it gets the base legs (BM25 and one per vector model, each cut and
thresholded as the server does) and returns the legs to fuse, adding legs or replacing base
ones; the same-time leg is then built from the result as usual, and the hinted (time
window) search goes through the same experiment. Nothing here is used by the server.

- ``char-ngrams``: a leg ranking the facts by the TF-IDF cosine of character 4-grams
  (catches "destress" ~ "stress-buster" that BM25's words miss).
- ``one-per-day``: a leg holding the best fused fact of each event day (evidence of one
  question is spread over sessions).
- ``name-topic``: for a question naming people, a leg per model over the facts that name one
  of them, ranked by the cosine of the fact and the question with every capitalised word
  cut out (who the fact is about filters; what it is about ranks).
- ``whitened``: each vector leg re-ranked with vectors whitened by the character's own
  memories (shrunk covariance), against the anisotropy of small-model embeddings.
- ``word-neighbours``: the BM25 leg with every query word widened to the stored words whose
  USE vectors are nearest (cosine >= 0.6, three at most, weight half their cosine).
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Collection
from datetime import tzinfo

import msgspec
import numpy as np
import numpy.typing as npt

from nekomem.config.recall import RecallSettings
from nekomem.recall.fusion import rrf, same_time_leg
from nekomem.recall.index import RecallIndex
from nekomem.recall.names import name_spans, without_names
from nekomem.recall.query_text import LexicalAnalyzer

Vectors = npt.NDArray[np.float32]
_CAPITALISED = re.compile(r"(?<![\w'’.\-])[A-Z][\w\-]*(?:['’][A-Za-z]+)?")


class ExperimentIndex(RecallIndex):
    """A RecallIndex whose searches fuse the legs ``experiment`` makes of the base legs.

    ``question`` is the searched text of the current question (set by the caller before
    each search); ``embed`` embeds texts with the character's embedding service."""

    experiment: Callable[[ExperimentIndex, list[list[str]], str, Vectors | None, Collection[str] | None], list[list[str]]]
    embed: Callable[[list[str], str], Vectors]
    question: str = ""

    def __init__(self, settings: RecallSettings, tz: tzinfo, analyzer: LexicalAnalyzer) -> None:
        super().__init__(settings, tz, analyzer)
        self._experiment_cache: dict[str, object] = {}

    def legs(self, lexical_query: str, qvec: Vectors | None, allowed: Collection[str] | None) -> list[list[str]]:
        # The base legs without the same-time leg, which is built from the experiment's legs.
        anchors = self.s.recall_same_time_anchors
        settings, self.s = self.s, msgspec.structs.replace(self.s, recall_same_time_anchors=0)
        try:
            base = super().legs(lexical_query, qvec, allowed)
        finally:
            self.s = settings
        legs = self.experiment(self, base, lexical_query, qvec, allowed)
        if anchors > 0:
            same_time = same_time_leg(legs, self.s.recall_rrf_k, anchors, self._event_day)
            if same_time:
                legs.append(same_time)
        return legs

    def cached(self, key: str, build: Callable[[], object]) -> object:
        """``build()`` once per index (the experiments' per-character state)."""
        if key not in self._experiment_cache:
            self._experiment_cache[key] = build()
        return self._experiment_cache[key]


def _top(ids: list[str], scores: npt.NDArray[np.float64], allowed: Collection[str] | None, n: int, floor: float = -math.inf) -> list[str]:
    order = np.argsort(-scores, kind="stable")
    return [ids[j] for j in order if scores[j] > floor and (allowed is None or ids[j] in allowed)][:n]


# -- char-ngrams --------------------------------------------------------------------------
def _grams(text: str, n: int = 4) -> Counter[str]:
    padded = " " + " ".join(re.sub(r"[^a-z0-9 ]+", " ", text.lower()).split()) + " "
    return Counter(padded[i : i + n] for i in range(len(padded) - n + 1))


def char_ngrams(
    index: ExperimentIndex, base: list[list[str]], lexical_query: str, qvec: Vectors | None, allowed: Collection[str] | None
) -> list[list[str]]:
    def build() -> tuple[list[str], list[dict[str, float]], dict[str, float]]:
        ids = list(index.docs)
        counts = [_grams(index.docs[i].entry.text) for i in ids]
        df = Counter(g for c in counts for g in c)
        idf = {g: math.log((len(ids) + 1) / (d + 0.5)) for g, d in df.items()}
        rows = []
        for c in counts:
            row = {g: (1 + math.log(tf)) * idf[g] for g, tf in c.items()}
            norm = math.sqrt(sum(v * v for v in row.values())) or 1.0
            rows.append({g: v / norm for g, v in row.items()})
        return ids, rows, idf

    ids, rows, idf = index.cached("char-ngrams", build)  # type: ignore[misc]
    query = {g: (1 + math.log(tf)) * idf[g] for g, tf in _grams(lexical_query).items() if g in idf}
    scores = np.array([sum(w * row.get(g, 0.0) for g, w in query.items()) for row in rows])
    return [*base, _top(ids, scores, allowed, index.s.recall_budget_each, 0.0)]


# -- one-per-day --------------------------------------------------------------------------
def one_per_day(
    index: ExperimentIndex, base: list[list[str]], lexical_query: str, qvec: Vectors | None, allowed: Collection[str] | None
) -> list[list[str]]:
    seen: set[object] = set()
    leg: list[str] = []
    for doc_id, _ in rrf(base, index.s.recall_rrf_k, sum(len(b) for b in base)):
        day = index._event_day(doc_id)
        if day not in seen:
            seen.add(day)
            leg.append(doc_id)
    return [*base, leg[: index.s.recall_budget_each]]


# -- name-topic ---------------------------------------------------------------------------
def _topic(text: str) -> str:
    return " ".join(_CAPITALISED.sub(" ", text).split()) or text


def name_topic(
    index: ExperimentIndex, base: list[list[str]], lexical_query: str, qvec: Vectors | None, allowed: Collection[str] | None
) -> list[list[str]]:
    question = index.question
    names = {w.lower() for a, b in name_spans(question) for w in re.sub(r"['’]s$", "", question[a:b]).split()}
    rest = without_names(question)
    if not names or rest is None or not index.vector_legs:
        return base

    def build() -> tuple[list[str], Vectors, list[set[str]]]:
        ids = list(index.docs)
        texts = [index.docs[i].entry.text for i in ids]
        return ids, index.embed([_topic(t) for t in texts], "passage"), [{w.lower() for w in re.findall(r"[A-Za-z]+", t)} for t in texts]

    ids, topics, words = index.cached("name-topic", build)  # type: ignore[misc]
    naming = [i for i, w in zip(ids, words, strict=True) if names & w]
    query = index.embed([rest], "query")[0]
    legs = list(base)
    for leg in index.vector_legs:
        rows = topics[:, leg.start : leg.stop]
        q = query[leg.start : leg.stop]
        scores = (rows @ q) / (np.linalg.norm(rows, axis=1) * np.linalg.norm(q) + 1e-12)
        legs.append(
            _top(ids, scores.astype(np.float64), set(naming) & (set(ids) if allowed is None else set(allowed)), index.s.recall_budget_each)
        )
    return legs


# -- whitened -----------------------------------------------------------------------------
def whitened(
    index: ExperimentIndex, base: list[list[str]], lexical_query: str, qvec: Vectors | None, allowed: Collection[str] | None
) -> list[list[str]]:
    if qvec is None or index.vectors is None or not index.vector_legs:
        return base

    def build() -> tuple[list[str], list[tuple[Vectors, Vectors, Vectors]]]:
        assert index.vectors is not None
        ids = [i for i in index.docs if index.vectors.get(i) is not None]
        matrix = np.stack([index.vectors.get(i) for i in ids]).astype(np.float64)  # type: ignore[misc]
        out = []
        for leg in index.vector_legs:
            part = matrix[:, leg.start : leg.stop]
            part /= np.linalg.norm(part, axis=1, keepdims=True)
            mean = part.mean(0)
            values, vectors = np.linalg.eigh(np.cov((part - mean).T))
            transform = vectors @ np.diag((values + 3.0 * values.mean()) ** -0.5) @ vectors.T
            rows = (part - mean) @ transform
            out.append((mean, transform, rows / np.linalg.norm(rows, axis=1, keepdims=True)))
        return ids, out

    ids, parts = index.cached("whitened", build)  # type: ignore[misc]
    legs = list(base)
    query = np.asarray(qvec, dtype=np.float64).reshape(-1)
    for n, (leg, (mean, transform, rows)) in enumerate(zip(index.vector_legs, parts, strict=True)):
        q = query[leg.start : leg.stop] / np.linalg.norm(query[leg.start : leg.stop])
        w = (q - mean) @ transform
        legs[1 + n] = _top(ids, rows @ (w / np.linalg.norm(w)), allowed, index.s.recall_budget_each)
    return legs


# -- word-neighbours ----------------------------------------------------------------------
def word_neighbours(
    index: ExperimentIndex, base: list[list[str]], lexical_query: str, qvec: Vectors | None, allowed: Collection[str] | None
) -> list[list[str]]:
    if not index.vector_legs:
        return base
    k1, b = index.s.recall_bm25_k1, index.s.recall_bm25_b
    first = index.vector_legs[0]

    def unit_words(words: list[str]) -> Vectors:
        rows = index.embed(words, "passage")[:, first.start : first.stop]
        return rows / np.linalg.norm(rows, axis=1, keepdims=True)

    def build() -> tuple[list[str], list[Counter[str]], npt.NDArray[np.float64], dict[str, float], list[str], Vectors]:
        ids = list(index.docs)
        counts = [Counter(index.analyzer.document(index.docs[i].entry.text).split()) for i in ids]
        lengths = np.array([sum(c.values()) for c in counts], dtype=np.float64)
        df = Counter(w for c in counts for w in c)
        idf = {w: math.log(1 + (len(ids) - d + 0.5) / (d + 0.5)) for w, d in df.items()}
        vocabulary = sorted(df)
        return ids, counts, lengths / max(lengths.mean(), 1.0), idf, vocabulary, unit_words(vocabulary)

    ids, counts, relative, idf, vocabulary, word_rows = index.cached("word-neighbours", build)  # type: ignore[misc]
    weights: dict[str, float] = {}
    for word in lexical_query.split():
        weights[word] = 1.0
        similar = word_rows @ unit_words([word])[0]
        for j in np.argsort(-similar)[:4]:
            if vocabulary[j] != word and similar[j] >= 0.6:
                weights[vocabulary[j]] = max(weights.get(vocabulary[j], 0.0), 0.5 * float(similar[j]))
    scores = np.zeros(len(ids))
    for word, weight in weights.items():
        if word in idf:
            tf = np.array([c.get(word, 0) for c in counts], dtype=np.float64)
            scores += weight * idf[word] * tf * (k1 + 1) / (tf + k1 * (1 - b + b * relative))
    return [_top(ids, scores, allowed, index.s.recall_budget_each, 0.0), *base[1:]]


EXPERIMENTS = {
    "char-ngrams": char_ngrams,
    "one-per-day": one_per_day,
    "name-topic": name_topic,
    "whitened": whitened,
    "word-neighbours": word_neighbours,
}
