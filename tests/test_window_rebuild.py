"""The recent window at load is the window base plus every later row, whatever state a
power loss left recent.json in (missing, empty, old, with a newer journal_row in
recent_meta.json), and an outside edit made while the server was stopped is adopted."""

from __future__ import annotations

import json
import shutil

import pytest

from nekomem.domain.turns import Turn
from nekomem.domain.window_rebuild import covered_end, only_dropped, rebuild
from tests.support.live import LiveServer, make_settings
from tests.support.waiting import wait_for


def t(text, role="human"):
    return Turn(role=role, text=text, ts="2026-01-01T00:00:00+00:00")


MEMO = t("Memo: earlier", "system")


def test_missing_file_is_base_plus_rows():
    r = rebuild([MEMO, t("a")], [t("b"), t("c")], None)
    assert [x.text for x in r.window] == ["Memo: earlier", "a", "b", "c"] and r.how == "base"


def test_an_old_state_is_completed_with_the_rows_after_it():
    r = rebuild([MEMO, t("a")], [t("b"), t("c"), t("d")], [MEMO, t("a"), t("b")])
    assert [x.text for x in r.window] == ["Memo: earlier", "a", "b", "c", "d"]
    assert (r.how, r.added) == ("caught_up", 2)


def test_a_state_the_hard_cap_trimmed_is_recognised():
    # The cap kept the memo and dropped "a": still a state of base + rows.
    assert covered_end([MEMO, t("b"), t("c")], [MEMO, t("a"), t("b"), t("c"), t("d")], 2) == 4
    assert covered_end([t("c")], [t("a"), t("b"), t("c"), t("d")], 1) == 3


def test_a_state_older_than_the_base_is_an_outside_edit():
    # Ending before the base's end: the newest items were deleted from outside.
    assert covered_end([MEMO, t("a")], [MEMO, t("a"), t("b")], 3) is None
    r = rebuild([MEMO, t("a"), t("b")], [t("c")], [MEMO, t("a")])
    assert r.how == "adopted" and [x.text for x in r.window] == ["Memo: earlier", "a"]


def test_an_edited_text_is_adopted_as_it_is():
    r = rebuild([t("a")], [t("b")], [t("a"), t("B (edited)")])
    assert r.how == "adopted" and [x.text for x in r.window] == ["a", "B (edited)"]


def test_an_empty_window_before_any_base_takes_every_row():
    assert [x.text for x in rebuild([], [t("a"), t("b")], []).window] == ["a", "b"]


def test_only_dropped_tells_a_trim_from_a_cut():
    before = [MEMO, t("a"), t("b"), t("c")]
    assert only_dropped(before, [MEMO, t("c")])
    assert only_dropped(before, [t("b"), t("c")])
    assert not only_dropped(before, [MEMO, t("c (cut)")])
    assert not only_dropped(before, [t("Memo: ea", "system"), t("c")])


# -- on a real server ---------------------------------------------------------------------------


def _items(path):
    return [m["data"]["content"] for m in json.loads(path.read_text(encoding="utf-8"))]


def _window(srv, name):
    return [item["text"] for item in srv.get(f"/api/characters/{name}/recent").json()["items"]]


@pytest.mark.parametrize("damage", ["old", "old_with_newer_meta", "empty", "missing", "missing_with_meta"])
def test_the_window_after_a_power_loss_is_memo_plus_every_later_row(tmp_path, fake_llm, damage):
    settings = make_settings(tmp_path / "root", llm_base_url=fake_llm.base_url, llm_model="fake")
    folder = tmp_path / "root" / "Lan"
    with LiveServer(settings) as srv:
        turns = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"turn number {i}"} for i in range(25)]
        assert srv.post("/process/Lan", json={"input_history": turns}).json() == {"status": "processed"}
        # Answered once the turns are durable; the compression (which writes recent.json
        # durably, as the new window base) follows in the background.
        durable = wait_for(lambda: (lambda got: got if len(got) == 10 else None)(_items(folder / "recent.json")), what="the memo")
        assert durable[0].startswith("Memo from prior conversations: ") and len(durable) == 10
        shutil.copy(folder / "recent.json", tmp_path / "old-recent.json")
        for i in range(7):
            assert srv.post("/cache/Lan", json={"input_history": [{"role": "user", "content": f"later {i}"}]}).status_code == 200
        expected = _window(srv, "Lan")
        assert expected == durable + [f"later {i}" for i in range(7)]
        assert srv.post("/release_character/Lan?derived_task_claim_token=t&derived_task_claim_generation=0").status_code == 200
    # What a power loss leaves of the view (the journal is durable).
    recent, meta = folder / "recent.json", folder / "recent_meta.json"
    if damage.startswith("old"):
        shutil.copy(tmp_path / "old-recent.json", recent)
    elif damage == "empty":
        recent.write_bytes(b"")
    else:
        recent.unlink()
    if damage == "missing":
        meta.unlink()
    with LiveServer(settings) as srv:
        assert _window(srv, "Lan") == expected
        assert _items(recent) == expected


def test_an_outside_edit_while_stopped_is_kept(tmp_path):
    settings = make_settings(tmp_path)
    with LiveServer(settings) as srv:
        for i in range(3):
            srv.post("/cache/Lan", json={"input_history": [{"role": "user", "content": f"m{i}"}]})
        assert srv.post("/release_character/Lan?derived_task_claim_token=t&derived_task_claim_generation=0").status_code == 200
    recent = tmp_path / "Lan" / "recent.json"
    edited = json.loads(recent.read_text(encoding="utf-8"))
    edited[1]["data"]["content"] = "m1 (edited by hand)"
    del edited[2]
    recent.write_text(json.dumps(edited), encoding="utf-8")
    with LiveServer(settings) as srv:
        assert _window(srv, "Lan") == ["m0", "m1 (edited by hand)"]
        srv.post("/cache/Lan", json={"input_history": [{"role": "user", "content": "m3"}]})
    recent.write_bytes(b"")  # and then a power loss: the adopted edit is the base now
    with LiveServer(settings) as srv:
        assert _window(srv, "Lan") == ["m0", "m1 (edited by hand)", "m3"]


def test_a_repeated_turn_lost_from_an_old_file_comes_back(tmp_path):
    settings = make_settings(tmp_path)
    recent = tmp_path / "Lan" / "recent.json"
    with LiveServer(settings) as srv:
        srv.post("/cache/Lan", json={"input_history": [{"role": "user", "content": "hi"}]})
        old = recent.read_bytes()
        srv.post("/cache/Lan", json={"input_history": [{"role": "user", "content": "hi"}]})
        assert srv.post("/release_character/Lan?derived_task_claim_token=t&derived_task_claim_generation=0").status_code == 200
    recent.write_bytes(old)
    with LiveServer(settings) as srv:
        assert _window(srv, "Lan") == ["hi", "hi"]


def test_under_the_hard_cap_an_old_file_is_rebuilt_and_a_current_one_kept(tmp_path):
    settings = make_settings(tmp_path, recent_hard_cap_tokens=100, recent_hard_cap_min_items=1)
    recent = tmp_path / "Lan" / "recent.json"
    with LiveServer(settings) as srv:
        for i in range(60):
            srv.post("/cache/Lan", json={"input_history": [{"role": "user", "content": f"message number {i} here"}]})
            if i == 45:
                old = recent.read_bytes()
        expected = _window(srv, "Lan")
        assert 3 < len(expected) < 30 and expected[-1] == "message number 59 here"
        assert srv.post("/release_character/Lan?derived_task_claim_token=t&derived_task_claim_generation=0").status_code == 200
    with LiveServer(settings) as srv:
        assert _window(srv, "Lan") == expected  # current: kept as it is
        assert srv.post("/release_character/Lan?derived_task_claim_token=t&derived_task_claim_generation=0").status_code == 200
    recent.write_bytes(old)  # a power loss brought back an older state
    with LiveServer(settings) as srv:
        assert _window(srv, "Lan") == expected
