"""Models people actually run: structured-output and token-parameter negotiation, repair of
malformed JSON, cut-off answers, jittered backoff. Every test talks real HTTP to a loopback
FakeLLM playing a server dialect; the live-server tests go through nekomem's routes."""

from __future__ import annotations

import json
import random
import threading

import pytest

from nekomem.config.llm import LLMSettings
from nekomem.models.jsonparse import ModelOutputError, extract_json_object, salvage_truncated_object
from nekomem.models.llm import LLMClient, LLMTaskFailed
from nekomem.models.tasks import TASKS
from tests.support.fake_llm import FakeLLM, Reply, request_features
from tests.support.live import LiveServer, make_settings
from tests.support.waiting import wait_for

MSGS = [{"role": "system", "content": "Answer with JSON."}, {"role": "user", "content": "I like tea. fact_1 ref_2"}]
FACT = {"text": "Master likes tea", "importance": 7, "entity": "master"}
LLAMA_CPP_PYTHON = {"json_schema": Reply.status(500, {"error": {"message": "Internal Server Error"}})}
OLD_SERVER_TOKENS = {
    "max_completion_tokens": Reply.status(400, {"error": {"message": "Unrecognized request argument supplied: max_completion_tokens"}})
}


def client_for(fake: FakeLLM, **overrides) -> LLMClient:
    fields = {"llm_base_url": fake.base_url, "llm_model": "m", "llm_max_retries": 2, "llm_backoff_base_seconds": 0.0, **overrides}
    return LLMClient(LLMSettings(**fields), sleep=lambda _s: None)


def formats(fake: FakeLLM, task: str | None = None) -> list[str]:
    """The response_format type of each recorded request ('none' without one)."""
    out = []
    for call in fake.calls(task):
        rf = call["body"].get("response_format")
        out.append(rf["type"] if isinstance(rf, dict) else "none")
    return out


def run_every_task(client: LLMClient, rounds: int = 1) -> None:
    for _ in range(rounds):
        for task in TASKS:
            client.run(task, MSGS)


# --- response_format negotiation ------------------------------------------------------------


def test_500_to_json_schema_is_negotiated_once_per_endpoint(fake_llm):
    fake_llm.set_dialect(refuse=LLAMA_CPP_PYTHON)
    with client_for(fake_llm) as client:
        run_every_task(client, rounds=3)
        status = client.status()
    seen = formats(fake_llm)
    assert seen.count("json_schema") == 1  # one refusal, then every call goes straight to json_object
    assert seen.count("json_object") == 3 * len(TASKS) and "none" not in seen
    for call in fake_llm.calls():
        if call["body"].get("response_format", {}).get("type") == "json_object":
            assert call["body"]["response_format"]["schema"] == TASKS[call["task"]].schema
            assert "JSON schema" in call["body"]["messages"][0]["content"]  # stated too: may not be enforced
    negotiated = status["summary"]["negotiated"]
    assert negotiated["response_format"] == "json_object" and negotiated["response_format_confirmed"]
    assert negotiated["fallbacks"] == ["json_schema -> json_object"]
    # all three tiers share the endpoint (same base URL and model): one negotiation for all
    assert status["correction"]["negotiated"] == negotiated == status["emotion"]["negotiated"]
    assert sum(s["failures"] for s in status.values()) == 0


def test_concurrent_first_calls_meet_the_refusal_once(fake_llm):
    fake_llm.set_dialect(refuse=LLAMA_CPP_PYTHON)
    errors: list[BaseException] = []
    with client_for(fake_llm) as client:

        def work() -> None:
            try:
                client.run("extract_facts", MSGS)
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

        threads = [threading.Thread(target=work) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors
    assert formats(fake_llm).count("json_schema") == 1 and len(fake_llm.calls()) == 9


def test_each_endpoint_negotiates_for_itself():
    with FakeLLM() as old, FakeLLM() as new:
        old.set_dialect(refuse=LLAMA_CPP_PYTHON)
        settings = LLMSettings(llm_base_url=new.base_url, llm_model="m", llm_emotion_base_url=old.base_url, llm_backoff_base_seconds=0)
        with LLMClient(settings, sleep=lambda _s: None) as client:
            for _ in range(3):
                client.run("check_disputation", MSGS)  # emotion tier -> old server
                client.run("extract_facts", MSGS)  # summary tier -> new server
            status = client.status()
        assert formats(old) == ["json_schema", "json_object", "json_object", "json_object"]
        assert formats(new) == ["json_schema"] * 3
    assert status["emotion"]["negotiated"]["response_format"] == "json_object"
    assert status["summary"]["negotiated"]["response_format"] == "json_schema"


def test_400_naming_the_format_walks_down_to_no_response_format(fake_llm):
    fake_llm.set_dialect(
        refuse={
            "json_schema": Reply.status(400, {"error": {"message": "response_format type json_schema is not supported"}}),
            "json_object": Reply.status(
                422, {"detail": [{"loc": ["body", "response_format", "schema"], "msg": "extra fields not permitted"}]}
            ),
        }
    )
    with client_for(fake_llm) as client:
        assert client.run("summarize_recent", MSGS).summary
        assert client.run("extract_facts", MSGS).facts == []
        status = client.status()["summary"]["negotiated"]
    assert formats(fake_llm) == ["json_schema", "json_object", "none", "none"]
    last = fake_llm.calls()[-1]["body"]
    assert "response_format" not in last
    assert json.dumps(TASKS["extract_facts"].schema, separators=(",", ":")) in last["messages"][0]["content"]
    assert status["response_format"] == "none"
    assert status["fallbacks"] == ["json_schema -> json_object (HTTP 400)", "json_object -> none (HTTP 422)"]


def test_a_broken_server_leaves_no_false_memory(fake_llm):
    fake_llm.on("summarize_recent", Reply.status(500, "boom"))
    with client_for(fake_llm, llm_max_retries=1) as client:
        with pytest.raises(LLMTaskFailed) as info:
            client.run("summarize_recent", MSGS)
        assert info.value.status_code == 500 and info.value.attempts == 2
        # the first attempt probed one level down (the 500 might have been about the format);
        # json_object failed the very same way, so the probe stopped and the retry is plain
        assert formats(fake_llm) == ["json_schema", "json_object", "json_schema"]
        assert client.status()["summary"]["negotiated"]["response_format"] == "json_schema"
        fake_llm.reset()
        client.run("summarize_recent", MSGS)  # the server recovered: json_schema is confirmed
        assert formats(fake_llm) == ["json_schema"]
        negotiated = client.status()["summary"]["negotiated"]
    assert negotiated["response_format_confirmed"] and negotiated["fallbacks"] == []


def test_a_probe_is_repeated_only_after_the_reprobe_interval(fake_llm):
    fake_llm.on("summarize_recent", Reply.status(500, "boom"))
    with client_for(fake_llm, llm_max_retries=0, llm_negotiation_reprobe_seconds=0) as client:
        for _ in range(2):
            with pytest.raises(LLMTaskFailed):
                client.run("summarize_recent", MSGS)
    assert formats(fake_llm) == ["json_schema", "json_object"] * 2  # interval 0: every call probes


def test_a_confirmed_format_is_not_dropped_for_a_plain_500(fake_llm):
    with client_for(fake_llm) as client:
        client.run("map_evidence", MSGS)
        fake_llm.queue("map_evidence", Reply.status(500, "overloaded"))
        client.run("map_evidence", MSGS)
        assert client.status()["summary"]["negotiated"]["response_format"] == "json_schema"
    assert formats(fake_llm) == ["json_schema"] * 3  # retried with backoff at the same level


def test_a_confirmed_format_refused_by_name_later_is_dropped(fake_llm):
    with client_for(fake_llm) as client:
        client.run("map_evidence", MSGS)
        fake_llm.set_dialect(refuse={"json_schema": Reply.status(400, {"error": {"message": "json_schema: unsupported schema keyword"}})})
        client.run("map_evidence", MSGS)
        client.run("map_evidence", MSGS)
    assert formats(fake_llm) == ["json_schema", "json_schema", "json_object", "json_object"]


def test_a_pinned_format_is_never_negotiated(fake_llm):
    fake_llm.set_dialect(refuse=LLAMA_CPP_PYTHON)
    with client_for(fake_llm, llm_response_format="json_schema", llm_max_retries=1) as client:
        with pytest.raises(LLMTaskFailed):
            client.run("rerank", MSGS, max_retries=1)
        assert client.status()["summary"]["negotiated"]["response_format_pinned"] is True
    assert formats(fake_llm) == ["json_schema", "json_schema"]
    fake_llm.reset()
    with client_for(fake_llm, llm_response_format="json_object") as client:
        client.run("rerank", MSGS)
    assert formats(fake_llm) == ["json_object"]


def test_a_server_that_ignores_response_format_and_wraps_json_in_prose(fake_llm):
    fake_llm.set_dialect(wrap_in_prose=True)
    fake_llm.on("extract_facts", {"facts": [FACT]})
    with client_for(fake_llm) as client:
        run_every_task(client, rounds=2)
        assert client.run("extract_facts", MSGS).facts[0].text == "Master likes tea"
        status = client.status()
    assert len(fake_llm.calls()) == 2 * len(TASKS) + 1  # no retry: every answer parsed first time
    assert sum(s["failures"] for s in status.values()) == 0


# --- the token-limit parameter --------------------------------------------------------------


def test_max_completion_tokens_refused_by_name_switches_to_max_tokens_once(fake_llm):
    fake_llm.set_dialect(refuse=OLD_SERVER_TOKENS)
    with client_for(fake_llm) as client:
        for _ in range(3):
            client.run("judge_duplicates", MSGS, max_output_tokens=321)
        negotiated = client.status()["summary"]["negotiated"]
    sent = [sorted(request_features(c["body"]) & {"max_tokens", "max_completion_tokens"}) for c in fake_llm.calls()]
    assert sent == [["max_completion_tokens"], ["max_tokens"], ["max_tokens"], ["max_tokens"]]
    assert all(c["body"].get("max_tokens", 321) == 321 for c in fake_llm.calls())
    assert formats(fake_llm) == ["json_schema"] * 4  # the format was not blamed
    assert negotiated["output_tokens_param"] == "max_tokens" and negotiated["output_tokens_param_confirmed"]


def test_both_negotiations_on_one_server(fake_llm):
    fake_llm.set_dialect(refuse={**OLD_SERVER_TOKENS, **LLAMA_CPP_PYTHON})
    with client_for(fake_llm) as client:
        run_every_task(client)
        negotiated = client.status()["summary"]["negotiated"]
    assert len(fake_llm.calls()) == len(TASKS) + 2
    assert (negotiated["response_format"], negotiated["output_tokens_param"]) == ("json_object", "max_tokens")


def test_a_value_error_about_max_tokens_is_a_plain_failure(fake_llm):
    fake_llm.on("check_feedback", Reply.status(400, {"error": {"message": "max_completion_tokens must be at most 2048"}}))
    with client_for(fake_llm) as client:
        with pytest.raises(LLMTaskFailed) as info:
            client.run("check_feedback", MSGS)
        negotiated = client.status()["summary"]["negotiated"]
    assert info.value.status_code == 400 and len(fake_llm.calls()) == 1
    assert negotiated["output_tokens_param"] == "max_completion_tokens" and negotiated["fallbacks"] == []


def test_a_pinned_token_parameter_is_kept(fake_llm):
    with client_for(fake_llm, llm_output_tokens_param="max_tokens") as client:
        client.run("rerank", MSGS)
    body = fake_llm.calls()[0]["body"]
    assert body["max_tokens"] == 4096 and "max_completion_tokens" not in body


# --- malformed and cut-off answers ------------------------------------------------------------


@pytest.mark.parametrize(
    "content, expected",
    [
        ("{'summary': 'tea time'}", {"summary": "tea time"}),  # single quotes
        ('{summary: "tea time"}', {"summary": "tea time"}),  # unquoted key
        ("{'reflection': None}", {"reflection": None}),  # Python literal
        ('{"summary": "tea" // the answer\n}', {"summary": "tea"}),  # line comment
        ('{/* why */ "summary": "tea"}', {"summary": "tea"}),  # block comment
        ('{"summary": "first line\nsecond line"}', {"summary": "first line\nsecond line"}),  # raw newline
        ("Here it is: {'summary': 'tea', 'done': True} bye", {"summary": "tea", "done": True}),
    ],
)
def test_json_repair_is_the_last_resort(content, expected):
    assert extract_json_object(content) == expected


@pytest.mark.parametrize("content", ['{"summary": ', '{"summary": "half', "{not json}", "no json at all"])
def test_repair_never_invents_the_end_of_a_cut_answer(content):
    with pytest.raises(ModelOutputError):
        extract_json_object(content)


def test_repaired_answers_pass_through_the_client(fake_llm):
    fake_llm.queue("summarize_recent", Reply.text("{'summary': 'Master likes tea',}"))
    fake_llm.queue(
        "extract_facts", Reply.text("{facts: [{text: 'Master likes tea', importance: 7, entity: 'master', event_start_at: None}]}")
    )
    with client_for(fake_llm) as client:
        assert client.run("summarize_recent", MSGS).summary == "Master likes tea"
        assert client.run("extract_facts", MSGS).facts[0].importance == 7
    assert len(fake_llm.calls()) == 2


def cut(obj: dict, drop_chars: int) -> str:
    text = json.dumps(obj)
    return text[: len(text) - drop_chars]


def test_an_answer_cut_at_its_limit_keeps_its_complete_items(fake_llm):
    facts = [{**FACT, "text": f"Master likes tea number {i}"} for i in range(3)]
    fake_llm.on("extract_facts", Reply.text(cut({"facts": facts}, 20), finish_reason="length"))
    fake_llm.on("rerank", Reply.text('{"ids": ["fact_1", "ref_2", "fact_', finish_reason="length"))
    with client_for(fake_llm) as client:
        out = client.run("extract_facts", MSGS)
        assert [f.text for f in out.facts] == ["Master likes tea number 0", "Master likes tea number 1"]
        assert client.run("rerank", MSGS).ids == ["fact_1", "ref_2"]
        assert client.status()["summary"]["failures"] == 0
    assert len(fake_llm.calls()) == 2  # no retry


def test_a_cut_answer_without_one_complete_item_is_retried_then_failed(fake_llm):
    fake_llm.on("extract_facts", Reply.text('{"facts": [{"text": "Master lik', finish_reason="length"))
    with client_for(fake_llm) as client, pytest.raises(LLMTaskFailed) as info:
        client.run("extract_facts", MSGS)
    assert info.value.output_exhausted and info.value.attempts == 3


def test_a_cut_review_is_all_or_nothing(fake_llm):
    turns = [{"role": "user", "content": f"line {i}"} for i in range(4)]
    fake_llm.on("review_recent", Reply.text(cut({"explanation": "fixed", "corrected_dialogue": turns}, 10), finish_reason="length"))
    with client_for(fake_llm, llm_max_retries=0) as client, pytest.raises(LLMTaskFailed) as info:
        client.run("review_recent", MSGS)
    assert info.value.output_exhausted  # the window keeps its place: the review path backs off


def test_a_cut_answer_that_stopped_normally_is_not_salvaged(fake_llm):
    facts = [{**FACT, "text": f"t{i}"} for i in range(3)]
    fake_llm.on("extract_facts", Reply.text(cut({"facts": facts}, 20), finish_reason="stop"))
    with client_for(fake_llm, llm_max_retries=0) as client, pytest.raises(LLMTaskFailed):
        client.run("extract_facts", MSGS)


def test_salvage_counts_the_items_of_the_cut_array():
    obj, kept = salvage_truncated_object('<think>x</think>```json\n{"note": ["a"], "ids": ["x", "y", 12, "z')
    assert obj == {"note": ["a"], "ids": ["x", "y", 12]} and kept == 3


# --- backoff jitter ---------------------------------------------------------------------------


def test_backoff_has_jitter_within_bounds(fake_llm):
    fake_llm.on("rerank", Reply.status(503))
    sleeps: list[float] = []
    settings = LLMSettings(llm_base_url=fake_llm.base_url, llm_backoff_base_seconds=1, llm_backoff_max_seconds=4, llm_backoff_jitter=0.5)
    with LLMClient(settings, sleep=sleeps.append, rng=random.Random(7)) as client:
        for _ in range(5):
            with pytest.raises(LLMTaskFailed):
                client.run("rerank", MSGS, max_retries=4)
    per_call = [sleeps[i : i + 4] for i in range(0, len(sleeps), 4)]
    for delays in per_call:
        for delay, full in zip(delays, [1, 2, 4, 4], strict=True):
            assert full * 0.5 <= delay <= full
    assert len({round(call[0], 6) for call in per_call}) > 1  # callers do not retry in step


def test_jitter_never_undercuts_retry_after(fake_llm):
    fake_llm.queue("map_evidence", Reply.status(429, "", headers={"Retry-After": "3"}))
    sleeps: list[float] = []
    settings = LLMSettings(llm_base_url=fake_llm.base_url, llm_backoff_jitter=1.0)
    with LLMClient(settings, sleep=sleeps.append) as client:
        client.run("map_evidence", MSGS)
    assert sleeps == [3.0]


# --- through nekomem's routes -------------------------------------------------------------------


def live_settings(root, fake, **extra):
    values = dict(
        llm_base_url=fake.base_url, llm_model="fake", llm_backoff_base_seconds=0.0, powerful_memory_default=False, embedding_enabled=False
    )
    values.update(extra)
    return make_settings(root, **values)


def facts_total(srv) -> int:
    return srv.get("/api/characters/Lan/facts").json()["total"]


@pytest.mark.parametrize("dialect", ["llama-cpp-python", "prose"])
def test_pipeline_over_http_with_a_real_dialect(tmp_path, fake_llm, dialect):
    if dialect == "prose":
        fake_llm.set_dialect(wrap_in_prose=True)
    else:
        fake_llm.set_dialect(refuse={**LLAMA_CPP_PYTHON, **OLD_SERVER_TOKENS})
    fake_llm.on("extract_facts", lambda req: {"facts": [{**FACT, "text": "Master: " + req["messages"][-1]["content"][-40:]}]})
    fake_llm.on("synthesize_reflection", {"reflection": {"text": "Master loves tea", "entity": "master", "time_scope": "pattern"}})
    with LiveServer(live_settings(tmp_path, fake_llm)) as srv:
        for i in range(6):
            assert (
                srv.post("/cache/Lan", json={"input_history": [{"role": "user", "content": f"I drink tea number {i}"}]}).status_code == 200
            )
        wait_for(
            lambda: facts_total(srv) >= 1 and len(fake_llm.calls("extract_facts")) >= 6 and srv.get("/health").json()["model_jobs"] == 0,
            what="the extractions",
        )
        teas = (
            "green tea at breakfast",
            "jasmine tea after dinner",
            "oolong while studying",
            "matcha lattes as a treat",
            "chai on rainy days",
        )
        imported = srv.post("/api/characters/Lan/facts", json={"facts": [{"text": f"Master drinks {t}", "importance": 7} for t in teas]})
        assert imported.status_code == 200, imported.text
        reflected = srv.post("/reflect/Lan")
        assert reflected.status_code == 200 and reflected.json()["reflection"] is not None, reflected.text
        tiers = srv.get("/health").json()["llm"]["tiers"]
    assert sum(t["failures"] for t in tiers.values()) == 0
    negotiated = tiers["summary"]["negotiated"]
    if dialect == "prose":
        assert set(formats(fake_llm)) == {"json_schema"}
        assert negotiated["response_format"] == "json_schema"
    else:
        assert formats(fake_llm).count("json_schema") == 1  # once per endpoint, not per call
        assert (negotiated["response_format"], negotiated["output_tokens_param"]) == ("json_object", "max_tokens")
        # two refused requests in the whole run (json_schema, then max_completion_tokens)
        assert len(fake_llm.calls()) == sum(t["calls"] for t in tiers.values()) + 2
