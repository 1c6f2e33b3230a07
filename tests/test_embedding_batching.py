"""Micro-batching with the bundled models: a query embedded in a batch with other callers'
texts gets the vector it gets alone (within 1e-5), for ``use`` and ``e5``; concurrent callers
each get their own rows; and a real server answers concurrent queries with the vector leg.

The ``use`` graph is dynamically quantised (each call scales activations by its whole
batch), so it must keep each caller's texts in a call of their own; ``e5`` pads and masks,
so its callers share one call. Both must come out the same as alone."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from pathlib import Path

import httpx
import numpy as np
import pytest

from nekomem.config.embeddings import BUILTIN_MODELS, EmbeddingSettings
from nekomem.models.embedding_backends import Backend
from nekomem.models.embedding_batcher import Pending
from nekomem.models.embeddings import EmbeddingService, QueryDone, RequestExpired, find_project_root
from tests.support.live import LiveServer, make_settings

ROOT = find_project_root(Path(__file__))
assert ROOT is not None
LOAD_TIMEOUT = 120.0
WAIT = 120.0
MEET_WAIT = 20.0  # a lone model call gives up meeting a second one after this
# Lengths from 1 to ~60 tokens, several scripts: e5 pads the batch to the longest one.
QUERIES = [
    "tea",
    "what does master drink in the morning?",
    "猫の名前は？",
    "주말에 뭐 했어?",
    "Where did we travel last summer, and who came along with us on that long trip to the coast?",
    "昨天晚上我们一起看了什么电影",
    "ok",
    "Melanie's painting class",
]


def _service(model: str) -> EmbeddingService:
    if not (ROOT / BUILTIN_MODELS[model] / "model.onnx").is_file():
        pytest.skip(f"model {model} not installed; run scripts/fetch_model.py")
    service = EmbeddingService(EmbeddingSettings(embedding_model=model), project_root=ROOT)
    service.start()
    assert service.wait_ready(LOAD_TIMEOUT), service.reason
    return service


@pytest.fixture(scope="module", params=["use", "e5"])
def service(request: pytest.FixtureRequest) -> EmbeddingService:
    svc = _service(request.param)
    yield svc
    svc.close()


def test_a_micro_batch_gives_each_request_its_vectors_alone(service: EmbeddingService) -> None:
    alone = [service.embed([q], "query")[0] for q in QUERIES]
    # One micro-batch of every request (one a pair of texts, as a named query sends), run
    # the way the inference thread runs it.
    requests = [[q] for q in QUERIES[:-2]] + [QUERIES[-2:]]
    batch = [Pending([("query", text) for text in texts], 0, i) for i, texts in enumerate(requests)]
    answers = service._run_batch(batch)
    pair = service.embed(QUERIES[-2:], "query")  # the pair as one request, alone
    for i in range(len(QUERIES) - 2):
        np.testing.assert_allclose(answers[i][0], alone[i], atol=1e-5)
    np.testing.assert_allclose(answers[-1], pair, atol=1e-5)


def test_a_query_vector_is_bit_for_bit_the_same_alone_and_in_any_micro_batch(service: EmbeddingService) -> None:
    """However the waiting queries are cut into micro-batches (the share a free inference
    thread takes depends on how many wait), each one's vector is exactly the one it gets
    alone: batch sizes from one to all, in arrival and in reverse order."""
    alone = [service.embed([q], "query")[0] for q in QUERIES]
    for order in (list(range(len(QUERIES))), list(reversed(range(len(QUERIES))))):
        for size in (1, 2, 3, 4, len(QUERIES)):
            for lo in range(0, len(order), size):
                ids = order[lo : lo + size]
                batch = [Pending([("query", QUERIES[i])], 0, n) for n, i in enumerate(ids)]
                for i, answer in zip(ids, service._run_batch(batch), strict=True):
                    assert isinstance(answer, np.ndarray)
                    assert np.array_equal(answer[0], alone[i]), (size, QUERIES[i])


def test_concurrent_callers_get_their_own_vectors(service: EmbeddingService) -> None:
    alone = np.stack([service.embed([q], "query")[0] for q in QUERIES])
    passages = service.embed(QUERIES, "passage")
    got: dict[int, np.ndarray] = {}
    start = threading.Barrier(len(QUERIES) + 1)

    def caller(i: int) -> None:
        start.wait(WAIT)
        got[i] = service.embed([QUERIES[i]], "query")[0]

    def passage_caller() -> None:
        start.wait(WAIT)
        got[-1] = service.embed(QUERIES, "passage")

    threads = [threading.Thread(target=caller, args=(i,)) for i in range(len(QUERIES))] + [threading.Thread(target=passage_caller)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
    np.testing.assert_allclose(np.stack([got[i] for i in range(len(QUERIES))]), alone, atol=1e-5)
    np.testing.assert_allclose(got[-1], passages, atol=1e-5)


def test_a_user_query_is_called_back_and_dropped_once_past_its_deadline(service: EmbeddingService) -> None:
    outcomes: list[tuple[object, BaseException | None]] = []
    done = threading.Semaphore(0)

    def on_done(vectors: object, error: BaseException | None) -> None:
        outcomes.append((vectors, error))
        done.release()

    service.embed_for_user([QUERIES[1]], on_done, expires=time.monotonic() + 3600)
    service.embed_for_user([QUERIES[1]], on_done, expires=time.monotonic() - 1)  # the answer already went out
    assert done.acquire(timeout=WAIT) and done.acquire(timeout=WAIT)
    answered = next(v for v, e in outcomes if e is None)
    np.testing.assert_allclose(answered, service.embed([QUERIES[1]], "query"), atol=1e-5)  # type: ignore[arg-type]
    assert [type(e) for v, e in outcomes if e is not None] == [RequestExpired]
    assert service.is_ready


class MeetingBackend:
    """A model backend whose first two calls must both be running before either goes on:
    they meet at a barrier, which breaks (and fails the call) unless two model calls run
    at the same time."""

    def __init__(self, inner: Backend) -> None:
        self._inner = inner
        self.kind = inner.kind
        self.batch_invariant = inner.batch_invariant
        self.meeting = threading.Barrier(2)
        self.first_entered = threading.Event()
        self._calls = 0
        self._lock = threading.Lock()

    def infer(self, texts: list[str]) -> np.ndarray:
        with self._lock:
            self._calls += 1
            meets = self._calls <= 2
        if meets:
            self.first_entered.set()
            self.meeting.wait(MEET_WAIT)
        return self._inner.infer(texts)


def test_with_the_default_settings_two_users_queries_run_their_model_calls_at_once() -> None:
    # e5 alone keeps the test light; the inference threads are the defaults.
    service = _service("e5")
    try:
        alone = [service.embed([q], "query")[0] for q in QUERIES[:2]]
        meeting = MeetingBackend(service._slots[0].backend)
        service._slots = (replace(service._slots[0], backend=meeting),)
        got: dict[int, np.ndarray] = {}
        failed: list[BaseException] = []
        done = threading.Semaphore(0)

        def answer(i: int) -> QueryDone:
            def on_done(vectors: np.ndarray | None, error: BaseException | None) -> None:
                if vectors is not None:
                    got[i] = vectors[0]
                if error is not None:
                    failed.append(error)
                done.release()

            return on_done

        service.embed_for_user([QUERIES[0]], answer(0))
        # The second query is queued only once the first runs, so the two cannot share a batch.
        assert meeting.first_entered.wait(WAIT)
        service.embed_for_user([QUERIES[1]], answer(1))
        assert done.acquire(timeout=WAIT) and done.acquire(timeout=WAIT)
        assert not failed, failed
        for i in range(2):
            np.testing.assert_allclose(got[i], alone[i], atol=1e-5)
    finally:
        service.close()


# -- a real server ------------------------------------------------------------------------

NAME = "Mochi"
FACT = "Master has a grey cat called Kuro who sleeps on the windowsill"
CONCURRENT = 12
# Japanese, no word in common with the fact: only the vector leg can find it.
QUERY = "猫の名前は何ですか"


def test_concurrent_queries_all_answer_from_the_vector_leg(tmp_path: Path) -> None:
    if not (ROOT / BUILTIN_MODELS["use"] / "model.onnx").is_file():
        pytest.skip("model use not installed; run scripts/fetch_model.py")
    # A deadline far beyond any run, so an answer without the fact means no vector leg.
    settings = make_settings(tmp_path, embedding_model="use", recall_query_embed_timeout_seconds=300.0)
    embeddings = EmbeddingService(settings.embeddings, project_root=ROOT)
    with LiveServer(settings, embeddings=embeddings) as srv:
        embeddings.start()
        assert embeddings.wait_ready(LOAD_TIMEOUT), embeddings.reason
        assert srv.post(f"/api/characters/{NAME}/facts", json={"facts": [{"text": FACT}]}).status_code == 200
        lexical = make_settings(tmp_path / "bm25", embedding_enabled=False)
        # The same fact with embeddings off is not found by the query (no shared word).
        with LiveServer(lexical) as plain:
            assert plain.post(f"/api/characters/{NAME}/facts", json={"facts": [{"text": FACT}]}).status_code == 200
            assert plain.post(f"/query_memory/{NAME}", json={"query": QUERY}).json()["results"] == []
        _wait_vectors(srv.url)
        answers: list[dict[str, object]] = []
        start = threading.Barrier(CONCURRENT)

        def ask() -> None:
            start.wait(WAIT)
            with httpx.Client(base_url=srv.url, timeout=WAIT) as client:
                answers.append(client.post(f"/query_memory/{NAME}", json={"query": QUERY}).json())

        threads = [threading.Thread(target=ask) for _ in range(CONCURRENT)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT)
    assert len(answers) == CONCURRENT
    for body in answers:
        assert "error_code" not in body
        assert [r["text"] for r in body["results"]] == [FACT]  # type: ignore[union-attr,index]
    embeddings.close()


def _wait_vectors(url: str) -> None:
    """Poll /health (bounded) until the fact has its vector."""
    deadline = time.monotonic() + WAIT
    with httpx.Client(base_url=url, timeout=WAIT) as client:
        client.post(f"/query_memory/{NAME}", json={"query": "warm up"})
        while time.monotonic() < deadline:
            emb = client.get("/health").json()["embeddings"]
            if emb["state"] == "ready" and not emb["pending"]:
                return
            time.sleep(0.05)
    raise AssertionError("the fact never got its vector")
