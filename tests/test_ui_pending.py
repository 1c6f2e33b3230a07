"""The memory browser's character list shows how many entries still wait for a vector, in
real headless Chromium (issue 23): non-zero right after an import, 0 once all are done."""

from __future__ import annotations

from typing import Any

from tests.support.live import LiveServer, make_settings
from tests.support.waiting import wait_for
from tests.test_ui_browser import driver, open_view  # noqa: F401 - the module's Chromium fixture

NAME = "Lan"


def shown_pending(driver: Any, srv: LiveServer) -> int:  # noqa: F811 - the fixture's value
    open_view(driver, srv, "journal", NAME)  # another view first: the list renders again on the way back
    open_view(driver, srv, "characters")
    cell = driver.find_element("css selector", f"[data-test=character-row][data-name={NAME}] [data-test=vectors-pending]")
    return int(cell.text)


def test_the_character_list_shows_the_vectors_still_pending(driver: Any, tmp_path, embedding_service) -> None:  # noqa: F811
    with LiveServer(make_settings(tmp_path), embeddings=embedding_service) as srv:
        texts = [f"Master keeps postcard {n} of the mountain railway series in a tin box" for n in range(1500)]
        assert srv.post(f"/api/characters/{NAME}/facts", json={"facts": [{"text": t} for t in texts]}).status_code == 200
        assert shown_pending(driver, srv) > 0
        wait_for(lambda: srv.get("/health").json()["embeddings"]["pending"] == 0, timeout=600, what="every vector")
        assert shown_pending(driver, srv) == 0
