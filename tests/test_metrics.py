"""GET /metrics over real HTTP: a short load against a live server (the loopback fake LLM,
the real embedding model), then the scrape parsed with prometheus_client's own parser."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from nekomem.actors.messages import OutboxState
from nekomem.models.embeddings import EmbeddingService
from tests.support.live import LiveServer, make_settings
from tests.support.scrape import Samples, matching, one, scrape
from tests.support.waiting import quiesce


def turn(role: str, text: str) -> dict[str, Any]:
    return {"role": role, "content": [{"type": "text", "text": text}]}


def label_values(samples: Samples) -> Iterator[str]:
    for series in samples.values():
        for labels, _value in series:
            yield from labels.values()


CACHE_TURNS = 6
DIALOGS = 3
QUERIES = 2


def run_load(srv: LiveServer, names: list[str], secret: str) -> None:
    """A fixed number of requests of each kind; every text carries ``secret``."""
    for i in range(CACHE_TURNS):
        name = names[i % len(names)]
        history = [turn("user", f"{secret} user turn {i}"), turn("assistant", f"{secret} reply {i}")]
        assert srv.post(f"/cache/{name}", json={"input_history": history}).status_code == 200
    facts = [{"text": f"Master keeps a {secret} on the balcony"}, {"text": "Master drinks green tea"}]
    assert srv.post(f"/api/characters/{names[0]}/facts", json={"facts": facts}).status_code == 200
    for i in range(DIALOGS):
        assert srv.get(f"/new_dialog/{names[i % len(names)]}", params={"hint": secret}).status_code == 200
    for _ in range(QUERIES):
        assert srv.post(f"/query_memory/{names[0]}", json={"query": f"where is the {secret}?"}).status_code == 200
    # A model-backed task answered before the response: 25 turns compress into a memo.
    turns = [turn("user" if i % 2 == 0 else "assistant", f"{secret} long talk {i}") for i in range(25)]
    assert srv.post(f"/process/{names[1]}", json={"input_history": turns}).json() == {"status": "processed"}
    assert srv.get(f"/no/such/route/{secret}").status_code == 404
    for name in names:
        quiesce(srv.runtime, name)


def test_a_short_load_shows_in_the_expected_series(tmp_path, fake_llm, embedding_service: EmbeddingService):
    settings = make_settings(tmp_path, llm_base_url=fake_llm.base_url, llm_model="fake", llm_max_retries=0)
    names = ["Mimi", "Sora"]
    with LiveServer(settings, embeddings=embedding_service) as srv:
        run_load(srv, names, "lantern")
        _text, s = scrape(srv)

        requests = "nekomem_http_requests_total"
        assert one(s, requests, method="POST", route="/cache/{name}", status="200") == CACHE_TURNS
        assert one(s, requests, method="GET", route="/new_dialog/{name}", status="200") == DIALOGS
        assert one(s, requests, method="POST", route="/query_memory/{name}", status="200") == QUERIES
        assert one(s, requests, method="POST", route="/process/{name}", status="200") == 1
        assert one(s, requests, method="POST", route="/api/characters/{name}/facts", status="200") == 1
        assert one(s, requests, method="GET", route="<unmatched>", status="404") == 1
        assert not matching(s, requests, route="/metrics"), "a scrape is counted once it has been answered"
        latency = "nekomem_http_request_duration_seconds"
        assert one(s, latency + "_count", method="POST", route="/cache/{name}") == CACHE_TURNS
        assert one(s, latency + "_bucket", method="POST", route="/cache/{name}", le="+Inf") == CACHE_TURNS
        assert 0 < one(s, latency + "_sum", method="POST", route="/cache/{name}") < 60 * CACHE_TURNS

        # Model calls: one series per task the fake LLM was asked, equal to its own count.
        asked = {call["task"] for call in fake_llm.calls()}
        assert "summarize_recent" in asked
        for task in asked:
            sent = len(fake_llm.calls(task))
            assert one(s, "nekomem_model_requests_total", task=task) == sent, task
            assert sum(matching(s, "nekomem_model_calls_total", task=task)) == sent, task
            assert one(s, "nekomem_model_calls_total", task=task, outcome="ok") == sent, task
            assert one(s, "nekomem_model_call_duration_seconds_count", task=task) == sent, task
        assert {labels["tier"] for labels, _ in s["nekomem_model_calls_total"]} <= {"summary", "correction", "emotion"}

        # Embeddings: the imported facts (passages) and the queries went through the model.
        assert one(s, "nekomem_embedding_batches_total", kind="passage", outcome="ok") >= 1
        assert one(s, "nekomem_embedding_batches_total", kind="query", outcome="ok") >= 1
        passages = one(s, "nekomem_embedding_texts_total", kind="passage")
        assert passages >= 2  # both imported facts
        assert one(s, "nekomem_embedding_batch_duration_seconds_count", kind="query") >= 1
        assert one(s, "nekomem_embedding_pending") == 0
        assert one(s, "nekomem_embedding_state", state="ready") == 1

        assert one(s, "nekomem_characters_active") == len(names)
        assert one(s, "nekomem_characters_known") == len(names)
        assert one(s, "nekomem_character_activations_total") == len(names)
        assert one(s, "nekomem_character_passivations_total") == 0
        # Post-turn records wait in the fact extractor's batch: the gauge equals what the
        # outbox actors themselves report.
        states = [srv.runtime.registry.ask_sync(n, "outbox", lambda reply: OutboxState(reply=reply)) for n in names]
        assert one(s, "nekomem_outbox_pending") == sum(state["pending"] for state in states)
        assert one(s, "nekomem_outbox_dead_letters_total") == 0
        assert not s.get("nekomem_storage_errors_total")
        total, longest = one(s, "nekomem_mailbox_messages"), one(s, "nekomem_mailbox_max_messages")
        assert 0 <= longest <= total
        assert one(s, "nekomem_dispatcher_workers") == settings.runtime.actor_workers
        assert one(s, "nekomem_limited_mode") == 0

        # Released: one passivation, one active character less; the second scrape is counted.
        assert srv.post(f"/release_character/{names[0]}?derived_task_claim_token=t&derived_task_claim_generation=0").status_code == 200
        _text, again = scrape(srv)
        assert one(again, "nekomem_character_passivations_total") == 1
        assert one(again, "nekomem_characters_active") == len(names) - 1
        assert one(again, "nekomem_characters_known") == len(names)
        assert one(again, requests, method="GET", route="/metrics", status="200") == 1


def test_no_label_carries_names_memory_text_or_queries(tmp_path, fake_llm):
    secret = "marmalade"
    names = ["Zephyrine", "Quillon"]
    settings = make_settings(tmp_path, llm_base_url=fake_llm.base_url, llm_model="fake", llm_max_retries=0)
    with LiveServer(settings) as srv:
        run_load(srv, names, secret)
        # Paths and methods a client makes up do not mint series either.
        # A method the HTTP parser knows but the routes do not reaches the app (OTHER); one
        # it does not know is refused before it, in the project's error shape.
        assert srv.client.request("PROPFIND", f"/cache/{secret}").status_code == 405
        brew = srv.client.request("BREW", f"/cache/{secret}")
        assert brew.status_code == 400 and brew.json()["error_code"] == "bad_http_request"
        assert srv.get(f"/api/characters/{names[0]}/facts/{secret}").status_code in (404, 405)
        text, samples = scrape(srv)
    values = list(label_values(samples))
    assert values, "the scrape has labelled series"
    for needle in (secret, *names):
        assert needle.lower() not in text.lower(), needle
        assert not [v for v in values if needle.lower() in v.lower()], needle
    routes = {labels["route"] for labels, _ in samples["nekomem_http_requests_total"]}
    assert all(r.startswith("/") or r == "<unmatched>" for r in routes)
    assert "OTHER" in {labels["method"] for labels, _ in samples["nekomem_http_requests_total"]}


def test_each_server_in_a_process_has_its_own_registry(tmp_path):
    with LiveServer(make_settings(tmp_path / "a")) as a, LiveServer(make_settings(tmp_path / "b")) as b:
        for i in range(3):
            assert a.post("/cache/Lan", json={"input_history": [turn("user", f"a {i}")]}).status_code == 200
        assert b.post("/cache/Lan", json={"input_history": [turn("user", "b")]}).status_code == 200
        _t, sa = scrape(a)
        _t, sb = scrape(b)
    assert one(sa, "nekomem_http_requests_total", route="/cache/{name}") == 3
    assert one(sb, "nekomem_http_requests_total", route="/cache/{name}") == 1


def test_with_a_token_metrics_needs_the_bearer_and_counts_the_refusal(tmp_path):
    with LiveServer(make_settings(tmp_path, api_token="tok")) as srv:
        assert srv.get("/health").status_code == 200  # still open
        refused = srv.get("/metrics")
        assert refused.status_code == 401 and refused.json()["error_code"] == "unauthorized"
        assert httpx.get(srv.url + "/metrics", headers={"authorization": "Bearer wrong"}).status_code == 401
        _t, s = scrape(srv, headers={"authorization": "Bearer tok"})
    assert one(s, "nekomem_http_requests_total", method="GET", route="<unmatched>", status="401") == 2
    assert one(s, "nekomem_http_requests_total", method="GET", route="/health", status="200") == 1


def test_openmetrics_is_served_when_asked(tmp_path):
    with LiveServer(make_settings(tmp_path)) as srv:
        r = srv.get("/metrics", headers={"accept": "application/openmetrics-text; version=1.0.0"})
    assert r.status_code == 200
    assert r.headers["content-type"].startswith("application/openmetrics-text")
    assert r.text.rstrip().endswith("# EOF")


@pytest.mark.parametrize(
    "template,label",
    [
        ("/cache/{name:str}", "/cache/{name}"),
        ("/api/characters/{name:str}/{layer:str}", "/api/characters/{name}/{layer}"),
        ("/health", "/health"),
    ],
)
def test_route_templates_drop_converters(template, label):
    from starlette.routing import Route

    from nekomem.http.metrics_middleware import route_template

    assert route_template(Route(template, lambda request: None)) == label


def test_a_route_of_a_mounted_app_is_labelled_with_the_mount_template():
    import asyncio

    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Mount, Route

    from nekomem.http.metrics import REQUEST_BUCKETS
    from nekomem.http.metrics_middleware import RequestMetrics, RequestStats, RouteLabels

    async def ok(request):
        return PlainTextResponse("ok")

    inner = Starlette(routes=[Route("/", ok, methods=["POST"]), Route("/items/{item_id:int}", ok)])
    outer = Starlette(routes=[Mount("/tools", app=inner), Route("/cache/{name:str}", ok, methods=["POST"])])
    stats = RequestStats(REQUEST_BUCKETS)
    app = RequestMetrics(outer, stats, RouteLabels(lambda: outer.router.routes))

    async def call(method, path):
        sent = []

        async def receive():
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(message):
            sent.append(message)

        scope = {
            "type": "http",
            "method": method,
            "path": path,
            "raw_path": path.encode(),
            "query_string": b"",
            "headers": [],
            "root_path": "",
            "scheme": "http",
            "server": ("127.0.0.1", 1),
        }
        await app(scope, receive, send)
        return sent[0]["status"]

    async def load():
        assert await call("POST", "/tools/") == 200
        assert await call("GET", "/tools/items/41") == 200
        assert await call("POST", "/cache/Lan") == 200

    asyncio.run(load())
    seen = {(method, route): statuses for method, route, statuses, _b, _s in stats.snapshot()}
    assert seen == {("POST", "/tools"): {200: 1}, ("GET", "/tools/items/{item_id}"): {200: 1}, ("POST", "/cache/{name}"): {200: 1}}
