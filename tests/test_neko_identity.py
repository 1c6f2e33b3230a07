"""The identity and trust routes the reference's QQ bridge and trusted-users page call
(/internal/identity/*, /internal/trust/*), on a real server, with the process-wide
speaker_trust.json (pool version 2) checked on disk."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support.live import LiveServer, make_settings

SCOPE = {
    "platform": "qq",
    "channel": "open",
    "actor_scope": "per_conversation",
    "conversation_scope": "global",
    "asserted_by": "protocol:qq-open-v2",
}
LEGACY_SOURCE = "qq_auto_reply.business_config.speaker_trust_profiles.v1"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    root = tmp_path_factory.mktemp("identity")
    with LiveServer(make_settings(root)) as srv:
        yield srv, root


def _pool(root: Path) -> dict:
    return json.loads((root / "speaker_trust.json").read_text(encoding="utf-8"))


def _ok(response) -> dict:
    assert response.status_code == 200, response.text
    return response.json()


def test_the_bridge_start_up_sequence_declares_imports_ensures_and_binds(server):
    srv, root = server
    declared = _ok(srv.post("/internal/identity/scope", json=SCOPE))
    assert declared["persisted"] is True and declared["platform"] == "qq"
    assert declared["actor_scope"] == "per_conversation" and declared["asserted_at"]
    before = (root / "speaker_trust.json").read_bytes()
    # Declared again at the next start: same answer, the file is not rewritten.
    again = _ok(srv.post("/internal/identity/scope", json=SCOPE))
    assert again["asserted_at"] == declared["asserted_at"] and again["persisted"] is True
    assert (root / "speaker_trust.json").read_bytes() == before

    # The plugin pushes its frozen legacy ledger, last chunk final: the barrier opens.
    chunk = {
        "platform": "qq",
        "source": LEGACY_SOURCE,
        "chunk_index": 0,
        "final": True,
        "profiles": {"10001": {"adjustment": -0.08, "message_count": 3, "processed_signal_events": ["sig-a"]}, "bad key": {}},
    }
    imported = _ok(srv.post("/internal/trust/import_legacy_profiles", json=chunk))
    assert imported["imported"] == ["qq:10001"] and imported["barrier"] == "cleared" and imported["persisted"] is True
    assert imported["skipped"] == [{"key": "bad key", "reason": "invalid_account_id"}]
    # Pushed again at every start: nothing is added twice.
    assert _ok(srv.post("/internal/trust/import_legacy_profiles", json=chunk))["imported"] == []
    profile = _ok(srv.get("/internal/trust/profile", params={"account_id": "qq:10001"}))
    assert profile["known"] is True and profile["account_adjustment"] == pytest.approx(-0.08)
    assert profile["account_message_count"] == 3 and profile["barrier_pending"] is False

    # The trusted-users page merges a group id into the owner's identity.
    owner = _ok(srv.post("/internal/identity/accounts/ensure", json={"account_id": "qq:OWNER"}))
    assert owner["entity_id"].startswith("ent_") and owner["persisted"] is True
    assert _ok(srv.post("/internal/identity/accounts/ensure", json={"account_id": "qq:OWNER"}))["entity_id"] == owner["entity_id"]
    bind = {"account_id": "qq:10001", "entity_id": owner["entity_id"], "bound_by": "qq_auto_reply.dashboard", "require_unbound": True}
    bound = _ok(srv.post("/internal/identity/accounts/bind", json=bind))
    assert bound["changed"] is True and bound["persisted"] is True
    member = _ok(srv.get("/internal/trust/profile", params={"account_id": "qq:10001"}))
    # The account had its own entity (from the import): binding merged the two, and the
    # older entity survives, as in the reference.
    assert bound["merged"] is True and member["entity_id"] == bound["entity_id"]
    assert _ok(srv.get("/internal/trust/profile", params={"account_id": "qq:OWNER"}))["entity_id"] == bound["entity_id"]
    assert member["bound_by"] == "qq_auto_reply.dashboard"
    assert sorted(member["entity_accounts"]) == ["qq:10001", "qq:OWNER"]
    assert member["adjustment_sum"] == pytest.approx(-0.08)
    # A second bind of the same account elsewhere would merge two people: refused.
    other = _ok(srv.post("/internal/identity/accounts/ensure", json={"account_id": "qq:OTHER"}))
    refused = srv.post("/internal/identity/accounts/bind", json={**bind, "entity_id": other["entity_id"]})
    assert refused.status_code == 409 and refused.json()["error_code"] == "already_bound"
    assert _ok(srv.get("/internal/trust/profile", params={"account_id": "qq:OTHER"}))["entity_accounts"] == ["qq:OTHER"]

    # Undo: the bound side moves out with its ledger; a second click changes nothing.
    undone = _ok(srv.post("/internal/identity/accounts/unbind", json={"account_id": "qq:10001", "require_provenance": True}))
    assert undone["changed"] is True and undone["previous_entity_id"] == bound["entity_id"]
    assert undone["ledger_delta"] == pytest.approx(-0.08) and undone["stranded_rows"] == 0
    twice = _ok(srv.post("/internal/identity/accounts/unbind", json={"account_id": "qq:10001", "require_provenance": True}))
    assert twice["changed"] is False and twice["reason"] == "not_bound"

    pool = _pool(root)
    assert pool["version"] == 2
    assert {"account_index", "entities", "forgotten", "channel_observations", "platform_identity_scope"} <= set(pool)
    assert pool["platform_identity_scope"]["qq"]["asserted_by"] == "protocol:qq-open-v2"
    assert pool["account_index"]["qq:10001"] == undone["entity_id"]


def test_bad_identity_requests_get_the_error_shape_and_change_nothing(server):
    srv, root = server
    srv.post("/internal/identity/scope", json=SCOPE)
    before = (root / "speaker_trust.json").read_bytes()
    cases = [
        ("/internal/identity/scope", {**SCOPE, "actor_scope": "probably_global"}, 422, "bad_scope"),
        ("/internal/identity/scope", {**SCOPE, "asserted_by": " "}, 422, "bad_asserted_by"),
        ("/internal/identity/accounts/ensure", {"account_id": "no separator"}, 422, "bad_account_id"),
        ("/internal/identity/accounts/bind", {"account_id": "qq:1", "entity_id": "ent_000000000000000000000000"}, 404, "unknown_entity"),
        ("/internal/identity/entities/merge", {"entity_id": "ent_x", "other_entity_id": ""}, 422, "bad_entity_id"),
        ("/internal/trust/import_legacy_profiles", {"platform": "q q", "source": "s"}, 422, "bad_platform"),
        (
            "/internal/trust/import_legacy_profiles",
            {"platform": "qq", "source": "s", "profiles": {str(i): {} for i in range(501)}},
            422,
            None,
        ),
        ("/internal/identity/accounts/ensure", {}, 422, "schema_violation"),
    ]
    for path, body, status, code in cases:
        response = srv.post(path, json=body)
        assert response.status_code == status, (path, response.text)
        assert "error_code" in response.json() and (code is None or response.json()["error_code"] == code)
    assert srv.get("/internal/trust/profile").status_code == 422
    assert (root / "speaker_trust.json").read_bytes() == before
    # The guard: another site's page cannot write, and a write must be JSON.
    assert srv.post("/internal/identity/scope", json=SCOPE, headers={"Origin": "https://evil.example"}).status_code == 403
    assert srv.post("/internal/identity/scope", content=json.dumps(SCOPE), headers={"Content-Type": "text/plain"}).status_code == 415


def test_merge_is_idempotent_and_commutative(server):
    srv, _root = server
    ids = [_ok(srv.post("/internal/identity/accounts/ensure", json={"account_id": f"bili:{n}"}))["entity_id"] for n in (1, 2, 3)]
    first = _ok(srv.post("/internal/identity/entities/merge", json={"entity_id": ids[0], "other_entity_id": ids[1]}))
    assert first["persisted"] is True
    assert (
        _ok(srv.post("/internal/identity/entities/merge", json={"entity_id": ids[1], "other_entity_id": ids[0]}))["entity_id"]
        == first["entity_id"]
    )
    _ok(srv.post("/internal/identity/entities/merge", json={"entity_id": ids[2], "other_entity_id": first["entity_id"]}))
    profile = _ok(srv.get("/internal/trust/profile", params={"account_id": "bili:3"}))
    assert sorted(profile["entity_accounts"]) == ["bili:1", "bili:2", "bili:3"]
    # A merged-away id still names the same person.
    assert (
        _ok(srv.post("/internal/identity/entities/merge", json={"entity_id": ids[1], "other_entity_id": ids[2]}))["entity_id"]
        == profile["entity_id"]
    )


def _all_bytes(root: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file())


def test_forgetting_an_entity_erases_its_ledger_and_the_facts_it_said(server):
    srv, root = server
    secret_event = "sig-secret-77777"
    srv.post(
        "/internal/trust/import_legacy_profiles",
        json={
            "platform": "qq",
            "source": LEGACY_SOURCE,
            "final": True,
            "profiles": {"77777": {"adjustment": 0.04, "processed_signal_events": [secret_event]}},
        },
    )
    entity = _ok(srv.post("/internal/identity/accounts/ensure", json={"account_id": "qq:77777"}))["entity_id"]
    # Two imported group facts (the importer keeps reference fields under source_ref.neko):
    # one said by the forgotten account, one by somebody else.
    said = "Member 77777 keeps a ferret called Biscuit"
    kept = "Member 88888 plays the oboe on Sundays"
    facts = [
        {"text": said, "source": {"neko": {"speaker_id": "qq:77777", "speaker_entity_id": entity}}},
        {"text": kept, "source": {"neko": {"speaker_id": "qq:88888"}}},
    ]
    _ok(srv.post("/api/characters/Lan/facts", json={"facts": facts}))

    forgotten = _ok(srv.post("/internal/identity/entities/forget", json={"entity_id": entity}))
    assert forgotten["changed"] is True and forgotten["accounts"] == ["qq:77777"] and forgotten["facts_erased"] == 1
    texts = [f["text"] for f in srv.get("/api/characters/Lan/facts", params={"status": "all", "limit": 1000}).json()["items"]]
    assert said not in texts and kept in texts
    profile = _ok(srv.get("/internal/trust/profile", params={"account_id": "qq:77777"}))
    assert profile["known"] is False and profile["entity_id"] is None
    # Deleting deletes: neither the account id, its ledger's event ids nor what it said
    # is left in any file under the memory root.
    data = _all_bytes(root)
    for needle in ("qq:77777", secret_event, said):
        assert needle.encode("utf-8") not in data, needle
    assert kept.encode("utf-8") in data
    # The plugin re-pushes its legacy ledger at every start: the account stays forgotten.
    again = _ok(
        srv.post(
            "/internal/trust/import_legacy_profiles",
            json={"platform": "qq", "source": LEGACY_SOURCE, "final": True, "profiles": {"77777": {"adjustment": 0.04}}},
        )
    )
    assert again["imported"] == [] and again["skipped"] == [{"key": "77777", "reason": "forgotten"}]
    # Forgetting again is a no-op.
    assert _ok(srv.post("/internal/identity/entities/forget", json={"entity_id": entity}))["changed"] is False


def test_reconcile_folds_signal_events_from_fact_rows_once(server):
    srv, _root = server
    srv.post("/internal/trust/waive_legacy_barrier", json={"platform": "qq"})
    events = [{"speaker_id": "qq:55555", "event_id": "recon-1", "kind": "confirmation"}]
    _ok(
        srv.post(
            "/api/characters/Mei/facts",
            json={"facts": [{"text": "Mei likes tea", "source": {"neko": {"_speaker_trust_signal_events": events}}}]},
        )
    )
    first = _ok(srv.post("/internal/trust/reconcile_from_facts", json={"character_names": ["Mei"]}))
    assert first["scanned"] == 1 and first["applied"] == 1 and first["persisted"] is True
    assert _ok(srv.post("/internal/trust/reconcile_from_facts", json={}))["applied"] == 0
    assert _ok(srv.get("/internal/trust/profile", params={"account_id": "qq:55555"}))["account_adjustment"] == pytest.approx(0.04)


def test_a_pool_the_reference_wrote_is_read_and_its_forgotten_ids_are_not_kept(tmp_path):
    entity = "ent_0123456789abcdef01234567"
    reference_pool = {
        "version": 2,
        "updated_at": "2026-12-01T10:00:00+00:00",
        "legacy_barriers": {"qq": {"source": LEGACY_SOURCE, "status": "cleared", "chunks": 1}},
        # A stale alias the file does not back up: ignored, rebuilt from the entities.
        "account_index": {"qq:1": entity, "qq:ghost": entity},
        "entities": {
            entity: {
                "entity_id": entity,
                "status": "active",
                "created_at": "2026-12-01T10:00:00+00:00",
                "accounts": {"qq:1": {"adjustment": "0.12", "message_count": 5, "channels_seen": {"napcat": {"count": 2}}}},
                "canonical_accounts": {"qq": {"account_id": "qq:nobody"}},
            }
        },
        "forgotten": {"ent_ffffffffffffffffffffffff": {"forgotten_at": "2026-11-01T00:00:00+00:00", "accounts": ["qq:424242"]}},
        "channel_observations": {"qq": {"onebot": {"accounts": 1}}},
        "platform_identity_scope": {},
        "something_newer": {"kept": False},
    }
    (tmp_path / "speaker_trust.json").write_text(json.dumps(reference_pool), encoding="utf-8")
    with LiveServer(make_settings(tmp_path)) as srv:
        profile = _ok(srv.get("/internal/trust/profile", params={"account_id": "qq:1"}))
        assert profile["entity_id"] == entity and profile["account_adjustment"] == pytest.approx(0.12)
        assert profile["channels_seen"] == ["onebot"] and profile["canonical_account"] is None
        assert _ok(srv.get("/internal/trust/profile", params={"account_id": "qq:ghost"}))["entity_id"] is None
        _ok(srv.post("/internal/identity/scope", json=SCOPE))
        pool = _pool(tmp_path)
        assert "qq:424242" not in json.dumps(pool) and pool["forgotten"]["ent_ffffffffffffffffffffffff"]["accounts"][0].startswith(
            "sha256:"
        )
        # The forgotten account stays forgotten.
        skipped = _ok(
            srv.post("/internal/trust/import_legacy_profiles", json={"platform": "qq", "source": LEGACY_SOURCE, "profiles": {"424242": {}}})
        )
        assert skipped["skipped"] == [{"key": "424242", "reason": "forgotten"}]


def test_an_unreadable_pool_is_left_alone_and_writes_say_not_persisted(tmp_path):
    (tmp_path / "speaker_trust.json").write_text("{ this is not json", encoding="utf-8")
    with LiveServer(make_settings(tmp_path)) as srv:
        answer = _ok(srv.post("/internal/identity/accounts/ensure", json={"account_id": "qq:1"}))
        assert answer["persisted"] is False and answer["entity_id"] is None
        assert _ok(srv.post("/internal/identity/scope", json=SCOPE))["persisted"] is False
    assert (tmp_path / "speaker_trust.json").read_text(encoding="utf-8") == "{ this is not json"


def test_facts_a_speaker_says_in_a_group_go_with_them_when_they_are_forgotten(tmp_path, fake_llm):
    fake_llm.on(
        "extract_facts", lambda req: {"facts": [{"text": "Member 9090 breeds axolotls at home", "importance": 7, "entity": "master"}]}
    )
    settings = make_settings(tmp_path, llm_base_url=fake_llm.base_url, llm_model="fake")
    member = {"subject_kind": "group_participant", "subject_id": "qq:31337:9090"}
    history = json.dumps([{"role": "user", "content": "I breed axolotls"}])
    with LiveServer(settings) as srv:
        entity = _ok(srv.post("/internal/identity/accounts/ensure", json={"account_id": "qq:9090"}))["entity_id"]
        written = srv.post(
            "/internal/memory/Lan/scoped_history",
            json={"subject": member, "input_history": history, "speaker_label": "Nine", "speaker_id": "qq:9090"},
        )
        assert written.status_code == 200 and written.json()["created"] == 1, written.text
        fact = srv.get("/api/characters/Lan/facts").json()["items"][0]
        assert fact["source_ref"] == {"neko": {"speaker_id": "qq:9090", "speaker_label": "Nine", "speaker_entity_id": entity}}
        bad = srv.post("/internal/memory/Lan/scoped_history", json={"subject": member, "input_history": history, "speaker_id": "not an id"})
        assert bad.status_code == 422 and bad.json()["error_code"] == "bad_speaker_id"
        assert _ok(srv.post("/internal/identity/entities/forget", json={"entity_id": entity}))["facts_erased"] == 1
        assert srv.get("/api/characters/Lan/facts").json()["items"] == []
    assert b"axolotl" not in _all_bytes(tmp_path)


def test_in_limited_mode_the_identity_routes_answer_409_never_no_trust(tmp_path):
    """None of them is on the reference's limited-mode allow-list: a caller must retry a
    409, never read it as "this person has no trust"."""
    with LiveServer(make_settings(tmp_path)) as srv:
        assert srv.post("/internal/storage/startup/block", json={"reason": "test"}).json()["limited_mode"] is True
        assert srv.get("/internal/trust/profile", params={"account_id": "qq:1"}).status_code == 409
        refused = srv.post("/internal/identity/scope", json=SCOPE)
        assert refused.status_code == 409 and refused.json()["error_code"] == "storage_startup_blocked"
        assert not (tmp_path / "speaker_trust.json").exists()
        srv.post("/internal/storage/startup/continue", json={})
        assert _ok(srv.post("/internal/identity/scope", json=SCOPE))["persisted"] is True
