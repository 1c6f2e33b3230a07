"""The memory browser's character list shows the fact backlog (issue 27, item 2) in a
real headless Chromium: turns stored without a model are counted as not yet mined, and
the count falls to 0 once a model has mined them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests import test_ui_browser as ui
from tests.support.fake_llm import FakeLLM
from tests.support.live import LiveServer, make_settings
from tests.support.waiting import quiesce, wait_for
from tests.test_fact_backlog import NAME, name_each_cat
from tests.test_ui_browser import open_view, shot

driver = ui.driver  # the module's headless Chromium fixture, shared


def backlog_cell(driver: Any) -> tuple[str, str]:
    cell = driver.find_element("css selector", f"[data-test=character-row][data-name={NAME}] [data-test=fact-backlog]")
    return cell.text, cell.get_attribute("class")


def test_the_character_list_counts_the_turns_not_yet_mined(driver: Any, tmp_path: Path, fake_llm: FakeLLM) -> None:
    fake_llm.on("extract_facts", name_each_cat)
    with LiveServer(make_settings(tmp_path, embedding_enabled=False)) as srv:  # no model
        for pet in ("Pixel", "Mochi"):
            r = srv.post(f"/cache/{NAME}", json={"input_history": [{"role": "user", "content": f"I just adopted a cat named {pet}"}]})
            assert r.status_code == 200, r.text
        quiesce(srv.runtime, NAME)
        open_view(driver, srv, "characters", NAME)
        assert backlog_cell(driver) == ("2", "num warn")
        header = driver.find_elements("css selector", "[data-test=characters] th")
        assert any(h.text == "Turns not yet mined for facts" for h in header)
        shot(driver, "characters_fact_backlog")
    settings = make_settings(tmp_path, embedding_enabled=False, llm_base_url=fake_llm.base_url, llm_model="fake")
    with LiveServer(settings) as srv:
        wait_for(lambda: srv.get("/health").json()["fact_backlog"]["rows_remaining"] == 0, what="the backlog mined")
        open_view(driver, srv, "characters", NAME)
        assert backlog_cell(driver) == ("0", "num")
