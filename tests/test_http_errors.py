"""Bad input over real HTTP: a 4xx JSON error naming the problem, nothing written."""

from __future__ import annotations

import json

import pytest

from tests.support.live import LiveServer, make_settings
from tests.support.waiting import quiesce

GOOD = {"input_history": [{"role": "user", "content": "keep me"}]}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("errors")
    with LiveServer(make_settings(root, max_body_bytes=4096)) as srv:
        assert srv.post("/cache/Lan", json=GOOD).status_code == 200
        quiesce(srv.runtime, "Lan")  # the post-turn record is written after the answer
        yield srv, root


def snapshot(root):
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and "-wal" not in p.name and "-shm" not in p.name), (
        root / "Lan" / "recent.json"
    ).read_bytes()


def check_error(response, status, code=None):
    assert response.status_code == status, response.text
    body = response.json()
    assert body["status"] == "error"
    assert isinstance(body["message"], str) and body["message"]
    if code:
        assert body["error_code"] == code
    return body


BAD_NAMES = ["..%2Fx", "a%2Fb", "a%5Cb", "%20", "x" * 51, "bad%01name", "tab%09name", ".", "..", "nul%00"]


@pytest.mark.parametrize("name", BAD_NAMES)
def test_bad_names_are_400(server, name):
    srv, root = server
    before = snapshot(root)
    r = srv.post(f"/cache/{name}", json=GOOD)
    assert r.status_code in (400, 404), r.text  # 404 only where the router cannot match at all
    assert r.json()["status"] == "error"
    assert snapshot(root) == before


def test_name_length_boundary(server):
    srv, root = server
    assert srv.post("/cache/" + "y" * 50, json=GOOD).status_code == 200
    check_error(srv.post("/cache/" + "y" * 51, json=GOOD), 400)


@pytest.mark.parametrize(
    "content, status, code",
    [
        (b"{not json", 400, "malformed_json"),
        (b"", 400, "empty_body"),
        (b"[1, 2]", 422, "body_not_object"),
        (b'{"other": 1}', 422, "missing_input_history"),
        (b'{"input_history": 5}', 422, "bad_input_history"),
        (b'{"input_history": "[broken"}', 422, "bad_input_history"),
        (b'{"input_history": [5]}', 422, "bad_message"),
        (b'{"input_history": [{"role": "user", "content": 7}]}', 422, "bad_message"),
        (b'{"input_history": [{"role": "user", "content": "x", "timestamp": "yesterday-ish"}]}', 422, "bad_message"),
        (b'{"input_history": [{"type": "human"}]}', 422, "bad_message"),
    ],
)
def test_bad_bodies(server, content, status, code):
    srv, root = server
    before = snapshot(root)
    body = check_error(srv.post("/cache/Lan", content=content, headers={"content-type": "application/json"}), status, code)
    if code == "bad_message":
        assert "input_history[0]" in body["message"]
    assert snapshot(root) == before


def test_a_bad_message_anywhere_stores_nothing(server):
    srv, root = server
    before = snapshot(root)
    history = [{"role": "user", "content": "fine"}, {"role": "user", "content": None}]
    body = check_error(srv.post("/cache/Lan", json={"input_history": history}), 422, "bad_message")
    assert "input_history[1]" in body["message"]
    assert snapshot(root) == before


def test_oversized_body_is_413(server):
    srv, root = server
    before = snapshot(root)
    big = json.dumps({"input_history": [{"role": "user", "content": "x" * 10_000}]})
    check_error(srv.post("/cache/Lan", content=big, headers={"content-type": "application/json"}), 413, "body_too_large")
    assert snapshot(root) == before


def test_unknown_route_and_method(server):
    srv, _ = server
    check_error(srv.get("/no/such/route"), 404, "not_found")
    check_error(srv.get("/cache/Lan"), 405, "method_not_allowed")


def test_still_serving_after_bad_input(server):
    srv, root = server
    assert srv.get("/health").json()["status"] == "ok"
    assert srv.post("/cache/Lan", json=GOOD).json() == {"status": "cached", "count": 1}
    assert "keep me" in srv.get("/new_dialog/Lan").text
