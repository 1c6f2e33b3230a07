"""stores.erasure: the one rule that finds copies of an erased text (plain functions)."""

from __future__ import annotations

import json

from nekomem.domain.turns import Turn
from nekomem.stores.erasure import drop_from_shards, mentions, scrub_ndjson_file, scrub_value


def disk(text: str, role: str = "human") -> dict[str, object]:
    return Turn(role=role, text=text, ts="2026-01-01T00:00:00+00:00").to_disk()  # type: ignore[arg-type]


def test_a_stored_turn_goes_whole_from_the_list_it_is_in():
    payload = {"messages": [disk("keep me"), disk(" secret pin 1234 "), disk("ok", "ai")], "session_id": "s", "rows": [1, 3]}
    scrubbed, hit = scrub_value(payload, ["secret pin 1234"])
    assert hit and scrubbed == {"messages": [disk("keep me"), disk("ok", "ai")], "session_id": "s", "rows": [1, 3]}


def test_equality_not_containment_and_only_text_fields():
    record = {"entity": "master", "text": "Master likes plums", "note": "secret"}
    assert scrub_value(record, ["plums"]) == (record, False)  # a part of a text is not the text
    assert scrub_value(record, ["master"]) == (record, False)  # not a text field
    assert scrub_value(record, ["secret"]) == (record, False)
    assert scrub_value({"fact": record}, ["Master likes plums"]) == (None, True)  # the record and what holds it go
    assert scrub_value(["a", "b", " a "], ["a"]) == (["b"], True)  # bare strings in a list
    assert mentions({"old_text": "x", "new_text": "y"}, ["y"]) and not mentions({"old_text": "x"}, [""])


def test_scrub_ndjson_file_rewrites_only_what_holds_the_text(tmp_path):
    path = tmp_path / "recent_edits.ndjson"
    lines = [
        {"reason": "edit", "replaced": [disk("hello"), disk("my secret")], "adopted": [disk("hello")]},
        {"reason": "edit", "replaced": [disk("other")], "adopted": []},
    ]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"torn', encoding="utf-8")
    assert scrub_ndjson_file(path, ["my secret"]) == 2  # the changed line and the undecodable tail
    kept = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines()]
    assert kept == [{"reason": "edit", "replaced": [disk("hello")], "adopted": [disk("hello")]}, lines[1]]
    assert "my secret" not in path.read_text(encoding="utf-8")
    assert scrub_ndjson_file(tmp_path / "missing.ndjson", ["x"]) == 0


def test_drop_from_shards(tmp_path):
    (tmp_path / "2026-01-01_a.json").write_text(json.dumps([{"id": "r1", "text": "a"}, {"id": "r2", "text": "b"}]), encoding="utf-8")
    (tmp_path / "2026-01-02_a.json").write_text(json.dumps([{"id": "r3", "text": "c"}]), encoding="utf-8")
    assert drop_from_shards(tmp_path, ["r2", "r3"]) == 2
    assert json.loads((tmp_path / "2026-01-01_a.json").read_text(encoding="utf-8")) == [{"id": "r1", "text": "a"}]
    assert json.loads((tmp_path / "2026-01-02_a.json").read_text(encoding="utf-8")) == []
    assert drop_from_shards(tmp_path / "none", ["r1"]) == 0
