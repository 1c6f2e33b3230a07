"""The memory browser's public knowledge view in a real headless Chromium: the packs and
jobs of a real server, the entries, the query playground showing the tool's block, an
entry disabled and a pack removed from the page (the server agrees after each click)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.live import LiveServer, make_settings
from tests.test_knowledge import K, ask, pack, post_pack, ready, titles, wait_job
from tests.test_ui_browser import _ready, _seq, _wait, driver, open_view, shot, texts

__all__ = ["driver"]  # the module-scoped browser fixture of test_ui_browser


@pytest.fixture(scope="module")
def knowledge_site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    root: Path = tmp_path_factory.mktemp("knowledge-ui") / "memory"
    with LiveServer(make_settings(root)) as srv:
        ready(srv)
        wait_job(srv, post_pack(srv, pack())["job_id"])
        yield srv


def click_and_wait(driver: Any, css: str) -> None:
    before = _seq(driver)
    driver.find_element("css selector", css).click()
    _wait(lambda: _ready(driver, before), f"render after clicking {css}")


def test_the_knowledge_view(driver: Any, knowledge_site: LiveServer) -> None:
    srv = knowledge_site
    open_view(driver, srv, "knowledge")
    rows = driver.find_elements("css selector", "[data-test=pack-row]")
    assert [r.get_attribute("data-pack") for r in rows] == ["world-notes"]
    assert [r.get_attribute("data-state") for r in driver.find_elements("css selector", "[data-test=job-row]")] == ["active"]
    assert len(driver.find_elements("css selector", "[data-test=entry-row]")) == 6
    assert "yes" in driver.find_element("css selector", "[data-test=knowledge-status]").text
    shot(driver, "knowledge")

    open_view(driver, srv, "knowledge", query="ask=%E5%85%B0%E5%B7%9E%E6%8B%89%E9%9D%A2&lang=zh")  # 兰州拉面
    assert "matched" in driver.find_element("css selector", "[data-test=knowledge-result]").text
    block = driver.find_element("css selector", "[data-test=knowledge-context]").get_attribute("textContent")
    assert block == ask(srv, "兰州拉面", language="zh", limit=3)["context"]
    shot(driver, "knowledge_playground")

    open_view(driver, srv, "knowledge", query="entries=kotatsu")
    assert texts(driver, "[data-test=entry-row] td:first-child") == ["Kotatsu"]
    click_and_wait(driver, "[data-test=entry-row][data-title=Kotatsu] [data-test=entry-disabled]")
    assert "Kotatsu" not in titles(ask(srv, "kotatsu"))
    assert "removed" in driver.find_element("css selector", "[data-test=entry-row][data-title=Kotatsu]").get_attribute("class")

    driver.find_element("css selector", "[data-test=pack-remove]").click()  # arms the button
    click_and_wait(driver, "[data-test=pack-remove]")
    assert driver.find_elements("css selector", "[data-test=pack-row]") == []
    assert srv.get(f"{K}/availability").json()["tool_available"] is False
    severe = [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert not severe, severe
