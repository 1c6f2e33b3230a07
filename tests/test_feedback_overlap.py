"""check_feedback runs once per user turn, so calls overlap when turns arrive quickly: the
same answer about a surfaced reflection must count once (found in the issue 8 audit)."""

from __future__ import annotations

from datetime import datetime, timezone

from nekomem.runtime.clock import ManualClock
from tests.support.fake_llm import FakeLLM, prompt_text
from tests.support.live import LiveServer, make_settings
from tests.support.waiting import wait_for

NAME = "Lan"
REFLECTION = {
    "reflection": {"text": "Master loves tea", "entity": "master", "time_scope": "pattern", "event_start_at": None, "event_end_at": None}
}


def test_overlapping_feedback_answers_count_once(tmp_path, fake_llm: FakeLLM):
    clock = ManualClock(datetime(2026, 8, 1, 9, 0, tzinfo=timezone.utc))
    fake_llm.on("synthesize_reflection", REFLECTION)
    settings = make_settings(tmp_path, llm_base_url=fake_llm.base_url, llm_model="fake", embedding_enabled=False)
    with LiveServer(settings, clock=clock) as srv:
        facts = [{"text": f"Master drinks {t} tea", "importance": 6} for t in ("green", "black", "white", "oolong", "jasmine")]
        assert srv.post(f"/api/characters/{NAME}/facts", json={"facts": facts}).status_code == 200
        rid = srv.post(f"/reflect/{NAME}").json()["reflection"]["id"]
        assert srv.post(f"/record_surfaced/{NAME}", json={"reflection_ids": [rid]}).json()["recorded"] == 1
        before = next(r for r in srv.get(f"/api/characters/{NAME}/reflections").json()["items"] if r["id"] == rid)

        # Every call answers "confirmed", slowly, so that the three calls overlap.
        fake_llm.on(
            "check_feedback",
            lambda req: {"feedback": [{"reflection_id": rid, "feedback": "confirmed"}]} if rid in prompt_text(req) else {"feedback": []},
        )
        fake_llm.set_delay("check_feedback", 0.5)
        for text in ("yes I love it", "tea is the best", "so true"):
            assert srv.post(f"/cache/{NAME}", json={"input_history": [{"role": "user", "content": text}]}).status_code == 200
        assert fake_llm.wait_for_calls(3, "check_feedback", timeout=20)
        wait_for(lambda: srv.runtime.pool.busy(NAME) == 0, what="the feedback calls to finish")
        srv.get(f"/api/characters/{NAME}/reflections")  # barrier: the answers were handled
        after = next(r for r in srv.get(f"/api/characters/{NAME}/reflections").json()["items"] if r["id"] == rid)

    delta = settings.longterm.evidence_user_confirm_delta
    assert after["reinforcement"] == before["reinforcement"] + delta, (before["reinforcement"], after["reinforcement"])
