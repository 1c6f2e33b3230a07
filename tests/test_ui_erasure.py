"""Forgetting from the memory browser, in real headless Chromium (the harness of
test_ui_browser.py): "forget this" on a fact, a reflection, a persona entry, a stored turn
and a range of turns, and "delete this character", each after a dialog naming what goes;
then a byte search of the memory root finds nothing of the erased text."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.fake_llm import FakeLLM
from tests.support.live import LiveServer, make_settings
from tests.test_erasure import holders
from tests.test_ui_browser import _need_browser, _ready, _seq, _wait, click, driver, open_view, shot, texts

__all__ = ["driver"]  # the module-scoped Chromium fixture of test_ui_browser


@pytest.fixture
def erasable(tmp_path) -> Iterator[LiveServer]:
    _need_browser()
    with FakeLLM() as llm:
        llm.on(
            "synthesize_reflection",
            {
                "reflection": {
                    "text": "Master hides notes under UIREFL5 stones",
                    "entity": "master",
                    "time_scope": "pattern",
                    "event_start_at": None,
                    "event_end_at": None,
                }
            },
        )
        with LiveServer(make_settings(tmp_path / "memory", llm_base_url=llm.base_url, llm_model="fake")) as srv:
            hobbies = ["green tea in the morning", "long walks by the river", "old jazz records", "baking rye bread", "chess"]
            facts = [{"text": f"Master loves {h}", "importance": 7, "entity": "master"} for h in hobbies]
            facts.append({"text": "Master's door code is UIFACT3", "importance": 8, "entity": "master"})
            assert srv.post("/api/characters/Lan/facts", json={"facts": facts}).status_code == 200
            assert srv.post("/reflect/Lan").json()["reflection"] is not None
            srv.post("/api/characters/Lan/card", json={"entries": [{"entity": "neko", "text": "Lan sings UIPERS9 songs"}]})
            history = [
                {"role": "user", "content": "my passport number is UITURN2", "timestamp": "2026-01-05T10:00:00+00:00"},
                {"role": "user", "content": "trip UIRANGE4 day one", "timestamp": "2026-02-01T10:00:00+00:00"},
                {"role": "user", "content": "trip UIRANGE4 day two", "timestamp": "2026-02-02T10:00:00+00:00"},
                {"role": "user", "content": "this one stays", "timestamp": "2026-03-01T10:00:00+00:00"},
            ]
            assert srv.post("/cache/Lan", json={"input_history": history}).status_code == 200
            srv.post("/cache/Mika", json={"input_history": [{"role": "user", "content": "Mika knows UICHAR7"}]})
            yield srv


def confirm_in_dialog(driver: Any, names: str) -> list[str]:
    """The open erasure dialog names ``names``; confirm it and wait for the re-render.
    Returns the dialog's list items."""
    _wait(lambda: driver.find_elements("css selector", "[data-test=erase-dialog][open]"), "the confirmation dialog")
    items = texts(driver, "[data-test=erase-items] li")
    assert any(names in item for item in items), items
    click(driver, "[data-test=erase-confirm]")
    return items


def press(driver: Any, css: str) -> None:
    """Click a button that opens a dialog (no re-render yet)."""
    driver.find_element("css selector", css).click()


def test_forget_each_kind_and_delete_a_character_from_the_browser(driver: Any, erasable: LiveServer) -> None:
    srv = erasable
    root = srv.runtime.memory_root
    for needle in ("UIFACT3", "UIREFL5", "UIPERS9", "UITURN2", "UIRANGE4", "UICHAR7"):
        assert holders(root, needle), needle

    # A fact; first cancelled: nothing goes.
    open_view(driver, srv, "facts", "Lan")
    fid = srv.get("/api/browse/Lan/facts", params={"q": "UIFACT3"}).json()["items"][0]["id"]
    press(driver, f"[data-id='{fid}'] [data-test=forget]")
    _wait(lambda: driver.find_elements("css selector", "[data-test=erase-dialog][open]"), "the dialog")
    assert "UIFACT3" in driver.find_element("css selector", "[data-test=erase-items]").text
    assert "turns it was learned from" in driver.find_element("css selector", "[data-test=erase-note]").text
    shot(driver, "erase_confirm_fact")
    driver.find_element("css selector", "[data-test=erase-cancel]").click()
    assert holders(root, "UIFACT3")
    press(driver, f"[data-id='{fid}'] [data-test=forget]")
    confirm_in_dialog(driver, "UIFACT3")
    assert not [t for t in texts(driver, "[data-test=fact-text]") if "UIFACT3" in t]
    assert holders(root, "UIFACT3") == []

    # A reflection.
    open_view(driver, srv, "reflections", "Lan")
    rid = srv.get("/api/characters/Lan/reflections").json()["items"][0]["id"]
    press(driver, f"[data-test=reflection-card][data-id='{rid}'] [data-test=forget]")
    confirm_in_dialog(driver, "UIREFL5")
    assert not driver.find_elements("css selector", f"[data-test=reflection-card][data-id='{rid}']")
    assert holders(root, "UIREFL5") == []

    # A persona entry.
    open_view(driver, srv, "persona", "Lan")
    pid = [e for e in srv.get("/api/characters/Lan/persona").json()["items"] if "UIPERS9" in e["text"]][0]["id"]
    press(driver, f"[data-test=persona-row][data-id='{pid}'] [data-test=forget]")
    confirm_in_dialog(driver, "UIPERS9")
    assert holders(root, "UIPERS9") == []

    # A stored turn, then a range of them.
    open_view(driver, srv, "journal", "Lan", "q=UITURN2")
    row = srv.get("/api/browse/Lan/journal", params={"q": "UITURN2"}).json()["items"][0]["id"]
    press(driver, f"[data-test=journal-row][data-id='{row}'] [data-test=forget-turn]")
    confirm_in_dialog(driver, "UITURN2")
    assert holders(root, "UITURN2") == []
    open_view(driver, srv, "journal", "Lan", "since=2026-01-31T00:00:00.000Z&until=2026-02-03T00:00:00.000Z&order=asc")
    assert len(texts(driver, "[data-test=journal-row]")) == 2
    press(driver, "[data-test=forget-range]")
    _wait(lambda: driver.find_elements("css selector", "[data-test=erase-dialog][open]"), "the dialog")
    assert "2" in driver.find_element("css selector", "[data-test=erase-title]").text
    click(driver, "[data-test=erase-confirm]")
    assert texts(driver, "[data-test=journal-row]") == []
    assert holders(root, "UIRANGE4") == []
    assert [i["text"] for i in srv.get("/api/browse/Lan/journal").json()["items"]] == ["this one stays"]

    # A whole character: the dialog counts what goes.
    open_view(driver, srv, "characters")
    press(driver, "[data-test=character-row][data-name=Mika] [data-test=delete-character]")
    _wait(lambda: driver.find_elements("css selector", "[data-test=erase-dialog][open]"), "the dialog")
    assert "Mika" in driver.find_element("css selector", "[data-test=erase-title]").text
    shot(driver, "erase_confirm_character")
    confirm_in_dialog(driver, "1 stored turns")
    _wait(lambda: not driver.find_elements("css selector", "[data-test=character-row][data-name=Mika]"), "Mika gone from the list")
    assert driver.find_elements("css selector", "[data-test=character-row][data-name=Lan]")
    assert not (root / "Mika").exists() and holders(root, "UICHAR7") == []
    before = _seq(driver)
    driver.refresh()
    _wait(lambda: _ready(driver, before - before), "the page after a reload")
    assert "Mika" not in driver.execute_script("return [...document.querySelectorAll('#character option')].map(o => o.value).join(',')")
