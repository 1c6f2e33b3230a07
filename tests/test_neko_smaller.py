"""Issue 33's smaller drop-in differences, on a real server: the language a write or
/new_dialog names is kept as the character's, and ``scoped_subjects`` rows carry the
reference's fields (display name, per-layer counts, language, corrections, staged, last
write, archived)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.support.live import LiveServer, make_settings

NAME = "Lan"
GROUP = {"subject_kind": "group_chat", "subject_id": "qq:5550001"}
MEMBER = {"subject_kind": "group_participant", "subject_id": "qq:5550001:42"}


def _history(*texts: str) -> str:
    return json.dumps([{"role": "user" if i % 2 == 0 else "assistant", "content": t} for i, t in enumerate(texts)])


def test_the_language_of_a_write_or_new_dialog_is_kept_as_the_characters(tmp_path: Path) -> None:
    with LiveServer(make_settings(tmp_path, context_language="zh")) as srv:
        assert srv.post(f"/cache/{NAME}", json={"input_history": _history("hello", "hi")}).status_code == 200
        assert srv.get(f"/prompt-locale/{NAME}").json()["language"] is None  # no language named: nothing kept
        assert srv.post(f"/cache/{NAME}", json={"input_history": _history("konnichiwa"), "language": "ja"}).status_code == 200
        state = srv.get(f"/prompt-locale/{NAME}").json()
        assert state["language"] == "ja" and state["effective_language"] == "ja"
        # /new_dialog without a language now renders in the kept language.
        assert "の心の中" in srv.get(f"/new_dialog/{NAME}").text
        # An explicit /new_dialog language is kept too; an unknown one changes nothing.
        srv.get(f"/new_dialog/{NAME}", params={"language": "en"})
        assert srv.get(f"/prompt-locale/{NAME}").json()["language"] == "en"
        srv.post(f"/process/{NAME}", json={"input_history": _history("x"), "language": "xx-unknown"})
        order = srv.get(f"/prompt-locale/{NAME}").json()
        assert order["language"] == "en"
        # The same language again writes nothing (the order does not move).
        srv.get(f"/new_dialog/{NAME}", params={"language": "en"})
        assert srv.get(f"/prompt-locale/{NAME}").json()["order"] == order["order"]


def test_scoped_subjects_rows_carry_the_reference_fields(tmp_path: Path) -> None:
    url = f"/internal/memory/{NAME}"
    with LiveServer(make_settings(tmp_path)) as srv:
        r = srv.post(
            f"{url}/scoped_facts",
            json={
                "subject": GROUP,
                "facts": [{"text": "The group plans a picnic"}, {"text": "The group likes kites"}],
                "display_name": "Kite [club]",
                "language": "ja",
            },
        )
        assert r.status_code == 200, r.text
        r = srv.post(
            f"{url}/scoped_facts", json={"subject": MEMBER, "facts": [{"text": "Member 42 owns a red kite"}], "display_name": "Aki"}
        )
        assert r.status_code == 200, r.text
        too_long = srv.post(f"{url}/scoped_facts", json={"subject": MEMBER, "facts": [{"text": "x"}], "display_name": "n" * 65})
        assert too_long.status_code == 422 and too_long.json()["error_code"] == "bad_display_name"

        rows = {row["subject_id"]: row for row in srv.get(f"{url}/scoped_subjects", params={"platform": "qq"}).json()["subjects"]}
        group, member = rows["qq:5550001"], rows["qq:5550001:42"]
        assert group["subject_kind"] == "group_chat" and group["display_name"] == "Kite club"
        assert (group["facts"], group["facts_archived"], group["reflections"], group["persona"]) == (2, 0, 0, 0)
        assert group["prompt_locale"] == "ja" and member["prompt_locale"] is None
        assert group["corrections"] == 0 and group["staged"] == 0 and group["archived"] is False
        assert group["last_write_at"] and member["display_name"] == "Aki" and member["facts"] == 1
        assert srv.get(f"{url}/scoped_subjects", params={"platform": "bili"}).json() == {"subjects": []}

        # Forgetting the member erases what was kept about it, its display name included.
        assert srv.post(f"{url}/scoped_forget", json={"subject": MEMBER}).json()["status"] == "forgotten"
        ids = [row["subject_id"] for row in srv.get(f"{url}/scoped_subjects").json()["subjects"]]
        assert ids == ["qq:5550001"]
    assert b"Aki" not in (tmp_path / NAME / "scoped_subjects.json").read_bytes()


def test_facts_the_reference_retired_are_kept_but_not_recalled(tmp_path: Path) -> None:
    facts = [
        {"text": "Master lives in Osaka near the castle", "source": {"neko": {"superseded_by": "fact_new"}}},
        {"text": "Master lives in Kyoto near the river"},
        {"text": "Master lives in Nara near the deer park", "source": {"neko": {"arbitration_archived_at": "2026-11-01T10:00:00"}}},
        {"text": "Master lives in Kobe near the harbour", "source": {"neko": {"speaker_provenance_mixed": True}}},
    ]
    with LiveServer(make_settings(tmp_path)) as srv:
        assert srv.post(f"/api/characters/{NAME}/facts", json={"facts": facts}).status_code == 200
        texts = [row["text"] for row in srv.post(f"/query_memory/{NAME}", json={"query": "where does Master live"}).json()["results"]]
        assert any("Kyoto" in t for t in texts) and any("Kobe" in t for t in texts)  # opaque fields change nothing
        assert not any("Osaka" in t or "Nara" in t for t in texts)
        # Still stored (and listed): retired, not erased.
        stored = [f["text"] for f in srv.get(f"/api/characters/{NAME}/facts", params={"limit": 100}).json()["items"]]
        assert any("Osaka" in t for t in stored)


def test_reload_starts_the_characters_it_is_told_to_resume(tmp_path: Path) -> None:
    with LiveServer(make_settings(tmp_path)) as srv:
        assert srv.post(f"/cache/{NAME}", json={"input_history": _history("hello")}).status_code == 200
        body = {
            "resume_derived_task_names": [NAME, "Gone"],
            "resume_derived_task_generations": {NAME: 3},
            "release_derived_task_claims": {NAME: ["claim-1"]},
        }
        r = srv.post("/reload", json=body)
        assert r.status_code == 200 and r.json()["status"] == "success", r.text
        # The character with a folder is started again at once; the one without is not.
        assert r.json()["resumed"] == [NAME] and srv.runtime.registry.is_active(NAME)
        assert not (tmp_path / "Gone").exists()
        # The reference's plain call (no body) still works; a malformed body is refused.
        assert srv.post("/reload").json()["resumed"] == []
        bad = srv.post("/reload", json={"resume_derived_task_names": "Lan"})
        assert bad.status_code == 422 and bad.json()["error_code"] == "schema_violation"
        bad = srv.post("/reload", json={"resume_derived_task_names": ["a/b"]})
        assert bad.status_code == 400 and bad.json()["error_code"] == "invalid_name"
