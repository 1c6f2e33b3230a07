"""Path B (the AI self-disclosure pass) over real HTTP: every AI turn path A has seen is
offered to ``extract_self_disclosure`` exactly once, across a backlog longer than one
window, a restart (the persisted cursor), a failed pass (the cursor stays, the gate backs
off) and powerful memory switched off and on again (issue 23)."""

from __future__ import annotations

import collections
import re
from datetime import datetime, timezone

from nekomem.runtime.clock import ManualClock
from tests.support.fake_llm import FakeLLM, Reply, last_user_text
from tests.support.live import LiveServer, make_settings
from tests.support.waiting import quiesce, wait_for

NAME = "Lan"
LLM_ATTEMPTS = 4  # the LLM client's attempts per call (llm_max_retries + 1)
_AI = re.compile(r"my secret #(\d+) ")
_USER = re.compile(r"question #(\d+) ")


def exchange(n: int) -> dict:
    return {
        "input_history": [
            {"role": "user", "content": f"Tell me something, question #{n} please"},
            {"role": "assistant", "content": f"Well, my secret #{n} is that I collect shell {n}"},
        ]
    }


def disclose_each(request: dict) -> dict:
    """A scripted model: one self-disclosure fact per AI turn in the window."""
    found = sorted({int(n) for n in _AI.findall(last_user_text(request))})
    return {"facts": [{"text": f"Lan collects shell {n}", "importance": 5, "entity": "neko"} for n in found]}


def offered(fake: FakeLLM) -> collections.Counter[int]:
    """How often each AI turn was offered to path B."""
    counts: collections.Counter[int] = collections.Counter()
    for call in fake.calls("extract_self_disclosure"):
        counts.update(int(n) for n in _AI.findall(last_user_text(call["body"])))
    return counts


def facts_of(srv: LiveServer, source: str) -> int:
    items = srv.get(f"/api/characters/{NAME}/facts", params={"limit": 1000}).json()["items"]
    return sum(1 for f in items if f["source"] == source)


def settle(srv: LiveServer, clock: ManualClock) -> None:
    """Let the tail of path A and then the idle rule of path B run."""
    s = srv.settings.longterm
    clock.advance(s.fact_extract_idle_seconds)
    quiesce(srv.runtime, NAME)
    clock.advance(s.fact_self_disclosure_idle_seconds)
    quiesce(srv.runtime, NAME)


def wait_offered(srv: LiveServer, fake: FakeLLM, last: int) -> collections.Counter[int]:
    """Wait until AI turns 1..``last`` were all offered, then until the character is quiet;
    returns how often each was offered."""
    wait_for(lambda: sorted(offered(fake)) == list(range(1, last + 1)), what=f"AI turns 1..{last} offered to path B")
    quiesce(srv.runtime, NAME)
    return offered(fake)


def settings_for(tmp_path, fake: FakeLLM):
    # Small batches and windows, so that 30 exchanges make a backlog of several windows.
    return make_settings(
        tmp_path,
        llm_base_url=fake.base_url,
        llm_model="fake",
        embedding_enabled=False,
        fact_extract_every_n_turns=2,
        fact_self_disclosure_max_window_messages=8,
    )


def test_every_ai_turn_is_offered_once_across_windows_and_a_restart(tmp_path, fake_llm: FakeLLM):
    fake_llm.on("extract_facts", {"facts": []})
    fake_llm.on("extract_self_disclosure", disclose_each)
    clock = ManualClock(datetime(2026, 5, 1, 20, 0, tzinfo=timezone.utc))
    settings = settings_for(tmp_path, fake_llm)
    with LiveServer(settings, clock=clock) as srv:
        for n in range(1, 31):
            assert srv.post(f"/cache/{NAME}", json=exchange(n)).status_code == 200
            clock.advance(30)
        settle(srv, clock)
        counts = wait_offered(srv, fake_llm, 30)
        assert set(counts.values()) == {1}, f"offered more than once: {counts}"
        windows = [len(_AI.findall(last_user_text(c["body"]))) for c in fake_llm.calls("extract_self_disclosure")]
        assert max(windows) <= 4  # 8 rows = 4 exchanges: the backlog took several passes
        wait_for(lambda: facts_of(srv, "ai_disclosure") == 30, what="every disclosure stored")

    # A new server on the same memory: the cursor was persisted, so nothing is offered again.
    with LiveServer(settings, clock=clock) as srv:
        for n in range(31, 36):
            assert srv.post(f"/cache/{NAME}", json=exchange(n)).status_code == 200
            clock.advance(30)
        settle(srv, clock)
        counts = wait_offered(srv, fake_llm, 35)
        assert set(counts.values()) == {1}, f"offered more than once after the restart: {counts}"


def test_a_failed_pass_keeps_its_window_and_is_retried_after_the_backoff(tmp_path, fake_llm: FakeLLM):
    fake_llm.on("extract_facts", {"facts": []})
    fake_llm.on("extract_self_disclosure", disclose_each)
    # Every attempt of the client's retries fails: the pass fails once.
    fake_llm.queue("extract_self_disclosure", *[Reply.status(500, "down")] * LLM_ATTEMPTS)
    clock = ManualClock(datetime(2026, 5, 1, 20, 0, tzinfo=timezone.utc))
    settings = settings_for(tmp_path, fake_llm)
    with LiveServer(settings, clock=clock) as srv:
        for n in range(1, 4):
            assert srv.post(f"/cache/{NAME}", json=exchange(n)).status_code == 200
        settle(srv, clock)
        wait_for(lambda: len(fake_llm.calls("extract_self_disclosure")) == LLM_ATTEMPTS, what="the failing pass")
        quiesce(srv.runtime, NAME)
        first = fake_llm.calls("extract_self_disclosure")
        assert len(first) == LLM_ATTEMPTS  # failed; the gate holds the retry back
        clock.advance(settings.longterm.longterm_task_backoff_base_seconds)
        wait_for(lambda: len(fake_llm.calls("extract_self_disclosure")) > LLM_ATTEMPTS, what="the retried pass")
        quiesce(srv.runtime, NAME)
        calls = fake_llm.calls("extract_self_disclosure")
        assert len(calls) == LLM_ATTEMPTS + 1
        assert last_user_text(calls[-1]["body"]) == last_user_text(calls[0]["body"])  # the same window again
        wait_for(lambda: facts_of(srv, "ai_disclosure") == 3, what="the retried window's facts")


def test_powerful_memory_off_stops_path_b_and_loses_nothing_when_on_again(tmp_path, fake_llm: FakeLLM):
    fake_llm.on("extract_facts", {"facts": []})
    fake_llm.on("extract_self_disclosure", disclose_each)
    clock = ManualClock(datetime(2026, 5, 1, 20, 0, tzinfo=timezone.utc))
    with LiveServer(settings_for(tmp_path, fake_llm), clock=clock) as srv:
        assert srv.post("/api/memory/powerful_memory_config", json={"enabled": False}).status_code == 200
        for n in range(1, 11):
            assert srv.post(f"/cache/{NAME}", json=exchange(n)).status_code == 200
            clock.advance(30)
        settle(srv, clock)
        # Path A ran on each turn (the seed's off mode), path B not at all.
        assert len(fake_llm.calls("extract_facts")) == 10
        assert fake_llm.calls("extract_self_disclosure") == []

        assert srv.post("/api/memory/powerful_memory_config", json={"enabled": True}).status_code == 200
        for n in range(11, 13):
            assert srv.post(f"/cache/{NAME}", json=exchange(n)).status_code == 200
            clock.advance(30)
        settle(srv, clock)
        counts = wait_offered(srv, fake_llm, 12)  # the turns of the off period too
        assert set(counts.values()) == {1}
