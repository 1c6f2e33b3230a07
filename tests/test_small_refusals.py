"""Issue 38's smaller items on a real server: a range forget whose ``to`` is a date takes
that whole day, a reversed range is 400; a character name with a control character at its
end (``Lan%0A``) is refused, not taken for ``Lan``; ``/api/import/neko`` answers 400 for
a path no file system can hold (NUL, a 5,000-character folder name)."""

from __future__ import annotations

from pathlib import Path

from tests.support.live import LiveServer, make_settings


def _turn(text: str, ts: str) -> dict[str, object]:
    return {"role": "user", "content": text, "timestamp": ts}


def test_a_date_only_to_forgets_that_whole_day_and_a_reversed_range_is_400(tmp_path: Path) -> None:
    with LiveServer(make_settings(tmp_path)) as srv:
        turns = [
            _turn("the fifth", "2026-02-05T23:00:00Z"),
            _turn("the sixth, morning", "2026-02-06T08:00:00Z"),
            _turn("the sixth, night", "2026-02-06T23:59:59.5Z"),
            _turn("the seventh", "2026-02-07T00:00:00.5Z"),
        ]
        assert srv.post("/cache/Lan", json={"input_history": turns}).status_code == 200
        day = srv.delete("/api/characters/Lan/turns", params={"from": "2026-02-06", "to": "2026-02-06"})
        assert day.status_code == 200 and day.json()["forgotten"] == 2, day.text
        left = [i["text"] for i in srv.get("/api/browse/Lan/journal", params={"order": "asc"}).json()["items"]]
        assert left == ["the fifth", "the seventh"]
        reversed_range = srv.delete("/api/characters/Lan/turns", params={"from": "2026-02-07", "to": "2026-02-06"})
        assert reversed_range.status_code == 400 and reversed_range.json()["error_code"] == "bad_range", reversed_range.text
        assert "after" in reversed_range.json()["message"]
        bad = srv.delete("/api/characters/Lan/turns", params={"from": "yesterday", "to": "2026-02-06"})
        assert bad.status_code == 400 and bad.json()["error_code"] == "bad_range"


def test_a_name_ending_in_a_control_character_is_refused(tmp_path: Path) -> None:
    with LiveServer(make_settings(tmp_path)) as srv:
        for raw in ("Lan%0A", "%09Lan", "Lan%0D", "Lan%C2%85"):
            r = srv.post(f"/cache/{raw}", json={"input_history": [{"role": "user", "content": "hi"}]})
            assert r.status_code == 400, (raw, r.text)
            body = r.json()
            assert body["error_code"] == "name_invalid_chars" and "control" in body["message"], body
        assert not (tmp_path / "Lan").exists()
        # Spaces around a name are still dropped, as the reference does.
        assert srv.post("/cache/%20Lan%20", json={"input_history": [{"role": "user", "content": "hi"}]}).status_code == 200
        assert (tmp_path / "Lan").is_dir()


def test_an_import_path_no_file_system_can_hold_is_400(tmp_path: Path) -> None:
    with LiveServer(make_settings(tmp_path / "root", import_root=str(tmp_path))) as srv:
        for source in (f"{tmp_path}/a\u0000b", f"{tmp_path}/{'x' * 5000}", f"{tmp_path}/{'y' * 300}/memory", "/" + "z/" * 3000):
            r = srv.post("/api/import/neko", json={"source_dir": source})
            assert r.status_code == 400, (source[:60], r.status_code, r.text[:300])
            assert r.json()["error_code"] == "bad_source_dir", r.text[:300]
