"""No background model task repeats on a fixed tick (issue 8, item 2).

A real server on a ManualClock, a scripted model whose answers say "nothing here" (an
empty ``corrected_dialogue``, a null reflection). After a short chat the clock moves
through a quiet hour in 5-second steps, each step fires the timers that came due, followed by a barrier
(every child answered a Flush sent after the tick, and the model pool is idle), and the
model calls of each task are counted.
"""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timezone

from nekomem.actors.messages import Flush
from nekomem.actors.supervisor import child_order
from nekomem.runtime.clock import ManualClock
from tests.support.fake_llm import FakeLLM, Reply
from tests.support.live import LiveServer, make_settings
from tests.support.waiting import quiesce, wait_for

NAME = "Lan"
STEP_SECONDS = 5.0
TEAS = "jasmine oolong matcha sencha rooibos chamomile darjeeling assam genmaicha hojicha bancha gyokuro".split()


def facts_for(request: dict) -> dict:
    text = "\n".join(str(m.get("content")) for m in request.get("messages", []))
    return {
        "facts": [{"text": f"Master drinks {tea} tea", "importance": 7, "entity": "master"} for tea in TEAS if f"{tea} tea every" in text]
    }


def settle(srv: LiveServer) -> None:
    """Barrier: each child has handled everything sent before, and no model job of the
    character is waiting or running (twice, for results that start follow-up work)."""
    for _ in range(2):
        for child in child_order():
            srv.runtime.registry.ask_sync(NAME, child, lambda reply: Flush(reply=reply))
        wait_for(lambda: srv.runtime.pool.busy(NAME) == 0, what="the model pool to drain")


def step(srv: LiveServer, clock: ManualClock, seconds: float) -> None:
    clock.advance(seconds)
    quiesce(srv.runtime, NAME)  # runs what the advance made due
    settle(srv)


def test_a_quiet_hour_makes_no_repeated_model_call(tmp_path, fake_llm: FakeLLM):
    fake_llm.on("extract_facts", facts_for)
    # Answers in prose around the JSON, as a model that ignores response_format gives them.
    fake_llm.on("review_recent", Reply.prose({"explanation": "nothing to fix", "corrected_dialogue": []}))
    fake_llm.on("synthesize_reflection", Reply.prose({"reflection": None}, before="These facts do not add up to a pattern."))
    clock = ManualClock(datetime(2026, 6, 1, 21, 0, tzinfo=timezone.utc))
    settings = make_settings(
        tmp_path,
        llm_base_url=fake_llm.base_url,
        llm_model="fake",
        embedding_enabled=False,
        passivate_idle_seconds=7200,  # the character stays active through the hour
        recent_compress_threshold_items=100,  # no compression: the review sees one window
    )
    with LiveServer(settings, clock=clock) as srv:
        for tea in TEAS:
            r = srv.post(
                f"/cache/{NAME}",
                json={
                    "input_history": [
                        {"role": "user", "content": f"I drink {tea} tea every day"},
                        {"role": "assistant", "content": "Lovely."},
                    ]
                },
            )
            assert r.status_code == 200, r.text
        settle(srv)
        before = Counter(fake_llm.tally())
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

    during = Counter(fake_llm.tally()) - before
    # Each task ran once on its input and was not asked again while nothing changed: the
    # review after the idle time, the tail of the burst, one synthesis of the facts, and one
    # self-disclosure pass over the character's turns once the conversation went idle.
    assert during == {"review_recent": 1, "extract_facts": 1, "synthesize_reflection": 1, "extract_self_disclosure": 1}, during
    assert all(len(steps) == 1 for steps in steps_called.values()), steps_called
    assert facts == len(TEAS)


def quiet_hour(srv: LiveServer, clock: ManualClock, fake_llm: FakeLLM) -> dict[str, list[float]]:
    """Move through an hour in steps; returns, per task, the clock seconds (from the start
    of the hour) of the steps in which it was called."""
    times: dict[str, list[float]] = {}
    seen = len(fake_llm.calls())
    for n in range(1, int(3600 / STEP_SECONDS) + 1):
        step(srv, clock, STEP_SECONDS)
        calls = fake_llm.calls()
        for call in calls[seen:]:
            times.setdefault(call["task"], []).append(n * STEP_SECONDS)
        seen = len(calls)
    return times


def gaps(times: list[float]) -> list[float]:
    return [b - a for a, b in zip(times, times[1:], strict=False)]


def test_a_failing_model_is_retried_with_backoff_not_on_every_tick(tmp_path, fake_llm: FakeLLM):
    """Every task answers 500 for an hour: each is retried with a growing delay or stops
    at its dead letter; none is called again at every tick."""
    for task in ("summarize_recent", "review_recent", "extract_facts", "synthesize_reflection"):
        fake_llm.on(task, Reply.status(500, "down"))
    clock = ManualClock(datetime(2026, 6, 1, 21, 0, tzinfo=timezone.utc))
    settings = make_settings(
        tmp_path,
        llm_base_url=fake_llm.base_url,
        llm_model="fake",
        embedding_enabled=False,
        passivate_idle_seconds=7200,
        llm_max_retries=0,
    )
    with LiveServer(settings, clock=clock) as srv:
        for tea in TEAS:
            r = srv.post(
                f"/cache/{NAME}",
                json={
                    "input_history": [
                        {"role": "user", "content": f"I drink {tea} tea every day"},
                        {"role": "assistant", "content": "Lovely."},
                    ]
                },
            )
            assert r.status_code == 200, r.text
        facts = [{"text": f"Master drinks {tea} tea", "importance": 7} for tea in TEAS]
        assert srv.post(f"/api/characters/{NAME}/facts", json={"facts": facts}).status_code == 200
        settle(srv)
        times = quiet_hour(srv, clock, fake_llm)

    assert set(times) <= {"summarize_recent", "review_recent", "extract_facts", "synthesize_reflection"}, times
    # Review: spaced by the minimum interval, dead-lettered after its failures on one tail.
    assert len(times["review_recent"]) == settings.recent.review_max_fail_attempts, times
    assert min(gaps(times["review_recent"])) >= settings.recent.review_min_interval_seconds
    # Compression, synthesis, extraction: each wait at least as long as the one before.
    for task in ("summarize_recent", "synthesize_reflection", "extract_facts"):
        assert 2 <= len(times[task]) <= 8, (task, times[task])
        waits = gaps(times[task])
        assert all(b >= a for a, b in zip(waits, waits[1:], strict=False)), (task, waits)
    assert len(times["synthesize_reflection"]) <= settings.longterm.longterm_liveness_max_attempts
    # Review and synthesis reach their dead letters within the first half hour.
    assert times["review_recent"][-1] < 1800 and times["synthesize_reflection"][-1] < 1800, times


def test_quiet_hour_with_vectors_spaces_dedup_and_refinement(tmp_path, fake_llm: FakeLLM, embedding_service):
    """With the real embedding model: a paraphrase pair whose judge_duplicates answers hold
    no usable decision, and two near-duplicate persona entries whose refine_cluster answers
    hold no action. Both count as failures: retried after growing waits, never per tick."""
    import json

    from nekomem.stores.layout import CharacterPaths

    clock = ManualClock(datetime(2026, 6, 1, 21, 0, tzinfo=timezone.utc))
    paths = CharacterPaths(tmp_path, NAME)
    paths.ensure()
    paths.persona.write_text(
        json.dumps(
            {
                "master": {
                    "facts": [
                        {"id": "prom_a", "text": "Master loves green tea very much", "source": "reflection"},
                        {"id": "prom_b", "text": "Master really adores drinking green tea", "source": "reflection"},
                    ]
                }
            }
        ),
        encoding="utf-8",
    )
    settings = make_settings(tmp_path, llm_base_url=fake_llm.base_url, llm_model="fake", passivate_idle_seconds=7200)
    with LiveServer(settings, clock=clock, embeddings=embedding_service) as srv:
        for text in ("Master loves green tea very much", "Master really adores drinking green tea"):
            assert srv.post(f"/api/characters/{NAME}/facts", json={"facts": [{"text": text, "importance": 6}]}).status_code == 200
            settle(srv)
            wait_for(lambda: srv.get("/health").json()["embeddings"]["pending"] == 0, what="vectors")
            settle(srv)
        times = quiet_hour(srv, clock, fake_llm)

    dedup = times.get("judge_duplicates", [])
    assert 1 <= len(dedup) <= settings.longterm.fact_dedup_max_attempts, times
    waits = gaps(dedup)
    assert all(w >= settings.longterm.longterm_idle_maintenance_interval_seconds for w in waits), waits
    assert all(b >= a for a, b in zip(waits, waits[1:], strict=False)), waits
    refine = times.get("refine_cluster", [])
    assert 1 <= len(refine) <= 2 and min(gaps(refine), default=1800) >= settings.longterm.longterm_refine_interval_seconds, times
