"""Turns stored before a model that can extract facts was configured are mined once one is
(issue 27, item 2): on a real server started without a model, then again with the loopback
fake model, in bounded batches, with progress in /health and the browser's character
listing, and not at all when the backlog is switched off."""

from __future__ import annotations

import json
import re

import pytest

from tests.support.fake_llm import FakeLLM, last_user_text
from tests.support.live import LiveServer, make_settings
from tests.support.waiting import quiesce, wait_for

NAME = "Lan"
PETS = "Pixel Mochi Biscuit Nori Tofu Pudding Sesame Waffle".split()
_PET = re.compile(r"a cat named (\w+)")
BATCH_ROWS = 4  # two turns (a user and an assistant row each) per backlog batch


def name_each_cat(request: dict) -> dict:
    """A scripted extractor: one fact per cat the conversation names."""
    found = _PET.findall(last_user_text(request))
    return {"facts": [{"text": f"Master has a cat named {pet}", "importance": 6, "entity": "master"} for pet in dict.fromkeys(found)]}


def fact_texts(srv: LiveServer) -> list[str]:
    return [f["text"] for f in srv.get(f"/api/characters/{NAME}/facts", params={"limit": 100}).json()["items"]]


def backlog_in_health(srv: LiveServer) -> dict:
    return srv.get("/health").json()["fact_backlog"]


def backlog_in_browser(srv: LiveServer) -> int:
    rows = srv.get("/api/browse/characters").json()["characters"]
    return next(r["fact_backlog"] for r in rows if r["name"] == NAME)


@pytest.mark.parametrize("powerful", [True, False], ids=["batch-extraction", "one-per-record"])
def test_turns_stored_without_a_model_are_mined_in_bounded_batches_once_one_is_configured(tmp_path, fake_llm: FakeLLM, powerful: bool):
    fake_llm.on("extract_facts", name_each_cat)
    base = {"embedding_enabled": False, "fact_backlog_batch_rows": BATCH_ROWS, "powerful_memory_default": powerful}

    # 1. No model: the turns are stored, nothing can mine them; the backlog shows.
    with LiveServer(make_settings(tmp_path, **base)) as srv:
        for pet in PETS:
            r = srv.post(
                f"/cache/{NAME}",
                json={
                    "input_history": [
                        {"role": "user", "content": f"I just adopted a cat named {pet}"},
                        {"role": "assistant", "content": "Lovely!"},
                    ]
                },
            )
            assert r.status_code == 200, r.text
        quiesce(srv.runtime, NAME)
        assert backlog_in_health(srv) == {"enabled": True, "rows_remaining": 2 * len(PETS), "characters": {NAME: 2 * len(PETS)}}
        assert backlog_in_browser(srv) == 2 * len(PETS)
        assert fact_texts(srv) == []

    model = {"llm_base_url": fake_llm.base_url, "llm_model": "fake"}

    # 2. A model, with the backlog switched off: it is left untouched, no model call.
    with LiveServer(make_settings(tmp_path, **base, **model, fact_backlog_enabled=False)) as srv:
        srv.get(f"/api/characters/{NAME}/facts")  # activates the character
        quiesce(srv.runtime, NAME)
        assert fake_llm.calls("extract_facts") == []
        assert fact_texts(srv) == []
        assert backlog_in_health(srv)["rows_remaining"] == 2 * len(PETS)
        assert backlog_in_health(srv)["enabled"] is False

    # 3. A model and the default: the backlog is mined at start-up, nothing asked.
    with LiveServer(make_settings(tmp_path, **base, **model)) as srv:
        wait_for(lambda: len(fact_texts(srv)) == len(PETS), what="a fact for every cat of the backlog")
        wait_for(lambda: backlog_in_health(srv)["rows_remaining"] == 0, what="the backlog to reach 0")
        assert backlog_in_health(srv)["characters"] == {}
        assert backlog_in_browser(srv) == 0
        quiesce(srv.runtime, NAME)
        assert sorted(fact_texts(srv)) == sorted(f"Master has a cat named {pet}" for pet in PETS)

    calls = [_PET.findall(last_user_text(c["body"])) for c in fake_llm.calls("extract_facts")]
    # Bounded batches, oldest first, each turn once: one model call per batch of four rows.
    assert calls == [PETS[i : i + 2] for i in range(0, len(PETS), 2)]
    facts = json.loads((tmp_path / NAME / "facts.json").read_text(encoding="utf-8"))
    assert any("Pixel" in json.dumps(f) for f in facts)


def test_a_failing_model_backs_the_backlog_off_instead_of_calling_on_a_tick(tmp_path, fake_llm: FakeLLM):
    failing = [True]

    def flaky(request: dict) -> dict:
        if failing[0]:
            raise RuntimeError("the model is down")  # the fake server answers 500
        return name_each_cat(request)

    fake_llm.on("extract_facts", flaky)
    base = {"embedding_enabled": False, "fact_backlog_batch_rows": 2}
    with LiveServer(make_settings(tmp_path, **base)) as srv:
        for pet in PETS[:2]:
            r = srv.post(
                f"/cache/{NAME}",
                json={
                    "input_history": [
                        {"role": "user", "content": f"I just adopted a cat named {pet}"},
                        {"role": "assistant", "content": "Lovely!"},
                    ]
                },
            )
            assert r.status_code == 200, r.text
        quiesce(srv.runtime, NAME)

    # A backoff long enough to flip the model back before the retry, short enough to wait.
    model = {"llm_base_url": fake_llm.base_url, "llm_model": "fake", "longterm_task_backoff_base_seconds": 3.0}
    with LiveServer(make_settings(tmp_path, **base, **model)) as srv:
        wait_for(lambda: fake_llm.calls("extract_facts"), what="the first backlog call")
        quiesce(srv.runtime, NAME)  # the failed call and the client's own bounded retries
        failed = len(fake_llm.calls("extract_facts"))
        assert fact_texts(srv) == []
        assert backlog_in_health(srv)["rows_remaining"] == 4
        failing[0] = False
        wait_for(lambda: backlog_in_health(srv)["rows_remaining"] == 0, what="the backlog mined after the backoff")
        assert sorted(fact_texts(srv)) == sorted(f"Master has a cat named {pet}" for pet in PETS[:2])
    # After the failure: one retry of the failed batch, then the next batch; no call on a tick.
    answered = fake_llm.calls("extract_facts")[failed:]
    assert [_PET.findall(last_user_text(c["body"])) for c in answered] == [[PETS[0]], [PETS[1]]]


def test_a_batch_the_outbox_gives_up_does_not_stall_the_rest_of_the_backlog(tmp_path, fake_llm: FakeLLM):
    """One extraction per record (powerful memory off): a batch whose record is
    dead-lettered after outbox_max_attempts is given up, and the next batch follows."""

    def pixel_breaks_the_model(request: dict) -> dict:
        if "Pixel" in last_user_text(request):
            raise RuntimeError("the model chokes on this batch")  # the fake server answers 500
        return name_each_cat(request)

    fake_llm.on("extract_facts", pixel_breaks_the_model)
    base = {"embedding_enabled": False, "fact_backlog_batch_rows": 2, "powerful_memory_default": False}
    with LiveServer(make_settings(tmp_path, **base)) as srv:
        for pet in PETS[:2]:
            r = srv.post(
                f"/cache/{NAME}",
                json={
                    "input_history": [
                        {"role": "user", "content": f"I just adopted a cat named {pet}"},
                        {"role": "assistant", "content": "Lovely!"},
                    ]
                },
            )
            assert r.status_code == 200, r.text
        quiesce(srv.runtime, NAME)

    model = {"llm_base_url": fake_llm.base_url, "llm_model": "fake", "outbox_max_attempts": 2, "outbox_retry_delay_seconds": 0.2}
    with LiveServer(make_settings(tmp_path, **base, **model)) as srv:
        wait_for(lambda: backlog_in_health(srv)["rows_remaining"] == 0, what="the backlog past the given-up batch")
        wait_for(lambda: fact_texts(srv) == [f"Master has a cat named {PETS[1]}"], what="the next batch's fact")
        quiesce(srv.runtime, NAME)
    asked = [_PET.findall(last_user_text(c["body"])) for c in fake_llm.calls("extract_facts")]
    # Pixel's batch: two outbox attempts (each with the client's own bounded retries), then Mochi's once.
    assert asked[-1] == [PETS[1]] and asked.count([PETS[1]]) == 1
    assert set(map(tuple, asked[:-1])) == {(PETS[0],)}
