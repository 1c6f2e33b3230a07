"""Batch fact extraction (powerful memory on) over real HTTP: every acknowledged user turn
is extracted within the triggers, in bounded batches, however the turns were split across
requests (issue 8, item 1)."""

from __future__ import annotations

import re
from datetime import datetime, timezone

import pytest

from nekomem.actors.messages import OutboxState
from nekomem.runtime.clock import ManualClock
from tests.support.fake_llm import FakeLLM, last_user_text
from tests.support.live import LiveServer, make_settings
from tests.support.waiting import quiesce, wait_for

NAME = "Lan"
# Distinct words, so that the lexical near-duplicate check keeps every fact apart.
TEAS = (
    "jasmine oolong matcha sencha rooibos chamomile earlgrey darjeeling assam pekoe genmaicha hojicha "
    "pu-erh yerba mint ginger hibiscus lemongrass tulsi chai bancha gyokuro lapsang keemun nilgiri"
).split()
_TURN = re.compile(r"tea #(\d+) ")


def turn_text(n: int) -> str:
    return f"My tea #{n} is {TEAS[n - 1]} and I drink it every evening"


TURNS = [turn_text(n) for n in range(1, 13)]


def one_fact_per_turn(request: dict) -> dict:
    """A scripted extractor: one fact for each preference line in the conversation."""
    found = sorted({int(n) for n in _TURN.findall(last_user_text(request))})
    return {"facts": [{"text": f"Master loves {TEAS[n - 1]}", "importance": 6, "entity": "master"} for n in found]}


def turns_in(call: dict) -> list[int]:
    return sorted({int(n) for n in _TURN.findall(last_user_text(call["body"]))})


def outbox(srv: LiveServer) -> dict:
    return srv.runtime.registry.ask_sync(NAME, "outbox", lambda reply: OutboxState(reply=reply))


def fact_total(srv: LiveServer) -> int:
    return srv.get(f"/api/characters/{NAME}/facts").json()["total"]


def post_turns_one_per_request(srv: LiveServer, texts: list[str]) -> None:
    for text in texts:
        r = srv.post(
            f"/cache/{NAME}", json={"input_history": [{"role": "user", "content": text}, {"role": "assistant", "content": "Nice!"}]}
        )
        assert r.status_code == 200, r.text


def test_twelve_turns_one_per_request_are_all_extracted_within_the_idle_trigger(tmp_path, fake_llm: FakeLLM):
    fake_llm.on("extract_facts", one_fact_per_turn)
    clock = ManualClock(datetime(2026, 5, 1, 20, 0, tzinfo=timezone.utc))
    settings = make_settings(tmp_path, llm_base_url=fake_llm.base_url, llm_model="fake", embedding_enabled=False)
    with LiveServer(settings, clock=clock) as srv:
        post_turns_one_per_request(srv, TURNS)
        # The count trigger takes the first ten; the last two are the tail of the burst.
        wait_for(lambda: fact_total(srv) == 10, what="the count-triggered batch")
        wait_for(lambda: outbox(srv)["pending"] == 2, what="the first batch's records to finish")
        assert [turns_in(c) for c in fake_llm.calls("extract_facts")] == [list(range(1, 11))]

        clock.advance(settings.longterm.fact_extract_idle_seconds)
        quiesce(srv.runtime, NAME)  # runs what the advance made due
        wait_for(lambda: fact_total(srv) == 12, what="the tail of the burst")
        wait_for(lambda: outbox(srv)["pending"] == 0, what="every outbox record to finish")

    calls = [turns_in(c) for c in fake_llm.calls("extract_facts")]
    assert calls == [list(range(1, 11)), [11, 12]]
    assert sorted(n for call in calls for n in call) == list(range(1, 13))


def test_a_backlog_is_extracted_in_bounded_batches(tmp_path, fake_llm: FakeLLM):
    """25 turns while the model is slow to start: every turn is extracted once, no call
    carries more than fact_extract_max_batch_user_turns user turns."""
    fake_llm.on("extract_facts", one_fact_per_turn)
    clock = ManualClock(datetime(2026, 5, 1, 20, 0, tzinfo=timezone.utc))
    texts = [turn_text(n) for n in range(1, 26)]
    settings = make_settings(
        tmp_path,
        llm_base_url=fake_llm.base_url,
        llm_model="fake",
        embedding_enabled=False,
        fact_extract_every_n_turns=30,
        fact_extract_max_batch_user_turns=8,
    )
    with LiveServer(settings, clock=clock) as srv:
        post_turns_one_per_request(srv, texts)
        wait_for(lambda: outbox(srv)["parked"] == 25, what="all 25 records parked in the batch")
        assert fake_llm.calls("extract_facts") == []  # below every trigger yet
        clock.advance(settings.longterm.fact_extract_idle_seconds)  # first run: the idle rule
        quiesce(srv.runtime, NAME)  # runs what the advance made due
        wait_for(lambda: fact_total(srv) == 8, what="the first bounded batch")
        clock.advance(minutes=settings.longterm.fact_extract_interval_minutes)
        for expected in (16, 24, 25):
            quiesce(srv.runtime, NAME)  # runs what the advance made due
            wait_for(lambda expected=expected: fact_total(srv) == expected, what=f"{expected} facts")
            clock.advance(minutes=settings.longterm.fact_extract_interval_minutes)
        wait_for(lambda: outbox(srv)["pending"] == 0, what="every outbox record to finish")

    calls = [turns_in(c) for c in fake_llm.calls("extract_facts")]
    assert all(len(c) <= 8 for c in calls), calls
    assert sorted(n for call in calls for n in call) == list(range(1, 26))


def test_parked_records_are_replayed_when_the_server_restarts(tmp_path, fake_llm: FakeLLM):
    """Turns parked in the batch are still pending in the outbox: a restart extracts them."""
    fake_llm.on("extract_facts", one_fact_per_turn)
    clock = ManualClock(datetime(2026, 5, 1, 20, 0, tzinfo=timezone.utc))
    settings = make_settings(tmp_path, llm_base_url=fake_llm.base_url, llm_model="fake", embedding_enabled=False)
    with LiveServer(settings, clock=clock) as srv:
        post_turns_one_per_request(srv, TURNS[:3])
        wait_for(lambda: outbox(srv)["parked"] == 3, what="three parked records")
    assert fake_llm.calls("extract_facts") == []
    with LiveServer(settings, clock=clock) as srv:
        wait_for(lambda: outbox(srv)["parked"] == 3, what="the replayed records parked again")
        clock.advance(settings.longterm.fact_extract_idle_seconds)
        quiesce(srv.runtime, NAME)  # runs what the advance made due
        wait_for(lambda: fact_total(srv) == 3, what="the replayed turns extracted")
        wait_for(lambda: outbox(srv)["pending"] == 0, what="every outbox record to finish")


def test_a_model_outage_delays_extraction_but_loses_no_turn(tmp_path, fake_llm: FakeLLM):
    """extract_facts fails for a while: the batch stays parked and is retried after a
    growing backoff (not dead-lettered); once the model answers, every turn is extracted."""
    from tests.support.fake_llm import Reply

    fake_llm.on("extract_facts", Reply.status(503, "overloaded"))
    clock = ManualClock(datetime(2026, 5, 1, 20, 0, tzinfo=timezone.utc))
    settings = make_settings(
        tmp_path,
        llm_base_url=fake_llm.base_url,
        llm_model="fake",
        embedding_enabled=False,
        llm_max_retries=0,
        passivate_idle_seconds=7200,  # stays active through the backoff
    )
    with LiveServer(settings, clock=clock) as srv:
        post_turns_one_per_request(srv, TURNS)
        wait_for(lambda: len(fake_llm.calls("extract_facts")) == 1, what="the first (failing) extraction")
        for _ in range(8):  # 10 s steps through the first backoffs (60 s, then 120 s)
            clock.advance(10)
            quiesce(srv.runtime, NAME)  # runs what the advance made due
            outbox(srv)  # barrier: the outbox handled what the tick caused
        wait_for(lambda: len(fake_llm.calls("extract_facts")) == 2, what="one retry after the first backoff")
        assert outbox(srv)["dead"] == 0

        fake_llm.on("extract_facts", one_fact_per_turn)
        clock.advance(settings.longterm.longterm_task_backoff_max_seconds)
        quiesce(srv.runtime, NAME)  # runs what the advance made due
        wait_for(lambda: fact_total(srv) == 12, what="every turn extracted after the outage")
        wait_for(lambda: outbox(srv)["pending"] == 0, what="every outbox record to finish")
        assert outbox(srv)["dead"] == 0

    answered = [turns_in(c) for c in fake_llm.calls("extract_facts")][2:]
    assert sorted(n for call in answered for n in call) == list(range(1, 13))


@pytest.mark.parametrize("split", [[12], [6, 6], [5, 1, 1, 1, 1, 1, 1, 1], [3, 3, 3, 3]])
def test_every_turn_is_extracted_however_the_turns_are_split(tmp_path, fake_llm: FakeLLM, split: list[int]):
    fake_llm.on("extract_facts", one_fact_per_turn)
    clock = ManualClock(datetime(2026, 5, 1, 20, 0, tzinfo=timezone.utc))
    settings = make_settings(tmp_path, llm_base_url=fake_llm.base_url, llm_model="fake", embedding_enabled=False)
    with LiveServer(settings, clock=clock) as srv:
        n = 0
        for size in split:
            history = []
            for _ in range(size):
                n += 1
                history += [{"role": "user", "content": turn_text(n)}, {"role": "assistant", "content": "Nice!"}]
            assert srv.post(f"/cache/{NAME}", json={"input_history": history}).status_code == 200
        wait_for(lambda: outbox(srv)["running"] == 0, what="every record handed to the batch")
        clock.advance(settings.longterm.fact_extract_idle_seconds)
        quiesce(srv.runtime, NAME)  # runs what the advance made due
        wait_for(lambda: fact_total(srv) == 12, what="all twelve turns extracted")
        wait_for(lambda: outbox(srv)["pending"] == 0, what="every outbox record to finish")
    calls = [turns_in(c) for c in fake_llm.calls("extract_facts")]
    assert sorted(n for call in calls for n in call) == list(range(1, 13)), calls
    assert len(calls) <= 2
