"""LLMClient, the task contract and JSON extraction, against a real loopback FakeLLM."""

from __future__ import annotations

import json
import logging
import threading

import httpx
import msgspec
import pytest

from nekomem.config import load_settings
from nekomem.config.llm import LLMSettings
from nekomem.models.jsonparse import ModelOutputError, extract_json_object
from nekomem.models.llm import (
    Endpoint,
    LLMClient,
    LLMError,
    LLMNotConfigured,
    LLMTaskFailed,
    resolve_endpoints,
)
from nekomem.models.tasks import (
    TASKS,
    ExtractFactsOutput,
    SummarizeRecentOutput,
    SynthesizeReflectionOutput,
    UnknownTaskError,
    validate_output,
)
from tests.support.fake_llm import DEFAULT_HANDLERS, FakeLLM, Reply

FACT = {"text": "Master likes tea", "importance": 7, "entity": "master", "event_start_at": None, "event_end_at": None}
MSGS = [{"role": "system", "content": "extract"}, {"role": "user", "content": "I like tea"}]


@pytest.fixture
def fake():
    with FakeLLM() as server:
        yield server


def make_client(fake: FakeLLM, **overrides) -> LLMClient:
    fields = {"llm_base_url": fake.base_url, "llm_model": "m-global", "llm_max_retries": 2, **overrides}
    return LLMClient(LLMSettings(**fields), sleep=lambda _s: None)


@pytest.fixture
def client(fake):
    c = make_client(fake)
    yield c
    c.close()


# --- jsonparse -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        '{"summary": "x"}',
        '```json\n{"summary": "x"}\n```',
        '```\n{"summary": "x"}\n```',
        'Sure! Here is the result:\n{"summary": "x"}\nHope that helps {really}.',
        '{"summary": "x",}',
        '<think>maybe {"summary": "wrong"} ... </think>{"summary": "x"}',
        'The set {a, b} is not JSON but this is: {"summary": "x"}',
        '```json\n{"summary": "x"}\n',  # unclosed fence: the object itself is complete
    ],
)
def test_extract_json_object_recovers(text):
    assert extract_json_object(text) == {"summary": "x"}


def test_extract_json_object_trailing_commas_nested_and_strings_untouched():
    text = '{"facts": [{"text": "a, }", "importance": 3,},], "n": {"k": [1, 2,],},}'
    assert extract_json_object(text) == {"facts": [{"text": "a, }", "importance": 3}], "n": {"k": [1, 2]}}


@pytest.mark.parametrize("text", ["", "   ", "no json here", "[1, 2]", '{"summary": ', "{not json}", "null"])
def test_extract_json_object_rejects(text):
    with pytest.raises(ModelOutputError) as info:
        extract_json_object(text)
    assert isinstance(info.value, ValueError)
    assert str(info.value)


def test_error_message_does_not_quote_output():
    with pytest.raises(ModelOutputError) as info:
        extract_json_object("my secret diary entry {unbalanced")
    assert "secret" not in str(info.value)


# --- tasks -----------------------------------------------------------------------------------


def test_every_contract_task_is_registered_with_its_tier():
    expected = {
        "summarize_recent": "summary",
        "review_recent": "correction",
        "extract_facts": "summary",
        "extract_self_disclosure": "summary",
        "map_evidence": "summary",
        "judge_duplicates": "summary",
        "synthesize_reflection": "summary",
        "check_feedback": "summary",
        "check_disputation": "emotion",
        "judge_promotion": "correction",
        "resolve_correction": "correction",
        "rerank": "summary",
        "refine_cluster": "correction",
    }
    assert {name: spec.tier for name, spec in TASKS.items()} == expected
    for name, spec in TASKS.items():
        assert spec.name == name
        assert spec.schema["type"] == "object" and "$ref" not in spec.schema
        json.dumps(spec.schema)
        # every fake default is a valid output of its task
        validate_output(name, DEFAULT_HANDLERS[name]({"messages": [{"role": "user", "content": "hi fact_1"}]}))


def test_validate_output_shapes():
    out = validate_output("extract_facts", {"facts": [{**FACT, "importance": "8", "extra": 1}], "note": "ignored"})
    assert isinstance(out, ExtractFactsOutput) and out.facts[0].importance == 8
    assert validate_output("synthesize_reflection", {"reflection": None}) == SynthesizeReflectionOutput(reflection=None)
    bad = [
        ("summarize_recent", {}),
        ("summarize_recent", {"summary": 3}),
        ("extract_facts", {"facts": [{**FACT, "importance": 11}]}),
        ("extract_facts", {"facts": [{**FACT, "importance": 0}]}),
        ("extract_facts", {"facts": [{**FACT, "entity": "cat"}]}),
        ("extract_facts", {"facts": "none"}),
        ("synthesize_reflection", {}),
        ("map_evidence", {"signals": [{"fact_id": "f", "target_id": "t", "signal": "maybe"}]}),
        ("refine_cluster", {"actions": [{"op": "explode", "ids": []}]}),
    ]
    for task, obj in bad:
        with pytest.raises(ModelOutputError):
            validate_output(task, obj)
    with pytest.raises(UnknownTaskError):
        validate_output("nope", {})


def test_enum_error_does_not_quote_value():
    with pytest.raises(ModelOutputError) as info:
        validate_output("resolve_correction", {"action": "my private words"})
    assert "private" not in str(info.value) and "$.action" in str(info.value)


# --- endpoints -------------------------------------------------------------------------------


def test_resolve_endpoints_global_and_overrides():
    assert resolve_endpoints(LLMSettings()) == {"summary": None, "correction": None, "emotion": None}
    settings = LLMSettings(
        llm_base_url="http://global/v1/",
        llm_model="g",
        llm_api_key="gk",
        llm_correction_base_url="http://big/v1",
        llm_correction_model="big",
        llm_emotion_api_key="ek",
        llm_emotion_timeout_seconds=5.0,
    )
    eps = resolve_endpoints(settings)
    assert eps["summary"] == Endpoint("http://global/v1", "g", "gk", 30.0)
    assert eps["correction"] == Endpoint("http://big/v1", "big", "gk", 30.0)
    assert eps["emotion"] == Endpoint("http://global/v1", "g", "ek", 5.0)
    assert "gk" not in repr(eps["summary"])
    only_one = resolve_endpoints(LLMSettings(llm_emotion_base_url="http://e/v1"))
    assert only_one["summary"] is None and only_one["correction"] is None
    assert only_one["emotion"] is not None


def test_settings_reach_endpoints_through_env():
    s = load_settings(env={"NEKOMEM_LLM_BASE_URL": "http://x/v1", "NEKOMEM_LLM_SUMMARY_MODEL": "sm"})
    eps = resolve_endpoints(s.llm)
    assert eps["summary"].model == "sm" and eps["correction"].model == ""


def test_tier_overrides_route_requests_to_their_servers():
    with FakeLLM() as main, FakeLLM() as emo:
        settings = LLMSettings(llm_base_url=main.base_url, llm_model="g", llm_emotion_base_url=emo.base_url, llm_emotion_model="flash")
        with LLMClient(settings, sleep=lambda _s: None) as client:
            client.run("check_disputation", MSGS)
            client.run("summarize_recent", MSGS)
        assert [c["task"] for c in emo.calls()] == ["check_disputation"]
        assert emo.calls()[0]["body"]["model"] == "flash"
        assert [c["task"] for c in main.calls()] == ["summarize_recent"]
        assert main.calls()[0]["body"]["model"] == "g"


# --- requests --------------------------------------------------------------------------------


def test_request_shape_headers_and_response_format(fake):
    with make_client(fake, llm_api_key="sekrit") as client:
        fake.on("extract_facts", lambda req: {"facts": [FACT]})
        out = client.run("extract_facts", MSGS)
    assert isinstance(out, ExtractFactsOutput)
    assert out.facts[0].text == "Master likes tea"
    (call,) = fake.calls("extract_facts")
    assert call["headers"]["x-nekomem-task"] == "extract_facts"
    assert call["headers"]["authorization"] == "Bearer sekrit"
    body = call["body"]
    assert body["model"] == "m-global"
    assert body["messages"] == MSGS
    assert body["max_completion_tokens"] == 4096
    assert "temperature" not in body
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "extract_facts", "schema": TASKS["extract_facts"].schema},
    }


def test_no_key_no_authorization_and_options(fake):
    with make_client(fake, llm_response_format="none", llm_output_tokens_param="max_tokens") as client:
        client.run("summarize_recent", MSGS, max_output_tokens=123)
        client.run("review_recent", MSGS)
    first, review = fake.calls()
    assert "authorization" not in first["headers"]
    assert "response_format" not in first["body"]
    # with no response_format the system message states the schema
    assert first["body"]["messages"][0]["role"] == "system"
    assert json.dumps(TASKS["summarize_recent"].schema, separators=(",", ":")) in first["body"]["messages"][0]["content"]
    assert first["body"]["max_tokens"] == 123 and "max_completion_tokens" not in first["body"]
    assert review["body"]["max_tokens"] == 8192


def test_default_summary_handler_uses_last_user_message(fake, client):
    long = "x" * 100
    out = client.run("summarize_recent", [{"role": "user", "content": "old"}, {"role": "user", "content": long}])
    assert out == SummarizeRecentOutput(summary="summary: " + "x" * 60)


@pytest.mark.parametrize(
    "content",
    [
        'Here you go:\n{"summary": "ok"}\nAnything else?',
        '```json\n{"summary": "ok"}\n```',
        '{"summary": "ok",}',
    ],
)
def test_wrapped_output_is_parsed(fake, client, content):
    fake.on("summarize_recent", Reply.text(content))
    assert client.run("summarize_recent", MSGS).summary == "ok"
    assert len(fake.calls()) == 1


def test_garbage_then_valid_succeeds_after_retry(fake):
    sleeps: list[float] = []
    with LLMClient(LLMSettings(llm_base_url=fake.base_url, llm_max_retries=3, llm_backoff_jitter=0), sleep=sleeps.append) as client:
        fake.queue("summarize_recent", Reply.text("I cannot do JSON today"), Reply.text(None))
        assert client.run("summarize_recent", MSGS).summary.startswith("summary: ")
        status = client.status()["summary"]
    assert len(fake.calls()) == 3
    assert sleeps == [1.0, 2.0]  # base * 2**n
    assert status["calls"] == 1 and status["attempts"] == 3 and status["failures"] == 0
    # The call ended with a valid answer: the tier is ok, the failed attempts' error is
    # no longer current (kept as recovered_error).
    assert status["state"] == "ok" and status["last_error"] is None and status["failing_since"] is None
    assert status["recovered_error"] is not None and status["last_success_at"] is not None


def test_backoff_is_capped():
    sleeps: list[float] = []
    with FakeLLM() as fake:
        fake.on("rerank", Reply.status(503))
        settings = LLMSettings(
            llm_base_url=fake.base_url, llm_max_retries=5, llm_backoff_base_seconds=1, llm_backoff_max_seconds=3, llm_backoff_jitter=0
        )
        with LLMClient(settings, sleep=sleeps.append) as client, pytest.raises(LLMTaskFailed):
            client.run("rerank", MSGS, max_retries=5)
    assert sleeps == [1.0, 2.0, 3.0, 3.0, 3.0]


def test_always_garbage_fails_after_all_attempts(fake, client):
    fake.on("summarize_recent", Reply.text("nope"))
    with pytest.raises(LLMTaskFailed) as info:
        client.run("summarize_recent", MSGS)
    err = info.value
    assert isinstance(err, LLMError)
    assert err.task == "summarize_recent" and err.attempts == 3  # llm_max_retries=2, plus one
    assert "no JSON object" in err.last_error
    assert len(fake.calls()) == 3
    s = client.status()["summary"]
    assert s["calls"] == 1 and s["failures"] == 1 and "no JSON object" in s["last_error"]


@pytest.mark.parametrize(
    "bad",
    [
        {"facts": [{**FACT, "importance": "very"}]},
        {"facts": [{"importance": 5, "entity": "master"}]},
        {"memories": []},
    ],
)
def test_invalid_shape_is_retried_then_failed(fake, client, bad):
    fake.on("extract_facts", bad)
    with pytest.raises(LLMTaskFailed) as info:
        client.run("extract_facts", MSGS)
    assert info.value.attempts == 3 and "invalid output" in info.value.last_error
    assert len(fake.calls("extract_facts")) == 3


def test_invalid_then_valid(fake, client):
    fake.queue("extract_facts", {"facts": [{**FACT, "importance": 42}]})
    fake.on("extract_facts", {"facts": [FACT]})
    assert client.run("extract_facts", MSGS).facts[0].importance == 7
    assert len(fake.calls()) == 2


def test_server_errors_and_429_are_retried(fake, client):
    fake.queue("map_evidence", Reply.status(500, "boom"), Reply.status(429, {"error": {"message": "slow down"}}))
    assert client.run("map_evidence", MSGS).signals == []
    assert len(fake.calls()) == 3


def test_retry_after_is_honoured_within_the_cap(fake):
    sleeps: list[float] = []
    with LLMClient(LLMSettings(llm_base_url=fake.base_url, llm_backoff_jitter=0), sleep=sleeps.append) as client:
        fake.queue(
            "map_evidence", Reply.status(429, "", headers={"Retry-After": "5"}), Reply.status(429, "", headers={"Retry-After": "60"})
        )
        client.run("map_evidence", MSGS)
    assert sleeps == [5.0, 8.0]


@pytest.mark.parametrize("code", [400, 401, 404, 422])
def test_client_errors_are_not_retried(fake, code):
    fake.on("judge_promotion", Reply.status(code, {"error": {"message": "bad request: schema"}}))
    with make_client(fake, llm_response_format="json_schema") as client, pytest.raises(LLMTaskFailed) as info:
        client.run("judge_promotion", MSGS)
    assert info.value.attempts == 1 and info.value.status_code == code
    assert "bad request: schema" in info.value.last_error
    assert len(fake.calls()) == 1


def test_malformed_envelope_is_retried(fake, client):
    fake.queue("rerank", Reply.body("<html>proxy error</html>"), Reply.body('{"choices": []}'))
    out = client.run("rerank", [{"role": "user", "content": "order fact_a ref_b fact_a"}], max_retries=2)
    assert out.ids == ["fact_a", "ref_b"]
    assert len(fake.calls()) == 3


def test_output_exhausted_is_reported(fake, client):
    fake.on("review_recent", Reply.text('{"explanation": "trunc', finish_reason="length"))
    with pytest.raises(LLMTaskFailed) as info:
        client.run("review_recent", MSGS)
    assert info.value.output_exhausted is True


def test_timeout_is_retried(fake, client):
    fake.queue("check_feedback", Reply.delay(2.0, then={"feedback": []}))
    out = client.run("check_feedback", MSGS, timeout=0.5)
    assert out.feedback == []
    # The first call timed out and was tried again. On a loaded machine the second may miss
    # the bound too (a loopback answer slower than 0.5 s): a third then answers.
    assert 2 <= len(fake.calls("check_feedback")) <= 3


def test_timeouts_exhaust_attempts(fake, client):
    fake.set_delay(None, 2.0)
    with pytest.raises(LLMTaskFailed) as info:
        client.run("check_feedback", MSGS, timeout=0.2, max_retries=1)
    assert info.value.attempts == 2 and "timed out" in info.value.last_error
    fake.set_delay(None, 0)


def test_connection_refused_is_retried_then_failed():
    with FakeLLM() as fake:
        url = fake.base_url  # the port is free again once the server is closed
    with LLMClient(LLMSettings(llm_base_url=url, llm_max_retries=1), sleep=lambda _s: None) as client:
        with pytest.raises(LLMTaskFailed) as info:
            client.run("summarize_recent", MSGS)
    assert info.value.attempts == 2 and "transport error" in info.value.last_error


def test_not_configured_tier():
    with LLMClient(LLMSettings(llm_summary_base_url="http://127.0.0.1:9/v1"), sleep=lambda _s: None) as client:
        assert client.available("summary") and not client.available("correction")
        assert client.tier_for("resolve_correction") == "correction"
        with pytest.raises(LLMNotConfigured) as info:
            client.run("resolve_correction", MSGS)
        assert info.value.tier == "correction" and isinstance(info.value, LLMError)
        status = client.status()
    assert status["correction"] == {
        "configured": False,
        "model": "",
        "base_url": "",
        "calls": 0,
        "attempts": 0,
        "failures": 0,
        "skipped": 1,
        "last_error": None,
        "last_error_at": None,
        "state": "unconfigured",
        "failing_since": None,
        "last_success_at": None,
        "recovered_error": None,
        "negotiated": None,
    }
    with pytest.raises(ValueError):
        client.available("nope")
    with pytest.raises(UnknownTaskError):
        client.tier_for("nope")


def test_status_counters_and_no_key(fake):
    settings = LLMSettings(
        llm_base_url=fake.base_url.replace("http://", "http://user:pw@"), llm_model="m", llm_api_key="topsecret", llm_max_retries=0
    )
    with LLMClient(settings, sleep=lambda _s: None) as client:
        client.run("summarize_recent", MSGS)
        client.run("extract_facts", MSGS)
        fake.on("rerank", Reply.text("???"))
        with pytest.raises(LLMTaskFailed):
            client.run("rerank", MSGS)
        status = client.status()
    assert "topsecret" not in json.dumps(status) and "pw@" not in json.dumps(status)
    summary = status["summary"]
    assert summary["configured"] and summary["model"] == "m"
    assert summary["base_url"] == fake.base_url
    assert (summary["calls"], summary["attempts"], summary["failures"]) == (3, 3, 1)
    assert summary["last_error"].startswith("rerank:")
    assert status["emotion"]["calls"] == 0


def test_closed_client_refuses(fake):
    client = make_client(fake)
    client.close()
    client.close()
    with pytest.raises(LLMError):
        client.run("summarize_recent", MSGS)


def test_concurrent_calls_from_threads(fake, client):
    fake.on("summarize_recent", lambda req: {"summary": req["messages"][-1]["content"]})
    results: dict[int, str] = {}
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            results[i] = client.run("summarize_recent", [{"role": "user", "content": f"n{i}"}]).summary
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert results == {i: f"n{i}" for i in range(24)}
    assert client.status()["summary"]["calls"] == 24


def test_info_logs_carry_no_content(fake, client, caplog):
    fake.queue("summarize_recent", Reply.text("PRIVATE garbage"))
    with caplog.at_level(logging.INFO, logger="nekomem.llm"):
        client.run("summarize_recent", [{"role": "user", "content": "PRIVATE diary"}])
    infos = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert any("task=summarize_recent" in m and "status=200" in m for m in infos)
    assert not any("PRIVATE" in m for m in infos)


# --- the fake itself -------------------------------------------------------------------------


def test_fake_speaks_openai_shape_to_a_plain_http_client(fake):
    body = {"model": "x", "messages": [{"role": "user", "content": "hello"}]}
    r = httpx.post(f"{fake.base_url}/chat/completions", json=body, headers={"X-Nekomem-Task": "summarize_recent"})
    data = r.json()
    assert r.status_code == 200 and data["object"] == "chat.completion"
    assert data["choices"][0]["message"]["role"] == "assistant"
    assert json.loads(data["choices"][0]["message"]["content"]) == {"summary": "summary: hello"}
    assert data["choices"][0]["finish_reason"] == "stop" and "usage" in data
    assert httpx.post(f"{fake.base_url}/chat/completions", json=body).status_code == 400
    assert fake.wait_for_calls(2)
    fake.reset()
    assert fake.calls() == []


def test_fake_handler_exception_becomes_500(fake, client):
    def broken(_req):
        raise RuntimeError("oops")

    fake.on("summarize_recent", broken)
    with pytest.raises(LLMTaskFailed) as info:
        client.run("summarize_recent", MSGS, max_retries=0)
    assert info.value.status_code == 500 and "oops" in info.value.last_error


def test_output_struct_roundtrips_to_json(fake, client):
    fake.on("synthesize_reflection", {"reflection": {"text": "likes tea", "entity": "master", "time_scope": "pattern"}})
    out = client.run("synthesize_reflection", MSGS)
    assert msgspec.json.decode(msgspec.json.encode(out))["reflection"]["event_start_at"] is None
