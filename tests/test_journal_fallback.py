"""Beyond the reference (issue 27 item 2): without any long-term entry, /query_memory
searches the raw journal, so a server without a model still finds what was said; once a
fact exists, recall is the reference's again."""

from __future__ import annotations

from tests.support.live import LiveServer, make_settings

NAME = "Lan"


def test_without_long_term_entries_recall_finds_the_turns_and_stops_once_a_fact_exists(tmp_path):
    settings = make_settings(tmp_path, embedding_enabled=False)  # and no model at all
    with LiveServer(settings) as srv:
        body = {
            "input_history": [
                {"role": "user", "content": "I just adopted a cat named Pixel"},
                {"role": "assistant", "content": "Welcome home, Pixel!"},
                {"role": "user", "content": "The weather is grey today"},
            ]
        }
        assert srv.post(f"/cache/{NAME}", json=body).status_code == 200
        answer = srv.post(f"/query_memory/{NAME}", json={"query": "the cat I adopted"}).json()
        assert answer["results"], answer
        top = answer["results"][0]
        assert top["tier"] == "journal" and "Pixel" in top["text"] and top["entity"] == "master"
        assert all("grey" not in row["text"] for row in answer["results"])

        assert srv.post(f"/api/characters/{NAME}/facts", json={"facts": [{"text": "Master likes tea"}]}).status_code == 200
        # From the first fact on, the turn no memory covers is a row of tier "turn" (issue 36).
        rows = srv.post(f"/query_memory/{NAME}", json={"query": "the cat I adopted"}).json()["results"]
        assert all(row["tier"] != "journal" for row in rows)
        assert [row["tier"] for row in rows if "Pixel" in row["text"]] == ["turn"]


def test_the_fallback_can_be_turned_off(tmp_path):
    settings = make_settings(tmp_path, embedding_enabled=False, recall_journal_fallback_rows=0, recall_uncovered_turns=0)
    with LiveServer(settings) as srv:
        body = {"input_history": [{"role": "user", "content": "I just adopted a cat named Pixel"}]}
        assert srv.post(f"/cache/{NAME}", json=body).status_code == 200
        assert srv.post(f"/query_memory/{NAME}", json={"query": "cat Pixel"}).json()["results"] == []
