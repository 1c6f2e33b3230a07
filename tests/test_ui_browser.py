"""The memory browser (/ui) in a real headless Chromium, driven by selenium.

Two real servers: one with a character that has facts, a reflection (synthesised through
the loopback fake LLM), a persona with a contradiction queue and recent turns, plus a
character whose time_indexed.db holds 10,000 turns; another whose character has 100,000
facts written to facts.json before start (for the Facts first-render measurement).
Screenshots of every view go to test-output/ui/. Debian's chromium and chromium-driver
are required: skipped when missing, except in CI (CI=true), where that is a failure.
"""

from __future__ import annotations

import base64
import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.fake_llm import FakeLLM
from tests.support.live import ROOT, LiveServer, make_settings
from tests.support.ui_seed import seed_facts, seed_journal, seed_persona
from tests.support.waiting import wait_for

CHROMEDRIVER = Path("/usr/bin/chromedriver")
CHROMIUM = next((Path(p) for p in ("/usr/bin/chromium", "/usr/bin/chromium-browser") if Path(p).exists()), None)
OUT = ROOT / "test-output" / "ui"
MODEL = ROOT / "models" / "use-multilingual-v3" / "model.onnx"
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--lang=en-US",
    "--window-size=1500,1100",
)
BIG_FACTS = 100_000
JOURNAL_TURNS = 10_000


def _need_browser() -> None:
    if CHROMEDRIVER.exists() and CHROMIUM is not None:
        return
    message = "chromium and chromium-driver are not installed (make test installs them: scripts/ensure_browser.sh)"
    if os.environ.get("CI") == "true":
        pytest.fail(message + "; in CI the browser tests may not skip")
    pytest.skip(message)


@pytest.fixture(scope="module")
def driver(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    _need_browser()
    os.environ.setdefault("SE_OFFLINE", "true")  # selenium-manager must not download anything
    from selenium import webdriver
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    for flag in FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}")
    options.binary_location = str(CHROMIUM)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    browser = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    browser.set_script_timeout(30)
    OUT.mkdir(parents=True, exist_ok=True)
    try:
        yield browser
    finally:
        browser.quit()


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Iterator[LiveServer]:
    """The server of the view tests, seeded (see the module docstring)."""
    _need_browser()
    root = tmp_path_factory.mktemp("ui-memory")
    seed_journal(root, "Diary", JOURNAL_TURNS)
    seed_persona(root, "Lan")
    embeddings = request.getfixturevalue("embedding_service") if MODEL.is_file() else None
    with FakeLLM() as llm:
        llm.on(
            "synthesize_reflection",
            {
                "reflection": {
                    "text": "Master enjoys windy days outdoors",
                    "entity": "master",
                    "time_scope": "pattern",
                    "event_start_at": None,
                    "event_end_at": None,
                }
            },
        )
        settings = make_settings(root, llm_base_url=llm.base_url, llm_model="fake")
        with LiveServer(settings, embeddings=embeddings) as srv:
            srv.post(
                "/cache/Lan",
                json={
                    "input_history": [
                        {"role": "system", "content": "Earlier: Master talked about kites all spring."},
                        {"role": "user", "content": "The wind was strong at the beach today"},
                        {"role": "assistant", "content": "Did your kite fly well?"},
                    ]
                },
            )
            kites = [{"text": f"Master flew a kite at the {p}", "importance": 7} for p in ("beach", "park", "hill", "field", "river")]
            extra = [
                {"text": "Master owns a red bicycle", "importance": 5, "entity": "master", "event_start_at": "2026-04-01T00:00:00+00:00"}
            ]
            assert srv.post("/api/characters/Lan/facts", json={"facts": kites + extra}).status_code == 200
            assert srv.post("/reflect/Lan").json()["reflection"] is not None
            yield srv


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, dict[str, float]]]:
    """A server whose only character holds 100,000 facts (no embeddings, no model), already
    activated: the activation (loading and indexing 100,000 facts) is timed here, through
    the API, and the browser measures the page itself."""
    _need_browser()
    root = tmp_path_factory.mktemp("ui-big")
    started = time.perf_counter()
    seed_facts(root, "Big", BIG_FACTS, archived=500)
    timings = {"seed_s": round(time.perf_counter() - started, 2)}
    # Activation of 100,000 facts can take longer than the default 30 s on a busy machine.
    with LiveServer(make_settings(root, ask_timeout_seconds=300)) as srv:
        started = time.perf_counter()
        assert srv.get("/api/browse/Big/facts", params={"limit": 1}).json()["total"] == BIG_FACTS
        timings["activation_s"] = round(time.perf_counter() - started, 2)
        yield srv, timings


# -- helpers -----------------------------------------------------------------------------
def _wait(condition: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    return wait_for(condition, timeout=timeout, what=what)


def _seq(driver: Any) -> int:
    return int(driver.execute_script("return Number(document.getElementById('view').dataset.seq || 0)"))


def _ready(driver: Any, after: int) -> bool:
    return bool(
        driver.execute_script(
            "const m = document.getElementById('view'); return m && Number(m.dataset.seq || 0) > arguments[0] && m.dataset.ready === 'true'",
            after,
        )
    )


def open_view(driver: Any, srv: LiveServer, view: str, character: str | None = None, query: str = "") -> None:
    """Load /ui on ``view`` for ``character`` and wait until the view has rendered."""
    if not driver.current_url.startswith(srv.url + "/ui/"):
        driver.get(srv.url + "/ui/")
        _wait(lambda: _ready(driver, 0), "the page rendered")
    if character is not None:
        driver.execute_script("localStorage.setItem('nekomem.character', arguments[0])", character)
        current = driver.execute_script("return document.getElementById('character').value")
        if current != character:
            before = _seq(driver)
            driver.execute_script(
                "const s = document.getElementById('character'); s.value = arguments[0]; s.dispatchEvent(new Event('change'))", character
            )
            _wait(lambda: _ready(driver, before), f"{character} selected")
    before = _seq(driver)
    driver.execute_script("location.hash = arguments[0]", f"#/{view}" + (f"?{query}" if query else ""))
    _wait(lambda: _ready(driver, before), f"view {view} rendered")
    assert driver.find_element("id", "status").text == "", driver.find_element("id", "status").text


def click(driver: Any, css: str) -> None:
    before = _seq(driver)
    driver.find_element("css selector", css).click()
    _wait(lambda: _ready(driver, before), f"render after clicking {css}")


def shot(driver: Any, name: str) -> Path:
    """A full-page PNG of the current view under test-output/ui/."""
    path = OUT / f"{name}.png"
    width, height = driver.execute_script(
        "return [document.documentElement.scrollWidth, Math.min(6000, document.documentElement.scrollHeight)]"
    )
    data = driver.execute_cdp_cmd(
        "Page.captureScreenshot",
        {"format": "png", "captureBeyondViewport": True, "clip": {"x": 0, "y": 0, "width": width, "height": height, "scale": 1}},
    )
    path.write_bytes(base64.b64decode(data["data"]))
    return path


def texts(driver: Any, css: str) -> list[str]:
    return [e.text for e in driver.find_elements("css selector", css)]


# -- tests -------------------------------------------------------------------------------
def test_every_view_renders(driver: Any, site: LiveServer) -> None:
    open_view(driver, site, "characters")
    rows = {e.get_attribute("data-name"): e.text for e in driver.find_elements("css selector", "[data-test=character-row]")}
    assert set(rows) == {"Diary", "Lan"}
    assert "10000" in rows["Diary"] and "active" in rows["Lan"]
    shot(driver, "characters")

    open_view(driver, site, "recent", "Lan")
    assert texts(driver, "[data-test=turn-text]") == [
        "Earlier: Master talked about kites all spring.",
        "The wind was strong at the beach today",
        "Did your kite fly well?",
    ]
    assert "memo" in driver.find_elements("css selector", "[data-test=turn-row]")[0].get_attribute("class")
    shot(driver, "recent")

    open_view(driver, site, "facts", "Lan")
    assert len(driver.find_elements("css selector", "[data-test=fact-row]")) == 6
    shot(driver, "facts")

    open_view(driver, site, "persona", "Lan")
    assert len(driver.find_elements("css selector", "[data-test=protected]")) == 1
    assert "Master switched to coffee in the mornings" in driver.find_element("css selector", "[data-test=corrections]").text
    shot(driver, "persona")

    open_view(driver, site, "context", "Lan")
    sections = {
        e.get_attribute("data-section"): int(e.get_attribute("data-tokens"))
        for e in driver.find_elements("css selector", "[data-test=context-section]")
    }
    assert {"persona", "reflections", "recent"} <= set(sections) and all(n > 0 for n in sections.values())
    page_text = driver.find_element("css selector", "[data-test=context-text]").get_attribute("textContent")
    assert page_text == site.get("/new_dialog/Lan").text  # the exact text, section by section
    shot(driver, "context")

    open_view(driver, site, "server")
    words = texts(driver, "[data-test=health-words] li")
    assert len(words) == 4 and "nekomem" in words[0]
    shot(driver, "server")
    # No script error and no Content-Security-Policy violation on any view.
    severe = [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    assert not severe, severe


def test_confirm_reflection_changes_status_and_chart(driver: Any, site: LiveServer) -> None:
    open_view(driver, site, "reflections", "Lan")
    card = driver.find_element("css selector", "[data-test=column-pending] [data-test=reflection-card]")
    rid = card.get_attribute("data-id")
    click(driver, f"[data-id='{rid}'] [data-test=show-evidence]")
    chart = driver.find_element("css selector", "[data-test=evidence-chart]")
    events_before, net_before = int(chart.get_attribute("data-events")), float(chart.get_attribute("data-net"))
    assert driver.find_element("css selector", "[data-test=detail-status]").text == "Pending"
    sources = site.get("/api/characters/Lan/reflections").json()["items"][0]["source_fact_ids"]
    assert len(sources) >= 5 and len(driver.find_elements("css selector", "[data-test=source-facts] li")) == len(sources)
    for line in ("threshold-confirm", "threshold-promote", "threshold-archive", "line-net", "line-rein", "line-disp"):
        assert driver.find_elements("css selector", f"[data-test={line}]"), line
    before = _seq(driver)
    driver.find_element("css selector", f"[data-id='{rid}'] [data-test=confirm]").click()
    _wait(
        lambda: _ready(driver, before) and driver.find_elements("css selector", f"[data-test=column-confirmed] [data-id='{rid}']"),
        "the card moved to Confirmed",
    )
    assert driver.find_element("css selector", "[data-test=detail-status]").text == "Confirmed"
    chart = driver.find_element("css selector", "[data-test=evidence-chart]")
    assert int(chart.get_attribute("data-events")) == events_before + 1
    assert float(chart.get_attribute("data-net")) > net_before
    assert site.get("/api/characters/Lan/reflections", params={"status": "confirmed"}).json()["items"][0]["id"] == rid
    shot(driver, "reflections")


def test_edit_fact_then_find_it_in_the_recall_playground(driver: Any, site: LiveServer) -> None:
    open_view(driver, site, "facts", "Lan", "q=bicycle")
    rows = driver.find_elements("css selector", "[data-test=fact-row]")
    assert len(rows) == 1
    fid = rows[0].get_attribute("data-id")
    driver.find_element("css selector", "[data-test=fact-edit]").click()
    area = driver.find_element("css selector", "[data-test=fact-edit-text]")
    area.clear()
    area.send_keys("Master rides a blue tandem bicycle on Sundays")
    importance = driver.find_element("css selector", "[data-test=fact-edit-importance]")
    importance.clear()
    importance.send_keys("9")
    click(driver, "[data-test=fact-save]")
    assert texts(driver, "[data-test=fact-text]") == ["Master rides a blue tandem bicycle on Sundays"]
    events = [json.loads(line) for line in (Path(site.runtime.memory_root) / "Lan" / "events.ndjson").read_text().splitlines()]
    assert any(
        e["type"] == "fact.updated" and e["payload"]["fact"]["id"] == fid and e["payload"]["fact"]["importance"] == 9 for e in events
    )

    open_view(driver, site, "recall", "Lan", "query=tandem")
    fused = driver.find_elements("css selector", "[data-test=fused] [data-test=hit]")
    assert fused and fused[0].get_attribute("data-id") == fid
    lexical_ids = [e.get_attribute("data-id") for e in driver.find_elements("css selector", "[data-test=leg-lexical] [data-test=hit]")]
    assert fid in lexical_ids
    shot(driver, "recall")

    # A time box that excludes it: the lexical hit is shown as removed by the time window.
    open_view(driver, site, "recall", "Lan", "query=tandem&time=2020-01-01")
    removed = driver.find_elements("css selector", "[data-test=leg-lexical] tr.removed")
    assert removed and "time window" in removed[0].text
    assert not driver.find_elements("css selector", "[data-test=fused] [data-test=hit]")


def test_jump_from_fact_to_its_turns(driver: Any, site: LiveServer) -> None:
    open_view(driver, site, "facts", "Lan", "q=beach")
    click(driver, "[data-test=fact-source]")
    assert driver.execute_script("return location.hash").startswith("#/journal?")
    # The facts were stored after the turns: the newest turns up to the fact's time are its source.
    rows = texts(driver, "[data-test=journal-row]")
    assert rows and "Did your kite fly well?" in rows[0] and "The wind was strong at the beach today" in rows[1]


def test_page_through_a_journal_of_10000_turns(driver: Any, site: LiveServer) -> None:
    open_view(driver, site, "journal", "Diary")
    pager = "[data-test=journal-pager] "
    assert driver.find_element("css selector", pager + "[data-test=range]").text == "1–50 / 10000"
    click(driver, pager + "[data-test=next]")
    click(driver, pager + "[data-test=next]")
    assert driver.find_element("css selector", pager + "[data-test=range]").text == "101–150 / 10000"
    first = driver.find_element("css selector", "[data-test=journal-row]").text
    assert first.startswith("9900 ") and "journal line 09899" in first
    click(driver, pager + "[data-test=prev]")
    assert driver.find_element("css selector", pager + "[data-test=range]").text == "51–100 / 10000"
    box = driver.find_element("css selector", "[data-test=journal-q]")
    box.send_keys("kites")
    click(driver, "[data-test=journal-apply]")
    assert driver.find_element("css selector", pager + "[data-test=range]").text == "1–50 / 1000"
    assert all("about kites" in t for t in texts(driver, "[data-test=journal-row]"))
    shot(driver, "journal")


def test_persona_suppress_and_recent_edit(driver: Any, site: LiveServer) -> None:
    open_view(driver, site, "persona", "Lan")
    click(driver, "[data-id=per_song] [data-test=suppress]")
    assert driver.find_elements("css selector", "[data-id=per_song] [data-test=suppressed]")
    assert not driver.find_elements("css selector", "[data-id=card_1] [data-test=suppress]")  # protected
    click(driver, "[data-id=per_song] [data-test=unsuppress]")
    assert not driver.find_elements("css selector", "[data-id=per_song] [data-test=suppressed]")

    open_view(driver, site, "recent", "Lan")
    driver.find_elements("css selector", "[data-test=turn-edit-button]")[2].click()
    area = driver.find_element("css selector", "[data-test=turn-edit]")
    area.clear()
    area.send_keys("Did your red kite fly well?")
    click(driver, "[data-test=turn-save]")
    assert texts(driver, "[data-test=turn-text]")[2] == "Did your red kite fly well?"
    assert site.get("/api/memory/review_config").json() == {"enabled": True}
    driver.find_element("css selector", "[data-test=review-switch]").click()
    _wait(lambda: site.get("/api/memory/review_config").json() == {"enabled": False}, "review switch saved")


def test_language_switch(driver: Any, site: LiveServer) -> None:
    open_view(driver, site, "facts", "Lan")
    assert driver.find_element("css selector", "nav a[data-view=facts]").text == "Facts"
    for lang, word, column in (("zh", "事实", "文本"), ("ja", "事実", "テキスト")):
        before = _seq(driver)
        driver.execute_script(
            "const s = document.getElementById('lang'); s.value = arguments[0]; s.dispatchEvent(new Event('change'))", lang
        )
        _wait(lambda before=before: _ready(driver, before), f"re-rendered in {lang}")
        assert driver.find_element("css selector", "nav a[data-view=facts]").text == word
        assert driver.find_element("css selector", "[data-test=facts] th").text == column
        assert driver.execute_script("return document.documentElement.lang").startswith(lang)
        shot(driver, f"facts_{lang}")
    before = _seq(driver)
    driver.execute_script("const s = document.getElementById('lang'); s.value = 'en'; s.dispatchEvent(new Event('change'))")
    _wait(lambda: _ready(driver, before), "back in English")


def test_facts_view_first_render_with_100000_facts(driver: Any, big: tuple[LiveServer, dict[str, float]]) -> None:
    """Time to first render of the Facts view with 100,000 facts (reported, not asserted):
    a fresh page load straight onto #/facts, until the first page of facts is on screen."""
    srv, timings = big
    driver.get(srv.url + "/ui/#/server")  # an origin for localStorage
    _wait(lambda: _ready(driver, 0), "the page rendered")
    driver.execute_script("localStorage.setItem('nekomem.character', 'Big'); localStorage.setItem('nekomem.lang', 'en')")
    for run in ("first", "second"):
        driver.get("about:blank")
        started = time.perf_counter()
        driver.get(srv.url + "/ui/#/facts")
        _wait(
            lambda: driver.execute_script(
                "const m = document.getElementById('view'); return m.dataset.view === 'facts' && m.dataset.ready === 'true'"
            ),
            "facts rendered",
            timeout=120,
        )
        assert driver.find_element("id", "status").text == ""
        timings[f"{run}_render_wall_ms"] = round((time.perf_counter() - started) * 1000, 1)
        timings[f"{run}_render_since_navigation_ms"] = round(float(driver.execute_script("return performance.now()")), 1)
        timings[f"{run}_view_ms"] = float(driver.find_element("css selector", "#view > div").get_attribute("data-render-ms"))
        assert driver.find_element("css selector", "[data-test=facts-pager] [data-test=range]").text == f"1–50 / {BIG_FACTS}"
        assert driver.find_element("css selector", "[data-test=archived-pager] [data-test=range]").text == "1–20 / 500"
    # A filtered page is answered by the server, not the browser.
    before = _seq(driver)
    started = time.perf_counter()
    driver.execute_script("location.hash = '#/facts?importance_min=10&entity=neko&absorbed=false'")
    _wait(lambda: _ready(driver, before), "filtered facts rendered")
    timings["filtered_render_wall_ms"] = round((time.perf_counter() - started) * 1000, 1)
    total = int(driver.find_element("css selector", "[data-test=facts-pager] [data-test=range]").text.split("/")[1])
    assert total == sum(1 for i in range(BIG_FACTS) if 1 + i % 10 >= 10 and i % 3 == 1 and i % 7 != 0)
    shot(driver, "facts_100k")
    (OUT / "facts_100k_timing.json").write_text(json.dumps(timings, indent=1))
    print(f"\nFacts view with 100,000 facts: {timings}")


def test_ui_assets_are_package_files() -> None:
    """The page is served from package data; nothing points outside the server."""
    static = ROOT / "src" / "nekomem" / "ui" / "static"
    for path in static.iterdir():
        text = path.read_text(encoding="utf-8")
        assert "http://" not in text.replace("http://www.w3.org/2000/svg", "") and "https://" not in text, path.name
