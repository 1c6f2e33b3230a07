"""The memory browser's character list in a real headless Chromium (issue 37, item 8): its
"Turns not yet mined for facts" equals /health's count after turns are stored and after
some are forgotten (both read one tally), and at 800 px wide the page does not overflow:
the table scrolls inside its own box, every column reachable. Screenshots go to
test-output/ui/ (and to /work/notes/ when that folder exists, for the issue's note)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from tests import test_ui_browser as ui
from tests.support.live import LiveServer, make_settings
from tests.support.waiting import wait_for
from tests.test_ui_browser import open_view, shot

driver = ui.driver  # the module's headless Chromium fixture

NAME = "Lan"
NOTES = Path("/work/notes")


def keep(path: Path, name: str) -> None:
    """Copy a screenshot for the lead's note when the notes folder exists."""
    if NOTES.is_dir():
        shutil.copyfile(path, NOTES / name)


def backlog_cell(driver: Any, name: str) -> int:
    return int(driver.find_element("css selector", f"[data-test=character-row][data-name='{name}'] [data-test=fact-backlog]").text)


def health_backlog(srv: LiveServer, name: str) -> int:
    return int(srv.get("/health").json()["fact_backlog"]["characters"].get(name, 0))


def store(srv: LiveServer, name: str, pairs: int) -> None:
    for i in range(pairs):
        turns = [{"role": "user", "content": f"I watered plant number {i}"}, {"role": "assistant", "content": "Good"}]
        assert srv.post(f"/cache/{name}", json={"input_history": turns}).status_code == 200


def test_the_backlog_count_equals_health_after_turns_and_after_a_forget(driver: Any, tmp_path: Path) -> None:
    driver.set_window_size(1500, 1100)
    with LiveServer(make_settings(tmp_path, embedding_enabled=False)) as srv:  # no model: turns wait to be mined
        store(srv, NAME, 4)
        store(srv, "Mei", 1)
        open_view(driver, srv, "characters")
        assert backlog_cell(driver, NAME) == health_backlog(srv, NAME) == 8
        assert backlog_cell(driver, "Mei") == health_backlog(srv, "Mei") == 2
        assert srv.get("/health").json()["fact_backlog"]["rows_remaining"] == 10

        # Forget two stored turns (the oldest pair): they no longer wait to be mined.
        rows = srv.get(f"/api/browse/{NAME}/journal", params={"order": "asc"}).json()["items"]
        ids = ",".join(str(r["id"]) for r in rows[:2])
        assert srv.delete(f"/api/characters/{NAME}/turns", params={"ids": ids}).status_code == 200
        open_view(driver, srv, "characters", query="after=forget")
        assert backlog_cell(driver, NAME) == health_backlog(srv, NAME) == 6
        assert srv.get("/health").json()["fact_backlog"]["rows_remaining"] == 8

        # The counts beside /health's, for the note: /health's fact_backlog shown on the page.
        health = srv.get("/health").text
        driver.execute_script(
            "const p = document.createElement('pre'); p.dataset.test = 'health-beside';"
            "p.textContent = 'GET /health -> fact_backlog: ' + JSON.stringify(JSON.parse(arguments[0]).fact_backlog, null, 2);"
            "document.getElementById('view').append(p);",
            health,
        )
        keep(shot(driver, "characters_counts_beside_health"), "everyday-counts.png")

    # After a restart nothing is loaded: the listing reads the journal once, and /health
    # then shows that same count.
    with LiveServer(make_settings(tmp_path, embedding_enabled=False)) as srv:
        open_view(driver, srv, "characters", query="after=restart")
        assert backlog_cell(driver, NAME) == 6
        wait_for(lambda: health_backlog(srv, NAME) == 6, what="/health showing the listing's count")


def test_the_character_list_fits_800_px(driver: Any, tmp_path: Path) -> None:
    with LiveServer(make_settings(tmp_path, embedding_enabled=False)) as srv:
        for name in ("Lan", "Mei", "A rather long character name"):
            store(srv, name, 1)
        driver.set_window_size(800, 900)
        try:
            open_view(driver, srv, "characters", query="width=800")
            width = driver.execute_script("return window.innerWidth")
            assert width <= 800
            page = driver.execute_script("const d = document.documentElement; return [d.scrollWidth, d.clientWidth]")
            assert page[0] <= page[1], f"the page overflows at 800 px: {page}"
            # The table scrolls inside its own box; scrolled to its end, the last column
            # lies inside that box.
            box = driver.find_element("css selector", "[data-test=characters-scroll]")
            reach = driver.execute_script(
                "const box = arguments[0]; box.scrollLeft = box.scrollWidth;"
                "const b = box.getBoundingClientRect(); const cells = box.querySelectorAll('tr:first-child th');"
                "const last = cells[cells.length - 1].getBoundingClientRect();"
                "const first = cells[0].getBoundingClientRect();"
                "return [last.right <= b.right + 1, last.left >= b.left - 1, first.left >= b.left - 1, b.right <= window.innerWidth];",
                box,
            )
            assert reach == [True, True, True, True], reach
            driver.execute_script("arguments[0].scrollLeft = 0", box)
            # The viewport as it is (a full-page capture would lay the page out anew).
            path = ui.OUT / "characters_800px.png"
            driver.save_screenshot(str(path))
            keep(path, "everyday-list-800.png")
        finally:
            driver.set_window_size(1500, 1100)
