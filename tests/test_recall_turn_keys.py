"""Issue 36: covered turns as more keys of the facts learnt from them (recall_turn_keys,
LongMemEval's key expansion), on a real server: a fact whose own words miss the query is
found through the turn it came from, only with the setting on, never as a turn row, and
never for a query scoped to subjects."""

from __future__ import annotations

import pytest

from nekomem.actors.messages import TurnsMined
from nekomem.stores.timeindex_read import TimeIndexReader
from tests.support.live import LiveServer, make_settings
from tests.support.waiting import wait_for

NAME = "Lan"
GROUP = {"subject_kind": "group_chat", "subject_id": "qq:123456"}
T1, T2 = "2026-11-02T10:00:00+00:00", "2026-11-03T10:00:00+00:00"
KITTEN = "Yesterday I adopted a tiny kitten from the shelter and named her Pixel"


def recall(srv: LiveServer, query: str, **extra: object) -> list[dict]:
    body = srv.post(f"/query_memory/{NAME}", json={"query": query, **extra}).json()
    assert "error_code" not in body, body
    return body["results"]


def mined_top(srv: LiveServer, tmp_path) -> int:
    path = next(tmp_path.rglob("time_indexed.db"))
    with TimeIndexReader.read_only(path) as reader:
        ranges = reader.mined_ranges() or []
        return ranges[-1][1] if ranges else 0


@pytest.mark.parametrize("keys", [True, False], ids=["keys-on", "keys-off"])
def test_a_fact_is_found_through_the_turn_it_was_learnt_from(tmp_path, keys: bool):
    with LiveServer(make_settings(tmp_path, embedding_enabled=False, recall_turn_keys=keys)) as srv:
        for text, stamp in ((KITTEN, T1), ("It rained all afternoon here", T2)):
            srv.post(f"/cache/{NAME}", json={"input_history": [{"role": "user", "content": text, "timestamp": stamp}]}).raise_for_status()
        # An extraction over both turns finished (what FactActor reports): they are covered.
        srv.runtime.registry.tell(NAME, "recent", TurnsMined(ranges=[(1, 2)]))
        wait_for(lambda: mined_top(srv, tmp_path) >= 2, what="the turns marked covered")
        facts = [
            {"text": "Master has a new pet", "source": {"kind": "turns", "from": T1, "to": T1}},
            {"text": "Master likes rainy weather", "source": {"kind": "turns", "from": T2, "to": T2}},
        ]
        srv.post(f"/api/characters/{NAME}/facts", json={"facts": facts}).raise_for_status()

        rows = recall(srv, "kitten Pixel")
        if keys:
            assert [(r["tier"], r["text"]) for r in rows] == [("fact", "Master has a new pet")]
            assert recall(srv, "kitten Pixel", subjects=[GROUP]) == []
        else:
            assert rows == []  # the fact's own words miss; the covered turn is no row
        assert [r["text"] for r in recall(srv, "rainy")] == ["Master likes rainy weather"]
