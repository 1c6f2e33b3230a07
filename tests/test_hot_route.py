"""POST /cache past the layers that have nothing to do for it (nekomem.http.hot_route):
it is installed in single-node mode, and it answers exactly what the full stack answers,
for the turns it serves and for every request one of the layers it skips would refuse."""

from __future__ import annotations

import json
from pathlib import Path

from nekomem.http.hot_route import HotRoute
from tests.support.live import LiveServer, make_settings

# (method, path, headers, body) sent to both servers, in order: the stored turns count too.
_JSON = {"content-type": "application/json"}
REQUESTS: list[tuple[str, dict[str, str], bytes]] = [
    ("/cache/Lan", _JSON, b'{"input_history": [{"role": "user", "content": "hello"}]}'),
    ("/cache/Lan", _JSON, b'{"input_history": [{"role": "assistant", "content": "hi"}, {"role": "user", "content": "again"}]}'),
    ("/cache/Lan", _JSON, b'{"input_history": []}'),
    ("/cache/Nobody", _JSON, b'{"input_history": []}'),
    ("/cache/Lan", _JSON, b"{not json"),
    ("/cache/Lan", _JSON, b""),
    ("/cache/Lan", _JSON, b'{"input_history": 5}'),
    ("/cache/Lan", _JSON, b"{}"),
    ("/cache/Lan", _JSON, b'{"input_history": [{"role": "user", "content": 7}]}'),
    ("/cache/Lan", {**_JSON, "idempotency-key": "k1"}, b'{"input_history": [{"role": "user", "content": "once"}]}'),
    ("/cache/Lan", {**_JSON, "idempotency-key": "k1"}, b'{"input_history": [{"role": "user", "content": "once"}]}'),
    ("/cache/Lan", {**_JSON, "idempotency-key": "k" * 5000}, b'{"input_history": [{"role": "user", "content": "x"}]}'),
    ("/cache/..", _JSON, b'{"input_history": [{"role": "user", "content": "x"}]}'),
    ("/cache/CON", _JSON, b'{"input_history": [{"role": "user", "content": "x"}]}'),
    ("/cache/Lan", {"content-type": "text/plain"}, b'{"input_history": []}'),
    ("/cache/Lan", {**_JSON, "host": "evil.example"}, b'{"input_history": []}'),
    ("/cache/Lan", {**_JSON, "origin": "http://evil.example"}, b'{"input_history": []}'),
    ("/cache/Lan/extra", _JSON, b'{"input_history": []}'),
    ("/cache/", _JSON, b'{"input_history": []}'),
    ("/cache/Lan", _JSON, b'{"input_history": [{"role": "user", "content": "%s"}]}' % (b"x" * 2000)),
    ("/cache/Lan", _JSON, b'{"input_history": "[{\\"role\\": \\"user\\", \\"content\\": \\"encoded\\"}]", "language": "ja"}'),
]


def _exchange(srv: LiveServer) -> list[tuple[int, dict[str, str], bytes]]:
    answers = []
    for path, headers, body in REQUESTS:
        r = srv.post(path, headers=headers, content=body)
        kept = {k: v for k, v in r.headers.items() if k not in ("date", "server")}
        answers.append((r.status_code, kept, r.content))
    turn = {"input_history": [{"role": "user", "content": "held"}]}
    # Limited mode (blocked by the chat server), then a character /release_character holds.
    assert srv.post("/internal/storage/startup/block", json={"reason": "main_server_init"}).status_code == 200
    r = srv.post("/cache/Lan", json=turn)
    answers.append((r.status_code, {k: v for k, v in r.headers.items() if k not in ("date", "server")}, r.content))
    assert srv.post("/internal/storage/startup/continue").status_code == 200
    assert (
        srv.post(
            "/release_character/Lan?derived_task_claim_token=t&derived_task_claim_generation=0&hold_derived_task_admission=true"
        ).status_code
        == 200
    )
    r = srv.post("/cache/Lan", json=turn)
    answers.append((r.status_code, {k: v for k, v in r.headers.items() if k not in ("date", "server")}, r.content))
    return answers


def _metrics_lines(srv: LiveServer) -> list[str]:
    text = srv.get("/metrics").text
    return sorted(line for line in text.splitlines() if line.startswith("nekomem_http_requests_total{") and "/metrics" not in line)


def _rows(root: Path) -> list[str]:
    import sqlite3

    db = sqlite3.connect(root / "Lan" / "time_indexed.db")
    try:
        return [json.loads(m)["data"]["content"] for (m,) in db.execute("SELECT message FROM time_indexed_original ORDER BY id")]
    finally:
        db.close()


def test_the_hot_route_is_installed_in_single_node_mode(tmp_path):
    srv = LiveServer(make_settings(tmp_path / "m"))
    assert any(m.cls is HotRoute for m in srv.app.user_middleware)


def test_the_hot_route_answers_what_the_full_stack_answers(tmp_path):
    answers, metrics, rows = [], [], []
    for hot in (True, False):
        root = tmp_path / ("hot" if hot else "full")
        srv = LiveServer(make_settings(root, display_timezone="UTC", max_body_bytes=1024))
        if not hot:  # the same app without the hot route: every request takes the layers
            srv.app.user_middleware[:] = [m for m in srv.app.user_middleware if m.cls is not HotRoute]
        with srv:
            answers.append(_exchange(srv))
            metrics.append(_metrics_lines(srv))
        rows.append(_rows(root))
    hot_answers, full_answers = answers
    for request, a, b in zip([*REQUESTS, "limited mode", "held"], hot_answers, full_answers, strict=True):
        assert a == b, request
    assert metrics[0] == metrics[1]
    assert rows[0] == rows[1] == ["hello", "hi", "again", "once", "encoded"]
    # The exchange covered the turns served and the refusals of every layer skipped.
    statuses = {status for status, _, _ in hot_answers}
    assert {200, 400, 403, 404, 409, 413, 415, 422} <= statuses
    assert [json.loads(body)["error_code"] for _, _, body in hot_answers[-2:]] == [
        "storage_startup_blocked",
        "character_release_in_progress",
    ]
