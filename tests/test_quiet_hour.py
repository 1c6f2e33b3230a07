"""No background model task repeats on a fixed tick (issue 8, item 2).

A real server on a ManualClock, a scripted model whose answers say "nothing here" (an
empty ``corrected_dialogue``, a null reflection). After a short chat the clock moves
through a quiet hour in 5-second steps, each step a scheduler tick followed by a barrier
(every child answered a Flush sent after the tick, and the model pool is idle), and the
model calls of each task are counted.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timezone

from nekomem.actors.messages import Flush
from nekomem.actors.supervisor import CHILD_ORDER
from nekomem.runtime.clock import ManualClock
from tests.support.fake_llm import FakeLLM
from tests.support.live import LiveServer, make_settings
from tests.support.waiting import wait_for

NAME = "Lan"
STEP_SECONDS = 5.0
TEAS = "jasmine oolong matcha sencha rooibos chamomile darjeeling assam genmaicha hojicha bancha gyokuro".split()


def facts_for(request: dict) -> dict:
    text = "\n".join(str(m.get("content")) for m in request.get("messages", []))
    return {"facts": [{"text": f"Master drinks {tea} tea", "importance": 7, "entity": "master"} for tea in TEAS if f"{tea} tea every" in text]}


def settle(srv: LiveServer) -> None:
    """Barrier: each child has handled everything sent before, and no model job of the
    character is waiting or running (twice, for results that start follow-up work)."""
    for _ in range(2):
        for child in CHILD_ORDER:
            srv.runtime.registry.ask_sync(NAME, child, lambda reply: Flush(reply=reply))
        wait_for(lambda: srv.runtime.pool.busy(NAME) == 0, what="the model pool to drain")


def step(srv: LiveServer, clock: ManualClock, seconds: float) -> None:
    clock.advance(seconds)
    srv.runtime.scheduler.tick_now()
    settle(srv)


def test_a_quiet_hour_makes_no_repeated_model_call(tmp_path, fake_llm: FakeLLM):
    fake_llm.on("extract_facts", facts_for)
    fake_llm.on("review_recent", {"explanation": "nothing to fix", "corrected_dialogue": []})
    fake_llm.on("synthesize_reflection", {"reflection": None})
    clock = ManualClock(datetime(2026, 6, 1, 21, 0, tzinfo=timezone.utc))
    settings = make_settings(
        tmp_path, llm_base_url=fake_llm.base_url, llm_model="fake", embedding_enabled=False,
        passivate_idle_seconds=7200,  # the character stays active through the hour
        recent_compress_threshold_items=100,  # no compression: the review sees one window
    )
    with LiveServer(settings, clock=clock) as srv:
        for tea in TEAS:
            r = srv.post(f"/cache/{NAME}", json={"input_history": [
                {"role": "user", "content": f"I drink {tea} tea every day"}, {"role": "assistant", "content": "Lovely."}]})
            assert r.status_code == 200, r.text
        settle(srv)
        before = Counter(c["task"] for c in fake_llm.calls())
        assert before == {"extract_facts": 1}  # the count trigger took the first ten turns

        steps_called: dict[str, set[int]] = {}
        seen = len(fake_llm.calls())
        for n in range(int(3600 / STEP_SECONDS)):
            step(srv, clock, STEP_SECONDS)
            calls = fake_llm.calls()
            for call in calls[seen:]:
                steps_called.setdefault(call["task"], set()).add(n)
            seen = len(calls)
        facts = srv.get(f"/api/characters/{NAME}/facts").json()["total"]

    during = Counter(c["task"] for c in fake_llm.calls()) - before
    # Each task ran once on its input and was not asked again while nothing changed: the
    # review after the idle time, the tail of the burst, one synthesis of the facts.
    assert during == {"review_recent": 1, "extract_facts": 1, "synthesize_reflection": 1}, during
    assert all(len(steps) == 1 for steps in steps_called.values()), steps_called
    assert facts == len(TEAS)
