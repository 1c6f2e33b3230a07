"""The bytes of the /cache, /new_dialog and /query_memory answers, compared with a recording.

A server on a manual clock (display zone Asia/Tokyo, so the row times are localised) takes
a few turns and facts; each answer's exact body is compared with
``tests/golden/wire_answers.json``, recorded from the code before the answers became
Structs (issue 35: "each answer shaped once" must not change a byte). Two parts of an
answer are not the server's choice and are replaced before the comparison: a non-zero
``elapsed_ms`` (a measured time) and the session id of a journal row (unique per process
start).
Record again, only on purpose, with ``python -m tests.test_wire_golden`` (it rewrites the
file from the running code).
"""

from __future__ import annotations

import json
import re
import sys
from datetime import datetime, timezone
from pathlib import Path

from nekomem.runtime.clock import ManualClock
from tests.support.live import LiveServer, make_settings

GOLDEN = Path(__file__).parent / "golden" / "wire_answers.json"
NAME = "Lan"

_ELAPSED = re.compile(rb'"elapsed_ms":(?!0\.0[,}])[-0-9.e+]+')
_SESSION = re.compile(rb'"session_id":"[0-9a-f]{32}"')


def _turn(role: str, text: str) -> dict[str, object]:
    return {"role": role, "content": [{"type": "text", "text": text}]}


def _steady(body: bytes) -> str:
    body = _ELAPSED.sub(b'"elapsed_ms":"<elapsed>"', body)
    body = _SESSION.sub(b'"session_id":"<session>"', body)
    return body.decode("utf-8")


def record(root: Path) -> dict[str, str]:
    """Every answer of the scenario, keyed by a name, as the server sent it (steadied)."""
    answers: dict[str, str] = {}
    clock = ManualClock(datetime(2026, 5, 1, 12, 0, tzinfo=timezone.utc))
    settings = make_settings(root, display_timezone="Asia/Tokyo", recall_journal_fallback_rows=2000)
    with LiveServer(settings, clock=clock) as srv:

        def keep(key: str, method: str, path: str, **kwargs: object) -> None:
            response = getattr(srv, method)(path, **kwargs)
            answers[key] = f"{response.status_code} {response.headers.get('content-type')} " + _steady(response.content)

        keep("cache_empty_unknown", "post", "/cache/Nobody", json={"input_history": []})
        keep("query_unknown", "post", "/query_memory/Nobody", json={"query": "tea"})
        keep("query_unknown_markdown", "post", "/query_memory/Nobody", json={"query": "tea", "render": "markdown"})
        keep("new_dialog_unknown", "get", "/new_dialog/Nobody")
        turns = [
            _turn("user", "I drink green tea every morning, 緑茶が好き"),
            _turn("assistant", "Green tea in the morning sounds lovely."),
            _turn("user", "My sister moved to Canada last spring"),
        ]
        keep("cache_three", "post", "/cache/Lan", json={"input_history": turns})
        clock.advance(minutes=40)
        keep("cache_one", "post", "/cache/Lan", json={"input_history": [_turn("user", 'Tell me about "quotes" and é')]})
        keep("process_empty", "post", "/process/Lan", json={"input_history": []})
        keep("query_journal", "post", "/query_memory/Lan", json={"query": "green tea"})
        keep("query_journal_markdown", "post", "/query_memory/Lan", json={"query": "sister Canada", "render": "markdown", "language": "en"})
        facts = [
            {"text": "Master loves green tea", "created_at": "2026-04-30T09:00:00+00:00"},
            {"text": "Master's sister lives in Canada", "created_at": "2026-04-20T22:30:00+00:00"},
            {"text": "ご主人様は辛いラーメンが大好きだ", "created_at": "2026-03-01T00:00:00+00:00"},
        ]
        imported = srv.post(f"/api/characters/{NAME}/facts", json={"facts": facts})
        assert imported.status_code == 200, imported.text
        keep("query_facts", "post", "/query_memory/Lan", json={"query": "green tea"})
        keep("query_facts_markdown", "post", "/query_memory/Lan", json={"query": "sister", "render": "markdown"})
        keep("query_facts_markdown_zh", "post", "/query_memory/Lan", json={"query": "ラーメン", "render": "markdown", "language": "zh"})
        keep("query_nothing", "post", "/query_memory/Lan", json={"query": "volcano submarine"})
        keep("query_nothing_markdown", "post", "/query_memory/Lan", json={"query": "volcano submarine", "render": "markdown"})
        keep("query_time", "post", "/query_memory/Lan", json={"time": "yesterday"})
        keep("query_time_markdown", "post", "/query_memory/Lan", json={"time": "yesterday", "render": "markdown"})
        keep("query_both_markdown", "post", "/query_memory/Lan", json={"query": "volcano", "time": "last week", "render": "markdown"})
        keep("query_neither", "post", "/query_memory/Lan", json={})
        keep("query_neither_markdown", "post", "/query_memory/Lan", json={"render": "markdown"})
        subjects = [{"subject_kind": "group_chat", "subject_id": "g1"}]
        keep("query_subjects", "post", "/query_memory/Lan", json={"query": "green tea", "subjects": subjects})
        keep("search_for_memory", "get", "/search_for_memory/Lan/green%20tea")
        keep("new_dialog", "get", "/new_dialog/Lan")
        clock.advance(hours=6)
        keep("new_dialog_later", "get", "/new_dialog/Lan?language=ja")
    return answers


def test_the_answers_are_the_recorded_bytes(tmp_path: Path) -> None:
    expected = json.loads(GOLDEN.read_text(encoding="utf-8"))
    got = record(tmp_path)
    assert sorted(got) == sorted(expected)
    for key in expected:
        assert got[key] == expected[key], key


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as folder:
        answers = record(Path(folder))
    GOLDEN.write_text(json.dumps(answers, ensure_ascii=False, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    print(f"recorded {len(answers)} answers in {GOLDEN}", file=sys.stderr)
