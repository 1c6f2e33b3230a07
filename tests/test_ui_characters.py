"""The memory browser's character list in a real headless Chromium (issue 37, item 6): each
character shows where it came from (when, through which route, from which client), and an
operator renames a mistyped character and merges another into it with the list's buttons
(the same guarded routes as every client)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests import test_ui_browser as ui
from tests.support.live import LiveServer, make_settings
from tests.support.waiting import wait_for
from tests.test_ui_browser import open_view, shot

driver = ui.driver  # the module's headless Chromium fixture


# Read in one script each: the list may be rendered anew between two WebDriver calls.
def row_names(driver: Any) -> list[str]:
    names = driver.execute_script("return [...document.querySelectorAll('[data-test=character-row]')].map((r) => r.dataset.name)")
    return sorted(names)


def origin_text(driver: Any, name: str) -> str:
    return str(
        driver.execute_script(
            "const r = [...document.querySelectorAll('[data-test=character-row]')].find((x) => x.dataset.name === arguments[0]);"
            "const o = r && r.querySelector('[data-test=character-origin]'); return o ? o.innerText : '';",
            name,
        )
    )


def in_row(driver: Any, name: str, test: str) -> Any:
    return driver.find_element("css selector", f"[data-test=character-row][data-name='{name}'] [data-test={test}]")


def test_origin_rename_and_merge_from_the_character_list(driver: Any, tmp_path: Path) -> None:
    driver.set_window_size(1500, 1100)
    with LiveServer(make_settings(tmp_path, embedding_enabled=False)) as srv:
        turns = [{"role": "user", "content": "My cat is called Pixel"}, {"role": "assistant", "content": "Cute"}]
        assert srv.post("/cache/Lna", json={"input_history": turns}, headers={"User-Agent": "python-httpx/0.28"}).status_code == 200
        assert srv.post("/api/characters/Mei/facts", json={"facts": [{"text": "Master likes tea"}]}).status_code == 200
        open_view(driver, srv, "characters")
        assert row_names(driver) == ["Lna", "Mei"]
        text = origin_text(driver, "Lna")
        assert "created" in text and "through POST /cache/{name}" in text and "by python-httpx" in text
        assert "POST /api/characters/{name}/facts" in origin_text(driver, "Mei")

        # Rename the mistyped character.
        in_row(driver, "Lna", "rename-character").click()
        field = driver.find_element("css selector", "[data-test=rename-to]")
        field.clear()
        field.send_keys("Lan")
        driver.find_element("css selector", "[data-test=move-confirm]").click()
        wait_for(lambda: row_names(driver) == ["Lan", "Mei"], what="the renamed character listed")
        wait_for(lambda: "renamed from Lna" in origin_text(driver, "Lan"), what="the rename noted")
        assert not (tmp_path / "Lna").exists()

        # Merge the other one into it.
        in_row(driver, "Mei", "merge-character").click()
        driver.find_element("css selector", "[data-test=merge-into]").send_keys("Lan")
        driver.find_element("css selector", "[data-test=move-confirm]").click()
        wait_for(lambda: row_names(driver) == ["Lan"], what="the merged character gone from the list")
        wait_for(lambda: "Mei merged in" in origin_text(driver, "Lan"), what="the merge noted")
        shot(driver, "characters_renamed_and_merged")
        facts = [f["text"] for f in srv.get("/api/characters/Lan/facts").json()["items"]]
        assert facts == ["Master likes tea"]
        assert "Pixel" in srv.get("/get_recent_history/Lan").text


def test_the_character_list_pages_and_searches(driver: Any, tmp_path: Path) -> None:
    from tests.test_character_list import _install

    names = _install(tmp_path, 120)
    with LiveServer(make_settings(tmp_path, embedding_enabled=False)) as srv:
        open_view(driver, srv, "characters")
        assert row_names(driver) == names[:50]
        pager = "[data-test=characters-pager] "
        assert driver.find_element("css selector", pager + "[data-test=range]").text == "1–50 / 120"
        driver.find_element("css selector", pager + "[data-test=next]").click()
        wait_for(lambda: row_names(driver) == names[50:100], what="the second page")

        search = driver.find_element("css selector", "[data-test=characters-q]")
        search.send_keys("char11\n")
        wait_for(lambda: row_names(driver) == names[110:120], what="the characters whose name holds the search")
        shot(driver, "characters_paged_and_searched")
        # The picker holds every name of its page, not only those the table shows.
        options = driver.execute_script("return document.getElementById('character').options.length")
        assert options == 120
