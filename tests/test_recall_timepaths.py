"""The time paths of /query_memory over real HTTP on a fixed clock: time only (nearest the
window), query + time (never an entry outside the window), natural expressions in three
languages, the display time zone, and a time named inside the query. BM25 only (no model
needed): the time logic does not depend on the vector leg."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from nekomem.recall.timewindow import parse_time_window
from nekomem.runtime.clock import ManualClock
from tests.support.live import LiveServer, make_settings

NAME = "Lan"
NOW = datetime(2026, 3, 10, 12, 0, tzinfo=timezone.utc)  # a Tuesday
FACTS = [
    ("Master ate sushi with friends", "2026-03-09T19:00:00+00:00", None),
    ("Master ate ramen alone", "2026-03-03T12:00:00+00:00", None),
    ("Master ate pizza at home", "2026-02-10T19:00:00+00:00", None),
    ("Master went hiking in the mountains", "2026-02-11T08:00:00+00:00", None),
    ("Master ate curry at a street stall", "2026-01-15T10:00:00+00:00", "2026-01-17T10:00:00+00:00"),
    ("Master ate tacos on Christmas Eve", "2025-12-24T19:00:00+00:00", None),
    ("Master visited the dentist", "2026-03-10T09:00:00+00:00", None),
]


def server(tmp_path: Path, **overrides: Any) -> LiveServer:
    settings = make_settings(tmp_path, embedding_enabled=False, display_timezone=overrides.pop("tz", "UTC"), **overrides)
    return LiveServer(settings, clock=ManualClock(NOW))


def load(srv: LiveServer) -> None:
    facts = [{"text": t, "event_start_at": s, "event_end_at": e} for t, s, e in FACTS]
    r = srv.post(f"/api/characters/{NAME}/facts", json={"facts": facts})
    assert r.status_code == 200 and len(r.json()["added"]) == len(FACTS), r.text


def ask(srv: LiveServer, **body: Any) -> dict[str, Any]:
    r = srv.post(f"/query_memory/{NAME}", json=body)
    assert r.status_code == 200, r.text
    assert "error_code" not in r.json()
    return r.json()


def texts(body: dict[str, Any]) -> list[str]:
    return [r["text"] for r in body["results"]]


def inside(row: dict[str, Any], spec: str, now: datetime) -> bool:
    window = parse_time_window(spec, now)
    assert window is not None
    start = datetime.fromisoformat(row["event_start_at"])
    end = datetime.fromisoformat(row["event_end_at"]) if row["event_end_at"] else start
    return window.overlaps(start, end)


def test_time_only_returns_the_entries_nearest_the_window(tmp_path: Path) -> None:
    with server(tmp_path, recall_time_budget=3) as srv:
        load(srv)
        body = ask(srv, time="2026-02-10")
        # Inside first, then the nearest: hiking starts 8 h after the window, ramen 20 days after,
        # curry ended 24 days before.
        assert texts(body) == ["Master ate pizza at home", "Master went hiking in the mountains", "Master ate ramen alone"]
        assert all(r["score"] is None for r in body["results"])
        assert body["query"] == "" and body["time"] == "2026-02-10" and body["candidates_total"] == len(FACTS)
        assert texts(ask(srv, time="2026-03-01/2026-03-31"))[:3] == [
            "Master visited the dentist",
            "Master ate sushi with friends",
            "Master ate ramen alone",
        ]  # later first
        assert texts(ask(srv, time="2026-01-16"))[0] == "Master ate curry at a street stall"  # a range event overlaps


def test_query_and_time_never_return_an_entry_outside_the_window(tmp_path: Path) -> None:
    with server(tmp_path) as srv:
        load(srv)
        for spec, expected in [
            ("2026-02", ["Master ate pizza at home"]),
            ("2026-01-16", ["Master ate curry at a street stall"]),
            ("2025", ["Master ate tacos on Christmas Eve"]),
            ("2026-03-09T19", ["Master ate sushi with friends"]),
            ("2026-03-01..2026-03-05", ["Master ate ramen alone"]),
            ("2024", []),
        ]:
            body = ask(srv, query="Master ate", time=spec)
            assert texts(body) == expected, spec
            assert all(inside(r, spec, NOW) for r in body["results"])
        body = ask(srv, query="hiking mountains", time="2026-03")
        assert body["results"] == [] and body["candidates_total"] == 3  # the window's pool, not the store
        # An unparsable time is ignored: the query is searched over everything.
        assert texts(ask(srv, query="tacos", time="whenever it was")) == ["Master ate tacos on Christmas Eve"]


def test_natural_expressions_on_a_fixed_clock(tmp_path: Path) -> None:
    sushi, ramen, pizza, hiking = (f[0] for f in FACTS[:4])
    with server(tmp_path) as srv:
        load(srv)
        cases = [
            ("yesterday", "ate", [sushi]),
            ("昨日", "ate", [sushi]),
            ("昨天", "ate", [sushi]),
            ("last night", "friends", [sushi]),
            ("last week", "ate", [ramen]),
            ("先週", "ramen", [ramen]),
            ("上周", "ate", [ramen]),
            ("last month", "mountains pizza", [pizza, hiking]),
            ("this morning", "dentist", ["Master visited the dentist"]),
            ("去年", "tacos", ["Master ate tacos on Christmas Eve"]),
            ("3日前", "ate", []),
        ]
        for spec, query, expected in cases:
            body = ask(srv, time=spec)
            assert sorted(r["text"] for r in body["results"] if inside(r, spec, NOW)) == sorted(expected), spec
            assert sorted(texts(body)[: len(expected)]) == sorted(expected), spec  # inside ranks first
            assert sorted(texts(ask(srv, query=query, time=spec))) == sorted(expected), spec


def test_the_display_time_zone_decides_what_yesterday_is(tmp_path: Path) -> None:
    # 12:00 UTC is 21:00 in Tokyo; the sushi (19:00 UTC on the 9th) was at 04:00 on the 10th there.
    with server(tmp_path, tz="Asia/Tokyo") as srv:
        load(srv)
        assert "Master ate sushi with friends" not in texts(ask(srv, query="Master ate", time="yesterday"))
        assert sorted(texts(ask(srv, query="ate visited", time="today"))) == ["Master ate sushi with friends", "Master visited the dentist"]


def test_a_time_inside_the_query_ranks_that_time_first(tmp_path: Path) -> None:
    with server(tmp_path) as srv:
        load(srv)
        srv.post(
            f"/api/characters/{NAME}/facts",
            json={"facts": [{"text": "Master ate pizza at a birthday party", "event_start_at": "2026-03-09T20:00:00+00:00"}]},
        ).raise_for_status()
        assert texts(ask(srv, query="what pizza did Master eat yesterday?"))[0] == "Master ate pizza at a birthday party"
        assert texts(ask(srv, query="pizza on 2026-02-10"))[0] == "Master ate pizza at home"
        assert texts(ask(srv, query="pizza in February 2026"))[0] == "Master ate pizza at home"
        # A soft preference, not a filter: entries outside that time are still found.
        assert "Master ate tacos on Christmas Eve" in texts(ask(srv, query="tacos yesterday"))
        # The clock moves: "yesterday" follows it.
        srv.runtime.clock.advance(days=1)
        assert parse_time_window("yesterday", NOW + timedelta(days=1)).start.day == 10
        assert texts(ask(srv, query="ate visited", time="yesterday")) == ["Master visited the dentist"]
