"""Issue 10, security findings 1-5, over real HTTP: DNS rebinding, cross-site simple
requests, binding without a token, look-alike names, and amplification / poison."""

from __future__ import annotations

import json
import secrets
import subprocess
import unicodedata
from pathlib import Path

import httpx
import pytest

from nekomem.actors.messages import Flush
from tests.support.live import LiveServer, ServerProcess, make_settings
from tests.support.waiting import wait_for

HISTORY = {"input_history": [{"role": "user", "content": "I like plums"}]}
FACT = {"facts": [{"text": "Master likes plums"}]}
# (method, path, body) of routes that read or change memory.
READS = ["/new_dialog/Lan", "/get_recent_history/Lan", "/api/characters/Lan/facts", "/api/memory/powerful_memory_config"]
WRITES = [
    ("/cache/Lan", HISTORY),
    ("/api/characters/Lan/facts", FACT),
    ("/api/memory/powerful_memory_config", {"enabled": False}),
]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("security")
    with LiveServer(make_settings(root, allowed_origins=["http://app.example:8080"])) as srv:
        assert srv.post("/cache/Lan", json=HISTORY).status_code == 200
        yield srv, root


def _state(srv):
    facts = srv.get("/api/characters/Lan/facts").json()["total"]
    recent = srv.get("/api/characters/Lan/recent").json()["total"]
    return facts, recent, srv.get("/api/memory/powerful_memory_config").json()["enabled"]


# -- 1. DNS rebinding ----------------------------------------------------------------------
@pytest.mark.parametrize("host", ["evil.example:48912", "evil.example", "127.0.0.1.evil.example", "192.168.1.20:48912"])
def test_a_rebound_host_is_refused_on_every_read_and_write(server, host):
    srv, _root = server
    before = _state(srv)
    for path in READS:
        r = srv.get(path, headers={"host": host})
        assert r.status_code == 403 and r.json()["error_code"] == "host_not_allowed", path
        assert "plums" not in r.text
    for path, body in WRITES:
        r = srv.post(path, json=body, headers={"host": host})
        assert r.status_code == 403 and r.json()["error_code"] == "host_not_allowed"
    assert srv.delete("/api/characters/Lan/recent/0", headers={"host": host}).status_code == 403
    assert _state(srv) == before


@pytest.mark.parametrize("host", ["localhost:48912", "127.0.0.1", "[::1]:48912", "LOCALHOST", "app.localhost:1"])
def test_loopback_host_names_are_served(server, host):
    srv, _root = server
    assert srv.get("/get_recent_history/Lan", headers={"host": host}).status_code == 200


def test_allowed_hosts_setting_and_health_probe(tmp_path):
    with LiveServer(make_settings(tmp_path, allowed_hosts=["neko.lan"])) as srv:
        assert srv.get("/api/characters", headers={"host": "neko.lan:48912"}).status_code == 200
        assert srv.get("/api/characters", headers={"host": "other.lan"}).status_code == 403
        # /health is guarded too: a rebound page must not even learn the server is there.
        assert srv.get("/health", headers={"host": "other.lan"}).status_code == 403


# -- 2. cross-site simple requests -----------------------------------------------------------
SIMPLE_TYPES = ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", None]


@pytest.mark.parametrize("content_type", SIMPLE_TYPES)
@pytest.mark.parametrize("path,body", WRITES)
def test_a_simple_request_content_type_is_refused_with_415(server, content_type, path, body):
    srv, _root = server
    before = _state(srv)
    headers = {} if content_type is None else {"content-type": content_type}
    # No Origin at all (a non-browser client or a browser that omits it): still refused.
    r = srv.post(path, content=json.dumps(body).encode(), headers=headers)
    assert r.status_code == 415 and r.json()["error_code"] == "unsupported_media_type", r.text
    assert _state(srv) == before


@pytest.mark.parametrize("content_type", SIMPLE_TYPES + ["application/json"])
def test_a_foreign_origin_is_refused_whatever_the_content_type(server, content_type):
    srv, _root = server
    before = _state(srv)
    headers = {"origin": "https://evil.example"}
    if content_type:
        headers["content-type"] = content_type
    for path, body in WRITES:
        r = srv.post(path, content=json.dumps(body).encode(), headers=headers)
        assert r.status_code == 403 and r.json()["error_code"] == "origin_not_allowed"
    for path in READS:
        assert srv.get(path, headers={"origin": "null"}).status_code == 403
    assert _state(srv) == before


def test_listed_and_same_origins_are_served(server):
    srv, _root = server
    assert srv.get("/api/characters", headers={"origin": "http://app.example:8080"}).status_code == 200
    assert srv.get("/api/characters", headers={"origin": srv.url}).status_code == 200
    assert srv.get("/api/characters", headers={"origin": "http://app.example:8081"}).status_code == 403


def test_the_reference_clients_calls_keep_working(server):
    srv, _root = server
    # cross_server: aiohttp json= of a double-encoded history (Content-Type: application/json).
    body = {"input_history": json.dumps([{"role": "user", "content": [{"type": "text", "text": "hi"}]}], indent=2)}
    assert srv.post("/cache/Lan", json=body).json()["status"] == "cached"
    # Body-less writes (/reflect, reset_confirmed_at) need no Content-Type.
    assert srv.post("/internal/memory/reset_confirmed_at").json()["ok"] is True
    assert srv.post("/reflect/Lan").status_code == 200
    r = srv.post(
        "/api/memory/powerful_memory_config", content=b'{"enabled": true}', headers={"content-type": "application/json; charset=utf-8"}
    )
    assert r.json() == {"success": True, "enabled": True}


# -- 3. bind without a token -------------------------------------------------------------------
def test_binding_beyond_loopback_without_a_token_refuses_to_start(tmp_path):
    proc = ServerProcess(tmp_path / "mem", host="0.0.0.0")
    done = subprocess.run(proc.command(), env=proc.env, capture_output=True, timeout=60, cwd=Path(__file__).resolve().parents[1])
    assert done.returncode != 0
    assert b"NEKOMEM_API_TOKEN" in done.stderr
    assert not (tmp_path / "mem").exists()


def test_with_a_token_every_route_but_health_needs_the_bearer(tmp_path):
    proc = ServerProcess(tmp_path / "mem", host="0.0.0.0", env={"NEKOMEM_API_TOKEN": "s3cret-token"})
    proc.start()
    try:
        url = proc.url
        assert httpx.get(url + "/health").status_code == 200
        for auth in (None, "Bearer wrong", "Basic czNjcmV0LXRva2Vu", "s3cret-token"):
            headers = {} if auth is None else {"authorization": auth}
            r = httpx.post(url + "/cache/Lan", json=HISTORY, headers=headers)
            assert r.status_code == 401 and r.json()["error_code"] == "unauthorized"
            assert r.headers["www-authenticate"] == "Bearer"
            assert httpx.get(url + "/api/characters", headers=headers).status_code == 401
        good = {"authorization": "Bearer s3cret-token"}
        assert httpx.post(url + "/cache/Lan", json=HISTORY, headers=good).json()["status"] == "cached"
        assert httpx.get(url + "/api/characters", headers=good).json()["characters"][0]["name"] == "Lan"
    finally:
        proc.stop()


def test_a_token_on_loopback_is_enforced_too(tmp_path):
    with LiveServer(make_settings(tmp_path, api_token="tok")) as srv:
        assert srv.get("/api/characters").status_code == 401
        assert srv.get("/api/characters", headers={"authorization": "Bearer tok"}).status_code == 200


def test_with_a_token_the_browser_page_loads_but_its_api_calls_need_the_bearer(tmp_path):
    with LiveServer(make_settings(tmp_path, api_token="tok")) as srv:
        page = srv.get("/ui/")
        assert page.status_code == 200 and b"<html" in page.content.lower()
        assert srv.get("/ui/app.js").status_code == 200
        # Only the page's files are open, and only to reads.
        assert srv.post("/ui/", json={}).status_code in (401, 405)
        assert srv.post("/ui/", json={}).status_code != 200
        assert srv.get("/api/browse/characters").status_code == 401
        assert srv.get("/uix").status_code == 401


# -- 4. look-alike names -----------------------------------------------------------------------
def test_nfc_and_nfd_spellings_are_one_character_and_one_folder(server):
    srv, root = server
    nfc, nfd = unicodedata.normalize("NFC", "café"), unicodedata.normalize("NFD", "café")
    assert nfc != nfd
    assert srv.post(f"/cache/{nfc}", json=HISTORY).status_code == 200
    assert srv.post(f"/cache/{nfd}", json={"input_history": [{"role": "user", "content": "second"}]}).status_code == 200
    folders = [p.name for p in root.iterdir() if p.is_dir() and unicodedata.normalize("NFC", p.name) == nfc]
    assert folders == [nfc]
    assert srv.get(f"/api/characters/{nfd}/recent").json()["total"] == 2
    names = [c["name"] for c in srv.get("/api/characters").json()["characters"]]
    assert names.count(nfc) == 1 and nfd not in names


@pytest.mark.parametrize(
    "name",
    ["\u3164", "\u115f", "\uffa0", "\u3164\u3164", "neko\ufe0f", "neko\u034f", "ne\u200dko", "neko\U000e0101", "\u2060neko", "neko\u00ad"],
)
def test_invisible_and_default_ignorable_names_are_refused(server, name):
    srv, root = server
    before = sorted(p.name for p in root.iterdir())
    r = srv.post(f"/cache/{name}", json=HISTORY)
    assert r.status_code == 400 and r.json()["error_code"] == "name_invalid_chars"
    assert sorted(p.name for p in root.iterdir()) == before


# -- 5. amplification and poison ---------------------------------------------------------------
def _nested(depth: int) -> object:
    value: object = "x"
    for _ in range(depth):
        value = {"a": value}
    return value


def test_a_deep_or_large_source_is_refused_and_a_bounded_one_kept(server):
    srv, root = server
    before = srv.get("/api/characters/Lan/facts").json()["total"]
    for source in (_nested(900), _nested(9), {"blob": "y" * 10_000}):
        r = srv.post("/api/characters/Lan/facts", json={"facts": [{"text": "Master likes pears", "source": source}]})
        assert r.status_code in (400, 422) and r.json()["error_code"] in ("opaque_too_large", "body_too_deep"), r.text
    assert srv.get("/api/characters/Lan/facts").json()["total"] == before
    ok = srv.post("/api/characters/Lan/facts", json={"facts": [{"text": "Master likes pears", "source": _nested(7)}]})
    assert ok.status_code == 200
    items = srv.get("/api/characters/Lan/facts").json()["items"]
    assert any(i["source_ref"] == _nested(7) for i in items)


def test_a_request_grows_the_view_by_a_small_constant_times_its_size(server):
    srv, root = server
    view = root / "Lan" / "facts.json"
    flush = lambda: srv.runtime.registry.tell("Lan", "facts", Flush())  # noqa: E731 - queues a view write
    flush()
    # The view holds every fact imported so far (the earlier tests' included).
    known = [i["id"] for i in srv.get("/api/characters/Lan/facts", params={"limit": 1000}).json()["items"]]
    wait_for(lambda: (flush(), all(k.encode() in view.read_bytes() for k in known))[1], what="the facts view")
    before = view.stat().st_size
    texts = [" ".join(secrets.token_hex(4) for _ in range(6)) for _ in range(50)]
    body = json.dumps({"facts": [{"text": text, "source": _nested(7)} for text in texts]}).encode()
    added = srv.post("/api/characters/Lan/facts", content=body, headers={"content-type": "application/json"}).json()["added"]
    assert len(added) == 50
    wait_for(lambda: (flush(), added[-1].encode() in view.read_bytes())[1], what="the facts view")
    grown = view.stat().st_size - before
    # Content is stored once, compact; each record adds a fixed ~0.6 KB of bookkeeping
    # (ids, hash, timestamps, flags), independent of what the request sends.
    assert 0 < grown <= 2 * len(body) + 1024 * len(added)
    assert b"\n  " not in (root / "Lan" / "facts.json").read_bytes()  # compact, not indented


@pytest.mark.parametrize(
    "path",
    [
        "/cache/Lan",
        "/query_memory/Lan",
        "/api/characters/Lan/facts",
        "/record_surfaced/Lan",
        "/api/memory/powerful_memory_config",
        "/api/characters/Lan/card",
    ],
)
@pytest.mark.parametrize("depth", [40, 2000, 200_000])
def test_deeply_nested_bodies_get_a_4xx_on_every_route(server, path, depth):
    srv, _root = server
    body = b'{"x":' + b"[" * depth + b"]" * depth + b"}"
    r = srv.post(path, content=body, headers={"content-type": "application/json"})
    if depth <= 100 and r.status_code == 200:
        # An unknown field ("x") is skipped unread by the typed decoders; nothing of it is
        # kept. Deeper than any decoder follows, it is refused like every deep body.
        return
    assert 400 <= r.status_code < 500, r.text
    assert r.json()["status"] == "error"


def test_a_poisoned_facts_view_on_disk_does_not_break_reads(tmp_path):
    with LiveServer(make_settings(tmp_path)) as srv:
        assert srv.post("/api/characters/Lan/facts", json=FACT).status_code == 200
    # Written before the bounds existed: a fact whose source nests 900 levels (readable by
    # msgspec, fatal for an encoder with Python's recursion limit).
    view = tmp_path / "Lan" / "facts.json"
    facts = json.loads(view.read_text())
    facts[0]["source_ref"] = _nested(900)
    view.write_text(json.dumps(facts))
    for _restart in range(2):
        with LiveServer(make_settings(tmp_path)) as srv:
            r = srv.get("/api/characters/Lan/facts")
            assert r.status_code == 200, r.text
            assert [i["text"] for i in r.json()["items"]] == ["Master likes plums"]
            assert r.json()["items"][0]["source_ref"] is None
            assert srv.post("/query_memory/Lan", json={"query": "plums"}).status_code == 200
