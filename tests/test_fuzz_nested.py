"""Issue 38: odd values in every nested free-form field a route reads, on a real server.

``tests/test_fuzz_http.py`` generates bodies from ``/openapi.json``, whose schema leaves
the free-form parts open (a message's ``metadata``, a theater capsule's fields, the
scoped payloads' subjects, segments and facts, a fact's ``source``). Here each of those
*slots* gets odd values: first a fixed table (numbers out of every range, lists, nulls,
nesting deeper than the body bound, a string of 150,000 characters, lone surrogates, NUL,
bidi and zero-width marks), then values hypothesis draws (recursive JSON of any shape).
Every answer must be below 500, and afterwards ``/health`` must show no handler error,
no restarted layer and no failed one: a value that reached an actor and failed there
counts as a finding even when its request was answered.

``NESTED_FUZZ_EXAMPLES`` sets how many drawn cases run (default 400)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.live import LiveServer, make_settings
from tests.test_neko_theater import capsule

EXAMPLES = int(os.environ.get("NESTED_FUZZ_EXAMPLES", "400"))
NAME = "Lan"
SCOPED = f"/internal/memory/{NAME}"
SUBJECT = {"subject_kind": "group_participant", "subject_id": "qq:123456:777"}


def _deep(levels: int) -> Any:
    value: Any = "bottom"
    for i in range(levels):
        value = [value] if i % 2 else {"k": value}
    return value


ODD: list[Any] = [
    None,
    True,
    0,
    -1,
    2**63,
    -(2**63) - 1,
    10**30,
    1e308,
    -0.0,
    "",
    " ",
    "2026/12/06",
    "\x00",
    "\ud800",  # a lone surrogate (sent as the escape \ud800)
    "\u202eevil\u202c\u200b\ufeff",
    "ねこ🐈‍⬛" * 3,
    "x" * 150_000,
    [],
    [None],
    [1, "a", None, [2]],
    {},
    {"": None},
    {"\x00": 1, "k" * 300: [1]},
    _deep(8),
    _deep(31),
    _deep(60),
]

# A JSON value of any shape: the drawn half of the fuzz.
JSON_VALUES = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=40)
    | st.sampled_from(["2026/12/06", "1733443200", "2026-12-06T21:30:00+09:00", "x" * 5000, "\ud800"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=12,
)


def message(**extra: Any) -> dict[str, Any]:
    return {"role": "user", "content": "odd fields probe", **extra}


def theater_message(field: str, value: Any) -> dict[str, Any]:
    meta = capsule("rain", "s1", "We sheltered from the rain.")
    meta["metadata"][field] = value
    return meta


def theater_cache(field: str) -> Callable[[Any], tuple[str, str, Any]]:
    return lambda v: ("POST", f"/cache/{NAME}", {"input_history": [theater_message(field, v)], "idempotency_key": "arch-1"})


# slot name -> value -> (method, path, body)
SLOTS: dict[str, Callable[[Any], tuple[str, str, Any]]] = {
    "/cache input_history[0].metadata": lambda v: ("POST", f"/cache/{NAME}", {"input_history": [message(metadata=v)]}),
    "/cache input_history[0].content": lambda v: ("POST", f"/cache/{NAME}", {"input_history": [message(content=v)]}),
    "/cache input_history[0].content[0]": lambda v: ("POST", f"/cache/{NAME}", {"input_history": [message(content=[v])]}),
    "/cache input_history[0].timestamp": lambda v: ("POST", f"/cache/{NAME}", {"input_history": [message(timestamp=v)]}),
    "/cache input_history[0].data": lambda v: ("POST", f"/cache/{NAME}", {"input_history": [{"type": "human", "data": v}]}),
    "/cache input_history[0].data.metadata": lambda v: (
        "POST",
        f"/cache/{NAME}",
        {"input_history": [{"type": "human", "data": {"content": "x", "metadata": v}}]},
    ),
    "/cache input_history (string)": lambda v: ("POST", f"/cache/{NAME}", {"input_history": json.dumps([message(metadata=v)])}),
    "/settle input_history[0].metadata": lambda v: ("POST", f"/settle/{NAME}", {"input_history": [message(metadata=v)]}),
    "/cache theater metadata (whole)": lambda v: (
        "POST",
        f"/cache/{NAME}",
        {
            "input_history": [
                {
                    "role": "system",
                    "content": "capsule",
                    "metadata": {
                        "source": "theater_numeric_v2",
                        "memory_tier": "episode_summary",
                        **(v if isinstance(v, dict) else {"v": v}),
                    },
                }
            ],
            "idempotency_key": "arch-2",
        },
    ),
    **{
        f"/cache theater metadata.{field}": theater_cache(field)
        for field in (
            "performed_at",
            "story_id",
            "session_id",
            "story_title",
            "episode_status",
            "ending_title",
            "episode_summary",
            "archive_through_revision",
            "run_index",
            "story_run_count",
            "ending_titles_seen",
            "_theater_previous_episode",
        )
    },
    "/cache theater_archive_attempt": lambda v: (
        "POST",
        f"/cache/{NAME}",
        {"input_history": [theater_message("story_title", "t")], "idempotency_key": "arch-3", "theater_archive_attempt": v},
    ),
    "/cache theater_forget_marker": lambda v: (
        "POST",
        f"/cache/{NAME}",
        {"input_history": [theater_message("story_title", "t")], "idempotency_key": "arch-4", "theater_forget_marker": v},
    ),
    "theater/forget story_id": lambda v: ("POST", f"{SCOPED}/theater/forget", {"story_id": v}),
    "theater/retract archive_through_revision": lambda v: (
        "POST",
        f"{SCOPED}/theater/retract",
        {"story_id": "rain", "session_id": "s1", "archive_through_revision": v, "archive_request_id": "r"},
    ),
    "theater/retract session_id": lambda v: (
        "POST",
        f"{SCOPED}/theater/retract",
        {"story_id": "rain", "session_id": v, "archive_through_revision": 5},
    ),
    "scoped_facts subject": lambda v: ("POST", f"{SCOPED}/scoped_facts", {"subject": v, "facts": [{"text": "likes tea"}]}),
    "scoped_facts subject.subject_id": lambda v: (
        "POST",
        f"{SCOPED}/scoped_facts",
        {"subject": {**SUBJECT, "subject_id": v}, "facts": [{"text": "likes tea"}]},
    ),
    "scoped_facts facts": lambda v: ("POST", f"{SCOPED}/scoped_facts", {"subject": SUBJECT, "facts": v}),
    "scoped_facts facts[0]": lambda v: ("POST", f"{SCOPED}/scoped_facts", {"subject": SUBJECT, "facts": [v]}),
    "scoped_facts facts[0].importance": lambda v: (
        "POST",
        f"{SCOPED}/scoped_facts",
        {"subject": SUBJECT, "facts": [{"text": "likes tea", "importance": v}]},
    ),
    "scoped_facts facts[0].source": lambda v: (
        "POST",
        f"{SCOPED}/scoped_facts",
        {"subject": SUBJECT, "facts": [{"text": "likes tea", "source": v}]},
    ),
    "scoped_facts display_name": lambda v: (
        "POST",
        f"{SCOPED}/scoped_facts",
        {"subject": SUBJECT, "facts": [{"text": "likes tea"}], "display_name": v},
    ),
    "scoped_history subject": lambda v: ("POST", f"{SCOPED}/scoped_history", {"subject": v, "input_history": [message()]}),
    "scoped_history input_history": lambda v: ("POST", f"{SCOPED}/scoped_history", {"subject": SUBJECT, "input_history": v}),
    "scoped_history input_history[0].metadata": lambda v: (
        "POST",
        f"{SCOPED}/scoped_history",
        {"subject": SUBJECT, "input_history": [message(metadata=v)]},
    ),
    "scoped_history speaker_label": lambda v: (
        "POST",
        f"{SCOPED}/scoped_history",
        {"subject": SUBJECT, "input_history": [message()], "speaker_label": v},
    ),
    "scoped_history subject_epochs": lambda v: (
        "POST",
        f"{SCOPED}/scoped_history",
        {"subject": SUBJECT, "input_history": [message()], "subject_epochs": v},
    ),
    "scoped_history segments": lambda v: ("POST", f"{SCOPED}/scoped_history", {"segments": v}),
    "scoped_history segments[0]": lambda v: ("POST", f"{SCOPED}/scoped_history", {"segments": [v]}),
    "scoped_history segments[0].input_history": lambda v: (
        "POST",
        f"{SCOPED}/scoped_history",
        {"segments": [{"subject": SUBJECT, "input_history": v}]},
    ),
    "scoped_context subjects": lambda v: ("POST", f"{SCOPED}/scoped_context", {"subjects": v}),
    "scoped_context subjects[0]": lambda v: ("POST", f"{SCOPED}/scoped_context", {"subjects": [v]}),
    "scoped_context language": lambda v: ("POST", f"{SCOPED}/scoped_context", {"subjects": [SUBJECT], "language": v}),
    "scoped_mentions subjects": lambda v: ("POST", f"{SCOPED}/scoped_mentions", {"response_text": "hi qq", "subjects": v}),
    "scoped_mentions response_text": lambda v: ("POST", f"{SCOPED}/scoped_mentions", {"response_text": v, "subjects": [SUBJECT]}),
    "scoped_forget subject": lambda v: ("POST", f"{SCOPED}/scoped_forget", {"subject": v}),
    "scoped_forget forget_epoch": lambda v: ("POST", f"{SCOPED}/scoped_forget", {"subject": SUBJECT, "forget_epoch": v}),
    "facts facts[0].source": lambda v: (
        "POST",
        f"/api/characters/{NAME}/facts",
        {"facts": [{"text": "Master owns a kettle", "source": v}]},
    ),
    "facts facts[0].event_start_at": lambda v: (
        "POST",
        f"/api/characters/{NAME}/facts",
        {"facts": [{"text": "Master went hiking", "event_start_at": v}]},
    ),
    "facts facts[0].entity": lambda v: ("POST", f"/api/characters/{NAME}/facts", {"facts": [{"text": "Master sings", "entity": v}]}),
    "query_memory subjects": lambda v: ("POST", f"/query_memory/{NAME}", {"query": "tea", "subjects": v}),
    "query_memory time": lambda v: ("POST", f"/query_memory/{NAME}", {"time": v}),
    "query_memory query": lambda v: ("POST", f"/query_memory/{NAME}", {"query": v}),
    "recent edit text": lambda v: ("PATCH", f"/api/characters/{NAME}/recent/0", {"text": v}),
    "card entries[0].text": lambda v: ("POST", f"/api/characters/{NAME}/card", {"entries": [{"entity": "neko", "text": v}]}),
    "card entries[0].entity": lambda v: ("POST", f"/api/characters/{NAME}/card", {"entries": [{"entity": v, "text": "Lan hums"}]}),
    "record_surfaced reflection_ids": lambda v: ("POST", f"/record_surfaced/{NAME}", {"reflection_ids": v}),
    "prompt-locale language": lambda v: ("PUT", f"/prompt-locale/{NAME}", {"language": v}),
    "repetition_insights assistant_message_limit": lambda v: (
        "POST",
        f"{SCOPED}/repetition_insights",
        {"language": "en", "assistant_message_limit": v},
    ),
}


def send(client: httpx.Client, slot: str, value: Any) -> tuple[int, str]:
    method, path, body = SLOTS[slot](value)
    # json.dumps escapes lone surrogates (\ud800), which a UTF-8 encoder would refuse.
    raw = json.dumps(body)
    r = client.request(method, path, content=raw.encode("ascii"), headers={"Content-Type": "application/json"})
    return r.status_code, r.text[:300]


def test_odd_values_in_nested_fields_never_answer_5xx_nor_fail_a_layer(tmp_path: Path, fake_llm) -> None:
    root = tmp_path / "memory"
    config = make_settings(root, embedding_enabled=False, llm_base_url=fake_llm.base_url, llm_model="fake", max_body_bytes=400_000)
    with LiveServer(config) as srv:
        assert srv.client is not None
        client = srv.client
        seed = client.post(f"/cache/{NAME}", json={"input_history": [message(), {"role": "assistant", "content": "noted"}]})
        assert seed.status_code == 200, seed.text
        errors: list[str] = []
        statuses: dict[int, int] = {}

        def probe(slot: str, value: Any) -> None:
            status, text = send(client, slot, value)
            statuses[status] = statuses.get(status, 0) + 1
            if status >= 500:
                errors.append(f"{slot} = {json.dumps(value)[:80]} -> {status} {text}")

        for slot in SLOTS:
            for value in ODD:
                probe(slot, value)

        @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=False, suppress_health_check=list(HealthCheck))
        @given(slot=st.sampled_from(sorted(SLOTS)), value=JSON_VALUES)
        def drawn(slot: str, value: Any) -> None:
            probe(slot, value)

        drawn()
        print(f"nested fuzz: {sum(statuses.values())} requests over {len(SLOTS)} slots, statuses {sorted(statuses.items())}")
        assert errors == [], errors[:10]
        supervision = client.get("/health").json()["supervision"]
        assert supervision == {"child_restarts": 0, "failed_children": 0, "handler_errors": 0}, supervision
        # Still serving: a write and a context read of the fuzzed character.
        assert client.post(f"/cache/{NAME}", json={"input_history": [message(content="after the fuzz")]}).status_code == 200
        assert "after the fuzz" in client.get(f"/new_dialog/{NAME}").text
