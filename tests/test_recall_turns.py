"""Issue 36 item 1: turns that no long-term memory covers stay recall candidates beside the
facts (tier ``turn``), on real servers: without a model, with the loopback fake model
mining them (covered turns leave recall, a failed extraction's turn stays, across a
restart), and never for a query scoped to subjects."""

from __future__ import annotations

from tests.support.fake_llm import FakeLLM, last_user_text
from tests.support.live import LiveServer, make_settings
from tests.support.waiting import quiesce, wait_for

NAME = "Lan"
GROUP = {"subject_kind": "group_chat", "subject_id": "qq:123456"}


def say(srv: LiveServer, *texts: str) -> None:
    history = [{"role": "user", "content": text} for text in texts]
    r = srv.post(f"/cache/{NAME}", json={"input_history": history})
    assert r.status_code == 200, r.text


def recall(srv: LiveServer, query: str, **extra: object) -> list[dict]:
    body = srv.post(f"/query_memory/{NAME}", json={"query": query, **extra}).json()
    assert "error_code" not in body, body
    return body["results"]


def test_a_turn_stays_findable_after_the_first_fact_without_any_model(tmp_path):
    with LiveServer(make_settings(tmp_path, embedding_enabled=False)) as srv:
        say(srv, "writer turn 3 about kite number 3")
        assert [r["text"] for r in recall(srv, "kite number 3")] == ["writer turn 3 about kite number 3"]
        r = srv.post(f"/api/characters/{NAME}/facts", json={"facts": [{"text": "Master plays the cello"}]})
        assert r.status_code == 200, r.text

        rows = recall(srv, "kite number 3")
        assert [r["text"] for r in rows] == ["writer turn 3 about kite number 3"]
        row = rows[0]
        assert row["tier"] == "turn" and row["entity"] == "master" and row["id"].startswith("turn_")
        assert row["created_at"] and row["event_start_at"] == row["created_at"]
        assert isinstance(row["session_id"], str) and row["session_id"]
        # The fact and the turn are candidates side by side.
        cello = recall(srv, "cello")
        assert [r["tier"] for r in cello] == ["fact"]


def test_a_scoped_query_never_sees_the_owner_turns(tmp_path):
    with LiveServer(make_settings(tmp_path, embedding_enabled=False)) as srv:
        say(srv, "my private diary says the kite is red")
        r = srv.post(f"/api/characters/{NAME}/facts", json={"facts": [{"text": "Master plays the cello"}]})
        assert r.status_code == 200, r.text
        assert [r["tier"] for r in recall(srv, "kite red")] == ["turn"]
        assert recall(srv, "kite red", subjects=[GROUP]) == []


def test_the_turn_leg_can_be_turned_off(tmp_path):
    with LiveServer(make_settings(tmp_path, embedding_enabled=False, recall_uncovered_turns=0)) as srv:
        say(srv, "writer turn 3 about kite number 3")
        srv.post(f"/api/characters/{NAME}/facts", json={"facts": [{"text": "Master plays the cello"}]}).raise_for_status()
        assert recall(srv, "kite number 3") == []


def cats_or_fail(request: dict) -> dict:
    """One fact per cat named; a conversation about a kite fails (HTTP 500)."""
    text = last_user_text(request)
    if "kite" in text:
        raise RuntimeError("scripted extraction failure")
    if "cat named Pixel" in text:
        return {"facts": [{"text": "Master has a cat named Pixel", "importance": 6, "entity": "master"}]}
    return {"facts": []}


def test_mined_turns_leave_recall_and_an_unmined_one_stays_across_a_restart(tmp_path, fake_llm: FakeLLM):
    fake_llm.on("extract_facts", cats_or_fail)
    settings = make_settings(
        tmp_path,
        embedding_enabled=False,
        powerful_memory_default=False,  # each record is extracted on its own, at once
        llm_base_url=fake_llm.base_url,
        llm_model="fake",
    )
    with LiveServer(settings) as srv:
        say(srv, "I just adopted a cat named Pixel")
        say(srv, "Pixel the cat sleeps on my red kite")
        wait_for(lambda: len(fake_llm.calls("extract_facts")) >= 2, what="both records offered to the model")
        quiesce(srv.runtime, NAME)
        rows = recall(srv, "cat Pixel")
        by_tier = {(r["tier"], r["text"]) for r in rows}
        assert ("fact", "Master has a cat named Pixel") in by_tier
        # The first turn is covered by the fact learned from it; the second's extraction failed.
        assert ("turn", "I just adopted a cat named Pixel") not in by_tier
        assert ("turn", "Pixel the cat sleeps on my red kite") in by_tier

    with LiveServer(settings) as srv:  # coverage is durable
        rows = recall(srv, "cat Pixel")
        assert all(r["text"] != "I just adopted a cat named Pixel" for r in rows if r["tier"] == "turn")
        assert ("turn", "Pixel the cat sleeps on my red kite") in {(r["tier"], r["text"]) for r in rows}


def test_a_forgotten_turn_leaves_recall(tmp_path):
    with LiveServer(make_settings(tmp_path, embedding_enabled=False)) as srv:
        say(srv, "the secret kite code is KITE42")
        srv.post(f"/api/characters/{NAME}/facts", json={"facts": [{"text": "Master plays the cello"}]}).raise_for_status()
        [row] = recall(srv, "KITE42")
        assert row["tier"] == "turn"
        row_id = row["id"].removeprefix("turn_")
        r = srv.delete(f"/api/characters/{NAME}/turns/{row_id}")
        assert r.status_code == 200, r.text
        assert recall(srv, "KITE42") == []
