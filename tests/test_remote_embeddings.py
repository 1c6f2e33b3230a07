"""Issue 36 item 3: the user's own embedding model behind an OpenAI-compatible
/v1/embeddings endpoint (embedding_model = remote), against a scripted loopback server:
its vectors are a recall leg (a query finds a fact it shares no word with), texts go in
batches, its width is learnt from the first answer, switching models re-embeds, and a
stopped or hanging endpoint degrades recall to BM25 (shown in /health) and recovers."""

from __future__ import annotations

from nekomem.models.embeddings import EmbeddingService
from tests.support.fake_embeddings import FakeEmbeddings
from tests.support.live import LiveServer, make_settings
from tests.support.waiting import wait_for

NAME = "Lan"
FACTS = ["Master has a kitten named Pixel", "Master plays the cello on Sundays", "Master flies a red kite at the beach"]


def remote_settings(tmp_path, fake: FakeEmbeddings, model: str = "fake-embed", **extra: object):
    values: dict[str, object] = {
        "embedding_model": "remote",
        "embedding_remote_base_url": fake.base_url,
        "embedding_remote_model": model,
        "embedding_remote_batch_size": 2,
        "embedding_remote_retry_seconds": 0.2,
        "recall_cosine_threshold": 0.2,
        "recall_backfill_retry_seconds": 0.2,
    }
    return make_settings(tmp_path, **{**values, **extra})


def recall(srv: LiveServer, query: str) -> list[str]:
    body = srv.post(f"/query_memory/{NAME}", json={"query": query}).json()
    assert "error_code" not in body, body
    return [row["text"] for row in body["results"]]


def embedded_texts(fake: FakeEmbeddings, model: str) -> list[str]:
    return [t for c in fake.calls("/v1/embeddings") if c["body"]["model"] == model for t in c["body"]["input"]]


def test_the_remote_endpoint_is_a_vector_leg_and_a_failing_one_degrades_to_bm25(tmp_path):
    with FakeEmbeddings(dim=16) as fake:
        settings = remote_settings(tmp_path, fake)
        with LiveServer(settings, embeddings=EmbeddingService(settings.embeddings)) as srv:
            r = srv.post(f"/api/characters/{NAME}/facts", json={"facts": [{"text": t} for t in FACTS]})
            assert r.status_code == 200, r.text
            srv.wait_vectors(NAME)
            health = srv.get("/health").json()["embeddings"]
            assert health["state"] == "ready" and health["model"].startswith("remote-fake-embed-16d-"), health
            # Batched: three facts in requests of at most two texts, every one sent.
            sizes = [len(c["body"]["input"]) for c in fake.calls("/v1/embeddings")]
            assert max(sizes) == 2 and set(FACTS) <= set(embedded_texts(fake, "fake-embed"))
            # "feline" shares no word with the kitten fact: only the remote vectors find it.
            assert recall(srv, "feline")[:1] == [FACTS[0]]

            fake.stop()  # mid-run
            assert recall(srv, "feline") == []  # answered, from BM25 alone
            assert recall(srv, "cello")[:1] == [FACTS[1]]
            assert "error" in srv.get("/health").json()["embeddings"]

            fake.hang()
            fake.start()  # the same port again, every request waiting
            assert recall(srv, "cello")[:1] == [FACTS[1]]  # the query's embedding deadline passes
            fake.release()

            srv.post(f"/api/characters/{NAME}/facts", json={"facts": [{"text": "Master's kitty sleeps all day"}]}).raise_for_status()
            srv.wait_vectors(NAME)
            wait_for(lambda: "error" not in srv.get("/health").json()["embeddings"], what="the endpoint's error to clear")
            assert set(recall(srv, "feline")[:2]) == {FACTS[0], "Master's kitty sleeps all day"}


def test_an_endpoint_down_at_start_is_tried_again_and_another_model_re_embeds(tmp_path):
    fake = FakeEmbeddings(dim=16)
    fake.start()
    port_url = fake.base_url
    fake.stop()
    try:
        settings = remote_settings(tmp_path, fake)
        assert settings.embeddings.embedding_remote_base_url == port_url
        with LiveServer(settings, embeddings=EmbeddingService(settings.embeddings)) as srv:
            srv.post(f"/api/characters/{NAME}/facts", json={"facts": [{"text": t} for t in FACTS]}).raise_for_status()
            assert recall(srv, "cello")[:1] == [FACTS[1]]  # no model yet: BM25
            # The first attempt runs on the service's own thread: its failure is shown once
            # it has happened (on a busy machine, after the query above).
            wait_for(lambda: "error" in srv.get("/health").json()["embeddings"], what="the endpoint's failure shown")
            health = srv.get("/health").json()["embeddings"]
            assert health["state"] == "loading" and "error" in health, health
            fake.start()
            wait_for(lambda: srv.get("/health").json()["embeddings"]["state"] == "ready", what="the endpoint's width learnt")
            srv.wait_vectors(NAME)
            assert recall(srv, "feline")[:1] == [FACTS[0]]

        other = remote_settings(tmp_path, fake, model="fake-embed-2")
        with LiveServer(other, embeddings=EmbeddingService(other.embeddings)) as srv:
            srv.get(f"/api/characters/{NAME}/facts").raise_for_status()  # activates the character
            wait_for(lambda: set(FACTS) <= set(embedded_texts(fake, "fake-embed-2")), what="the facts re-embedded by the new model")
            srv.wait_vectors(NAME)
            assert srv.get("/health").json()["embeddings"]["model"].startswith("remote-fake-embed-2-16d-")
            assert recall(srv, "feline")[:1] == [FACTS[0]]
    finally:
        fake.release()
        fake.stop()


def test_remote_needs_an_endpoint_and_a_model(tmp_path):
    import pytest

    from nekomem.config import SettingsError

    with pytest.raises(SettingsError, match="embedding_remote_base_url"):
        make_settings(tmp_path, embedding_model="remote")


def test_uncovered_turns_get_a_vector_leg(tmp_path):
    with FakeEmbeddings(dim=16) as fake:
        settings = remote_settings(tmp_path, fake)
        with LiveServer(settings, embeddings=EmbeddingService(settings.embeddings)) as srv:
            history = [{"role": "user", "content": "Yesterday I adopted a tiny kitten from the shelter"}]
            srv.post(f"/cache/{NAME}", json={"input_history": history}).raise_for_status()
            srv.post(f"/api/characters/{NAME}/facts", json={"facts": [{"text": FACTS[1]}]}).raise_for_status()
            recall(srv, "warm-up")  # the first query indexes the uncovered turns; their vectors follow
            srv.wait_vectors(NAME)
            assert history[0]["content"] in embedded_texts(fake, "fake-embed")
            body = srv.post(f"/query_memory/{NAME}", json={"query": "feline"}).json()
            assert [(r["tier"], r["text"]) for r in body["results"]][:1] == [("turn", history[0]["content"])]


def explain(srv: LiveServer, query: str) -> dict[str, list[str]]:
    """The playground's vector legs for ``query``: model name -> the texts it found."""
    body = srv.post(f"/api/browse/{NAME}/recall_explain", json={"query": query}).json()
    return {leg["model"]: [hit["text"] for hit in leg["hits"]] for leg in body["vector_legs"]}


def test_the_endpoint_as_a_leg_beside_a_bundled_model_degrades_to_the_other_leg(tmp_path):
    """embedding_model = e5+remote: the endpoint's vectors are one more leg beside the
    bundled e5's (one cached vector per entry under one model id naming both); stopped or
    hanging, every query still answers within its deadline from the e5 leg."""
    with FakeEmbeddings(dim=16) as fake:
        settings = remote_settings(
            tmp_path,
            fake,
            embedding_model="e5+remote",
            embedding_remote_timeout_seconds=2.0,
            recall_query_embed_timeout_seconds=5.0,  # the loaded test machine's e5 gets time
        )
        with LiveServer(settings, embeddings=EmbeddingService(settings.embeddings)) as srv:
            srv.post(f"/api/characters/{NAME}/facts", json={"facts": [{"text": t} for t in FACTS]}).raise_for_status()
            srv.wait_vectors(NAME)
            health = srv.get("/health").json()["embeddings"]
            assert health["state"] == "ready" and health["model"].startswith("multilingual-e5-small-q4+remote-fake-embed-400d-"), health
            assert set(FACTS) <= set(embedded_texts(fake, "fake-embed"))
            # The bundled model's texts keep its own prefixes; the endpoint gets none here.
            assert not any(t.startswith(("query: ", "passage: ")) for t in embedded_texts(fake, "fake-embed"))
            legs = explain(srv, "feline")
            assert list(legs) == ["multilingual-e5-small", "remote"], legs
            assert legs["remote"][:1] == [FACTS[0]]
            close = "Master plays the cello on Sunday"
            assert FACTS[1] in explain(srv, close)["multilingual-e5-small"]

            fake.stop()  # mid-run: the e5 leg still answers, the endpoint's finds nothing
            legs = explain(srv, close)
            assert legs["remote"] == [] and FACTS[1] in legs["multilingual-e5-small"], legs
            assert recall(srv, close)[:1] == [FACTS[1]]
            health = srv.get("/health").json()["embeddings"]
            assert health["state"] == "ready" and "error" in health, health

            fake.hang()
            fake.start()  # every request waits: the query gives up on it before its deadline
            legs = explain(srv, close)
            assert legs["remote"] == [] and FACTS[1] in legs["multilingual-e5-small"], legs
            fake.release()
            srv.post(f"/api/characters/{NAME}/facts", json={"facts": [{"text": "Master's kitty sleeps all day"}]}).raise_for_status()
            srv.wait_vectors(NAME)
            wait_for(lambda: "error" not in srv.get("/health").json()["embeddings"], what="the endpoint's error to clear")
            assert set(explain(srv, "feline")["remote"][:2]) == {FACTS[0], "Master's kitty sleeps all day"}


def test_beside_a_bundled_model_the_profiles_leave_the_shared_thresholds_to_the_settings():
    """e5's profile would set recall_cosine_threshold 0.8 for e5 alone; beside the endpoint
    that setting is the endpoint leg's (e5's leg keeps its profile's own), and the whole-
    vector dedup thresholds, a mean over models no profile knows, stay the settings'."""
    from nekomem.config.embeddings import model_dirs, profile_settings

    assert profile_settings("e5", "")["recall_cosine_threshold"] == 0.8
    assert profile_settings("e5+remote", "") == {}
    assert [d.name for d in model_dirs("use+e5+remote", "")] == ["use-multilingual-v3", "multilingual-e5-small"]
    assert model_dirs("remote", "") == []
