"""The memory browser's error and empty states in a real headless Chromium, in each of its
languages: the server down, a missing and a wrong token, no model configured, a failing
model, empty columns, adding and editing persona entries, group-chat persona sections.
Screenshots go to /tmp/shots/ (the README's "what a new user sees")."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from nekomem.domain.records import PersonaEntry, persona_to_disk
from nekomem.stores.atomic import atomic_write_json
from nekomem.stores.layout import CharacterPaths
from tests import test_ui_browser as ui
from tests.support.live import LiveServer, make_settings
from tests.test_ui_browser import _ready, _seq, _wait, open_view, shot

driver = ui.driver  # the module's headless Chromium fixture, shared

SHOTS = Path("/tmp/shots")
LANGS = ("en", "zh", "ja")
# A phrase of each message in each language (the whole sentences live in i18n.js).
SERVER_DOWN = {"en": "cannot be reached", "zh": "无法连接", "ja": "接続できません"}
NEED_TOKEN = {"en": "asks for an API token", "zh": "服务器需要 API 令牌", "ja": "トークンを求めています"}
WRONG_TOKEN = {"en": "refused this API token", "zh": "拒绝了此 API 令牌", "ja": "トークンを拒否しました"}
NO_MODEL = {"en": "No language model is configured", "zh": "未配置语言模型", "ja": "言語モデルが設定されていません"}
FAILING = {"en": "The language model is failing", "zh": "语言模型出错", "ja": "言語モデルが失敗しています"}
EMPTY_PENDING = {"en": "No pending reflections", "zh": "没有待定的反思", "ja": "保留中のリフレクションはありません"}
GROUP = {"en": "Group chat qq:123456", "zh": "群聊 qq:123456", "ja": "グループチャット qq:123456"}


def save(driver: Any, name: str) -> Path:
    SHOTS.mkdir(parents=True, exist_ok=True)
    path = shot(driver, name)
    target = SHOTS / path.name
    target.write_bytes(path.read_bytes())
    return target


def set_lang(driver: Any, lang: str) -> None:
    before = _seq(driver)
    driver.execute_script("const s = document.getElementById('lang'); s.value = arguments[0]; s.dispatchEvent(new Event('change'))", lang)
    _wait(lambda: _ready(driver, before), f"re-rendered in {lang}")


def rerender(driver: Any, view: str) -> None:
    before = _seq(driver)
    driver.execute_script("location.hash = arguments[0]", f"#/{view}?n={before}")
    _wait(lambda: _ready(driver, before), f"view {view} rendered")


def status_text(driver: Any) -> str:
    return driver.find_element("id", "status").text


def banner(driver: Any) -> tuple[str, str]:
    return driver.execute_script("const b = document.getElementById('banner'); return [b.hidden ? '' : b.dataset.kind, b.textContent]")


@pytest.fixture(autouse=True)
def _english_after(driver: Any) -> Any:
    yield
    driver.execute_script("localStorage.setItem('nekomem.lang', 'en'); sessionStorage.clear()")


def test_server_down_says_so_in_every_language(driver: Any, tmp_path: Path) -> None:
    with LiveServer(make_settings(tmp_path)) as srv:
        srv.post("/cache/Mio", json={"input_history": [{"role": "user", "content": "hello"}]})
        open_view(driver, srv, "facts", "Mio")
    # The page stays; every call now fails to connect.
    for lang in LANGS:
        set_lang(driver, lang)
        rerender(driver, "facts")
        text = status_text(driver)
        assert SERVER_DOWN[lang] in text and "TypeError" not in text and "Failed to fetch" not in text, text
        save(driver, f"ui_server_down_{lang}")


def test_a_missing_and_a_wrong_token_are_told_apart(driver: Any, tmp_path: Path) -> None:
    with LiveServer(make_settings(tmp_path, api_token="the-right-token")) as srv:
        srv.post(
            "/cache/Mio",
            json={"input_history": [{"role": "user", "content": "hello"}]},
            headers={"Authorization": "Bearer the-right-token"},
        )
        for lang in LANGS:
            driver.get(srv.url + "/ui/")
            driver.execute_script("sessionStorage.clear(); localStorage.setItem('nekomem.lang', arguments[0])", lang)
            driver.get(srv.url + f"/ui/?lang={lang}#/facts")  # a new query: a fresh load, not a fragment change
            _wait(lambda: _ready(driver, 0), "the page rendered")
            _wait(lambda lang=lang: NEED_TOKEN[lang] in status_text(driver), f"the missing-token message ({lang})")
            assert driver.find_element("id", "token-box").is_displayed()
            for token, expected in (("a-wrong-token", WRONG_TOKEN[lang]), ("the-right-token", None)):
                box = driver.find_element("id", "token-input")
                box.clear()
                box.send_keys(token)
                before = _seq(driver)
                driver.find_element("id", "token-save").click()
                _wait(lambda before=before: _ready(driver, before), "re-rendered with the token")
                if expected is None:
                    assert status_text(driver) == "" and driver.find_elements("css selector", "[data-test=facts]")
                else:
                    _wait(lambda expected=expected: expected in status_text(driver), f"the wrong-token message ({lang})")
                    assert NEED_TOKEN[lang] not in status_text(driver)


def test_no_model_banner_empty_columns_and_persona_editing(driver: Any, tmp_path: Path) -> None:
    paths = CharacterPaths(tmp_path, "Mio")
    paths.ensure()
    group = "@subject/group_chat:qq:123456"
    scoped = {"subject_kind": "group_chat", "subject_id": "qq:123456", "scope": "group_chat:qq:123456"}
    atomic_write_json(
        paths.persona,
        persona_to_disk(
            {
                "neko": [PersonaEntry(id="card_1", text="Mio likes rain", source="character_card", protected=True)],
                group: [PersonaEntry(id="grp_1", text="The group meets on Fridays", source="reflection", **scoped)],
            }
        ),
    )
    with LiveServer(make_settings(tmp_path)) as srv:  # no model configured
        srv.post("/cache/Mio", json={"input_history": [{"role": "user", "content": "I adopted a cat named Pixel"}]})
        open_view(driver, srv, "reflections", "Mio")
        for lang in LANGS:
            set_lang(driver, lang)
            kind, text = banner(driver)
            assert kind == "no-model" and NO_MODEL[lang] in text, text
            columns = driver.find_elements("css selector", "[data-test=column-pending] [data-test=empty-explained]")
            assert len(columns) == 1 and EMPTY_PENDING[lang] in columns[0].text
            assert len(driver.find_elements("css selector", ".column [data-test=empty-explained]")) == 5
            save(driver, f"ui_no_model_{lang}")
            rerender(driver, "facts")
            assert driver.find_elements("css selector", "[data-test=empty-explained]")
            rerender(driver, "persona")
            headings = [e.text for e in driver.find_elements("css selector", "[data-test=persona-heading]")]
            assert any(GROUP[lang] in h for h in headings) and not any("@subject" in h for h in headings), headings
            rerender(driver, "reflections")
        set_lang(driver, "en")

        # Add an entry, then edit it.
        rerender(driver, "persona")
        driver.find_element("css selector", "[data-test=persona-new-text]").send_keys("Mio naps in the sun")
        before = _seq(driver)
        driver.find_element("css selector", "[data-test=persona-add-button]").click()
        _wait(lambda: _ready(driver, before), "re-rendered after adding")
        rows = srv.get("/api/characters/Mio/persona").json()["items"]
        added = next(r for r in rows if r["text"] == "Mio naps in the sun")
        assert added["entity"] == "neko" and added["protected"]
        driver.find_element("css selector", f"[data-id='{added['id']}'] [data-test=persona-edit]").click()
        field = driver.find_element("css selector", f"[data-id='{added['id']}'] [data-test=persona-edit-input]")
        field.clear()
        field.send_keys("Mio naps in the afternoon sun")
        before = _seq(driver)
        driver.find_element("css selector", f"[data-id='{added['id']}'] [data-test=persona-edit-save]").click()
        _wait(lambda: _ready(driver, before), "re-rendered after editing")
        texts = {r["id"]: r["text"] for r in srv.get("/api/characters/Mio/persona").json()["items"]}
        assert texts[added["id"]] == "Mio naps in the afternoon sun"
        assert f"[{added['id']}]" not in driver.find_element("css selector", f"[data-id='{added['id']}'] [data-test=persona-text]").text
        assert (
            driver.find_element("css selector", f"[data-id='{added['id']}'] [data-test=persona-text]").text
            == "Mio naps in the afternoon sun"
        )


def test_a_failing_model_in_the_banner_the_server_view_and_health(driver: Any, tmp_path: Path, fake_llm: Any) -> None:
    fake_llm.set_delay(None, 600.0)  # hangs; each request times out after a second
    settings = make_settings(
        tmp_path,
        llm_base_url=fake_llm.base_url,
        llm_model="fake",
        llm_timeout_seconds=1.0,
        longterm_extract_timeout_seconds=1.0,
        llm_max_retries=0,
        powerful_memory_default=False,
        review_enabled=False,
        outbox_retry_delay_seconds=0.0,
    )
    with LiveServer(settings) as srv:
        srv.post("/cache/Mio", json={"input_history": [{"role": "user", "content": "I adopted a cat"}]})
        _wait(lambda: srv.get("/health").json()["llm"]["state"] == "failing", "the failing tier")
        driver.get(srv.url + "/health")
        save(driver, "health_failing_model")
        open_view(driver, srv, "server", "Mio")
        for lang in LANGS:
            set_lang(driver, lang)
            kind, text = banner(driver)
            assert kind == "model-failing" and FAILING[lang] in text and "summary" in text, text
            row = driver.find_element("css selector", "[data-test=tier-row][data-tier=summary]")
            assert row.get_attribute("data-state") == "failing"
            assert "timed out" in row.find_element("css selector", "[data-test=tier-error]").text
            save(driver, f"ui_model_failing_{lang}")
        set_lang(driver, "en")
        fake_llm.set_delay(None, 0.0)
        srv.post("/cache/Mio", json={"input_history": [{"role": "user", "content": "her name is Pixel"}]})
        _wait(lambda: srv.get("/health").json()["llm"]["state"] == "ok", "the recovered tier")
        rerender(driver, "server")
        row = driver.find_element("css selector", "[data-test=tier-row][data-tier=summary]")
        assert row.get_attribute("data-state") == "ok" and banner(driver)[0] == ""
        error = row.find_element("css selector", "[data-test=tier-error]")
        assert "recovered from" in error.text and "warn" not in (error.get_attribute("class") or "")
