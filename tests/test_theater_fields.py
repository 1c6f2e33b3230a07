"""A theater capsule's free-form metadata cannot take a character out of service.

Before: a capsule whose ``metadata.performed_at`` was not an ISO time (an epoch number,
``2026/12/06``, a list) answered 500 and crashed the recent actor; six such posts in a
minute marked the layer failed, and every /cache and /new_dialog of the character then
answered 503 ``character_failed`` until a restart."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.live import LiveServer, make_settings
from tests.test_neko_theater import NAME, archive_body, capsule, theater_recent, theater_rows


def supervision(srv: LiveServer) -> dict:
    return srv.get("/health").json()["supervision"]


@pytest.mark.parametrize(
    ("performed_at", "stored", "row_time"),
    [
        (1733443200, "2024-12-06T00:00:00+00:00", "2024-12-06T00:00:00.000000+00:00"),
        (1733443200123, "2024-12-06T00:00:00.123000+00:00", "2024-12-06T00:00:00.123000+00:00"),
        ("2026/12/06", "2026-12-06T00:00:00", "2026-12-06T00:00:00.000000+00:00"),
        ("2026/12/06 21:30", "2026-12-06T21:30:00", "2026-12-06T21:30:00.000000+00:00"),
        ("2026-05-01T21:30:00+09:00", "2026-05-01T21:30:00+09:00", "2026-05-01T12:30:00.000000+00:00"),
    ],
)
def test_a_performed_at_the_theater_can_mean_is_converted(tmp_path: Path, performed_at, stored, row_time) -> None:
    root = tmp_path / "memory"
    with LiveServer(make_settings(root)) as srv:
        r = srv.post(
            f"/cache/{NAME}", json=archive_body(capsule("rain", "s1", "We sheltered from the rain.", performed_at=performed_at), "a-1")
        )
        assert r.status_code == 200, r.text
        assert r.json() == {"status": "cached", "count": 1}
        assert theater_recent(root)[0]["data"]["metadata"]["performed_at"] == stored
        assert [ts for _sid, _m, ts in theater_rows(root)] == [row_time]
        assert supervision(srv)["handler_errors"] == 0


@pytest.mark.parametrize("performed_at", [["2026-12-06"], {"at": 1}, True, "yesterday", "2026/13/45", 1e300, "0001-01-01T00:00:00+05:00"])
def test_a_performed_at_that_is_no_time_is_kept_and_journaled_without_one(tmp_path: Path, performed_at) -> None:
    """As the reference does (it reads performed_at only as an ISO string, and stores the
    capsule anyway): stored as sent, with no time in the journal."""
    root = tmp_path / "memory"
    with LiveServer(make_settings(root)) as srv:
        r = srv.post(f"/cache/{NAME}", json=archive_body(capsule("rain", "s1", "We sheltered.", performed_at=performed_at), "a-1"))
        assert r.status_code == 200, r.text
        assert theater_recent(root)[0]["data"]["metadata"]["performed_at"] == performed_at
        assert [ts for _sid, _m, ts in theater_rows(root)] == [None]
        assert supervision(srv) == {"child_restarts": 0, "failed_children": 0, "handler_errors": 0}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("ending_titles_seen", 7),
        ("ending_titles_seen", [["nested"]]),
        ("story_id", ["rain"]),
        ("archive_through_revision", "5"),
        ("run_index", -1),
        ("story_title", {"x": 1}),
    ],
)
def test_an_unreadable_theater_field_answers_422_naming_it(tmp_path: Path, field, value) -> None:
    root = tmp_path / "memory"
    with LiveServer(make_settings(root)) as srv:
        assert srv.post(f"/cache/{NAME}", json=archive_body(capsule("rain", "s1", "kept"), "a-1")).status_code == 200
        message = capsule("rain", "s2", "refused")
        message["metadata"][field] = value
        r = srv.post(f"/cache/{NAME}", json=archive_body(message, "a-2"))
        assert r.status_code == 422, r.text
        body = r.json()
        assert body["error_code"] == "bad_theater_metadata" and f"input_history[0].metadata.{field}" in body["message"]
        # Nothing stored, nothing lost, the layer untouched.
        assert [m["data"]["metadata"]["session_id"] for m in theater_recent(root)] == ["s1"]
        assert supervision(srv) == {"child_restarts": 0, "failed_children": 0, "handler_errors": 0}


def test_odd_performed_at_posts_leave_the_character_serving(tmp_path: Path) -> None:
    """The issue's probe: six posts in a minute, then /cache and /new_dialog."""
    root = tmp_path / "memory"
    with LiveServer(make_settings(root)) as srv:
        for i, value in enumerate([1733443200, "2026/12/06", ["x"], 1733443200, "2026/12/06", ["x"]]):
            r = srv.post(f"/cache/{NAME}", json=archive_body(capsule("rain", f"s{i}", f"episode {i}", performed_at=value), f"a-{i}"))
            assert r.status_code == 200, r.text
        assert srv.post(f"/cache/{NAME}", json={"input_history": [{"role": "user", "content": "still here"}]}).status_code == 200
        r = srv.get(f"/new_dialog/{NAME}")
        assert r.status_code == 200 and "still here" in r.text
        assert supervision(srv) == {"child_restarts": 0, "failed_children": 0, "handler_errors": 0}


def test_a_capsule_with_an_unreadable_time_already_on_disk_does_not_stop_theater_writes(tmp_path: Path) -> None:
    """A capsule edited on disk (or written before the edge checked it) is journaled
    without a time instead of failing every later theater write."""
    root = tmp_path / "memory"
    with LiveServer(make_settings(root)) as srv:
        assert srv.post(f"/cache/{NAME}", json=archive_body(capsule("rain", "s1", "first"), "a-1")).status_code == 200
        srv.post(f"/release_character/{NAME}")
    items = json.loads((root / NAME / "recent.json").read_text(encoding="utf-8"))
    items[0]["data"]["metadata"]["performed_at"] = ["not", "a", "time"]
    (root / NAME / "recent.json").write_text(json.dumps(items), encoding="utf-8")
    with LiveServer(make_settings(root)) as srv:
        r = srv.post(f"/cache/{NAME}", json=archive_body(capsule("snow", "s1", "second"), "b-1"))
        assert r.status_code == 200, r.text
        assert sorted(m["data"]["metadata"]["story_id"] for m in theater_recent(root)) == ["rain", "snow"]
        assert supervision(srv)["handler_errors"] == 0
