"""Persona: protected card entries, promotion decisions, contradiction queue, decay/archive."""

from __future__ import annotations

import hashlib
from datetime import datetime, timedelta, timezone

import msgspec
import pytest

from nekomem.config.longterm import LongTermSettings
from nekomem.domain.evidence import net_score
from nekomem.domain.persona import (
    add_entry,
    apply_correction,
    apply_entry_signal,
    apply_promotion_decision,
    card_entries,
    enqueue_correction,
    find_entry,
    persona_archive_sweep,
    promotion_gate,
    promotion_pool,
    record_correction_failure,
    record_promotion_attempt,
    record_reply_mentions,
    reflection_after_correction,
    sync_card,
    time_driven_promotion,
)
from nekomem.domain.prompts.longterm import judge_promotion_messages, resolve_correction_messages
from nekomem.domain.records import Correction, PersonaEntry, Reflection, persona_from_disk, persona_to_disk, to_iso

S = LongTermSettings()
T0 = datetime(2024, 3, 1, 12, 0, tzinfo=timezone.utc)
words = lambda s: len(s.split())  # noqa: E731
NAMES = ["Mimi", "Boss"]  # stop names: removed before keyword overlap
CARD = {
    # "name" and "voice_id" are reserved (the reference's CHARACTER_RESERVED_FIELDS), a dict is skipped
    "neko": {"昵称": "Mimi", "likes": ["fish", "naps"], "voice_id": "v1", "name": "x", "style": {"a": 1}, "__ai_context.mood": "cheerful"},
    "master": {"nickname": "Boss"},
}


def card_persona():
    return sync_card({"master": [], "neko": [], "relationship": []}, CARD, S, T0)


def promotable_ref(rid="ref_p", text="Mimi enjoys sunny windowsills", entity="neko", **kw) -> Reflection:
    base = dict(
        id=rid,
        text=text,
        entity=entity,
        status="confirmed",
        created_at=to_iso(T0),
        reinforcement=2.5,
        rein_last_signal_at=to_iso(T0),
        confirmed_at=to_iso(T0),
    )
    base.update(kw)
    return Reflection(**base)


def test_card_entries_format_and_ids() -> None:
    entries = card_entries("neko", CARD["neko"], S)
    assert [e.text for e in entries] == ["昵称: Mimi", "likes: fish、naps", "cheerful"]
    assert entries[0].id == "card_" + hashlib.sha256("neko:昵称".encode()).hexdigest()[:8]
    assert all(e.protected and e.source == "character_card" for e in entries)


def test_sync_card_head_order_rewrite_and_removal() -> None:
    manual = PersonaEntry(id="manual_1", text="Mimi hates baths")
    persona = sync_card({"neko": [manual]}, CARD, S, T0)
    assert [e.id for e in persona["neko"]][-1] == "manual_1"
    cached = msgspec.structs.replace(persona["neko"][0], token_count=3, embedding=[0.1])
    persona["neko"][0] = cached
    new_card = {"neko": {"likes": ["fish"], "昵称": "Mimi II"}}
    synced = sync_card(persona, new_card, S, T0)
    assert [e.text for e in synced["neko"]] == ["likes: fish", "昵称: Mimi II", "Mimi hates baths"]
    renamed = synced["neko"][1]
    assert renamed.id == cached.id and renamed.token_count is None and renamed.embedding is None
    assert synced["master"] == persona["master"]  # entities not in the card are untouched


def test_persona_round_trips_through_disk_shape() -> None:
    persona = card_persona()
    raw = msgspec.json.decode(msgspec.json.encode(persona_to_disk(persona)))
    assert raw["neko"]["facts"][0]["protected"] is True
    assert persona_from_disk(raw) == persona


# --- protected entries survive ------------------------------------------------------------


def test_protected_entries_ignore_signals() -> None:
    persona = card_persona()
    cid = persona["neko"][0].id
    out, changed = apply_entry_signal(persona, cid, "negate", "user_rebut", T0, S)
    assert not changed and out["neko"][0] == persona["neko"][0]


def test_protected_entries_are_never_archived() -> None:
    persona = card_persona()
    persona["neko"].append(PersonaEntry(id="manual_bad", text="Mimi is a dog", disputation=3.0, disp_last_signal_at=to_iso(T0)))
    counted_days = []
    for day in range(20):
        sweep = persona_archive_sweep(persona, T0 + timedelta(days=day), S)
        persona = sweep.persona
        counted_days.append(sweep.counted)
        if sweep.archived:
            assert day == 13 and [e.id for _, e in sweep.archived] == ["manual_bad"]
            assert sweep.archived[0][1].archived_at == to_iso(T0 + timedelta(days=13))
    assert [e.text for e in persona["neko"]] == ["昵称: Mimi", "likes: fish、naps", "cheerful"]
    assert all(e.sub_zero_days == 0 for e in persona["neko"])


def test_contradicting_reflection_is_denied_by_the_card() -> None:
    persona = card_persona()
    ref = promotable_ref(text="Mimi likes fish and sleeping")  # overlaps "likes: fish、naps"
    out = apply_promotion_decision(ref, {"action": "promote"}, persona, [], T0, S, NAMES)
    assert out.kind == "denied" and out.reflection.status == "denied"
    assert out.reflection.denied_reason == "rejected_by_persona_card"
    assert out.persona == persona
    contra = apply_promotion_decision(ref, {"action": "contradiction", "target_id": persona["neko"][0].id}, persona, [], T0, S)
    assert contra.kind == "denied" and contra.corrections == []


def test_correction_never_rewrites_a_protected_entry() -> None:
    persona = card_persona()
    old = persona["neko"][0]
    item = Correction(old_text=old.text, new_text="name: Tama", entity="neko", created_at=to_iso(T0), old_entry_id=old.id)
    out = apply_correction(persona, [item], item, {"action": "replace", "text": None}, T0, S)
    assert out.kind == "kept_old" and out.persona["neko"][0] == old and out.corrections == []


# --- adding and promoting --------------------------------------------------------------------


def test_add_entry_new_duplicate_and_queued() -> None:
    persona = card_persona()
    ref = promotable_ref()
    added = add_entry(
        persona, [], "neko", ref.text, source="reflection", source_id=ref.id, now=T0, settings=S, evidence=ref, stop_names=NAMES
    )
    assert added.kind == "added" and added.entry_id == "prom_ref_p"
    entry = find_entry(added.persona, "prom_ref_p")[1]
    assert entry.reinforcement == pytest.approx(2.5) and not entry.protected
    dup = add_entry(added.persona, [], "neko", ref.text, source="reflection", source_id="ref_other", now=T0, settings=S, stop_names=NAMES)
    assert dup.kind == "duplicate"
    queued = add_entry(
        added.persona,
        [],
        "neko",
        "Mimi enjoys sunny balconies",
        source="reflection",
        source_id="ref_q",
        now=T0,
        settings=S,
        stop_names=NAMES,
    )
    assert queued.kind == "queued" and queued.entry_id == "prom_ref_p"
    item = queued.corrections[0]
    assert (item.old_text, item.new_text, item.old_entry_id, item.source_id) == (
        ref.text,
        "Mimi enjoys sunny balconies",
        "prom_ref_p",
        "ref_q",
    )
    assert queued.persona == added.persona
    again, was_added = enqueue_correction(queued.corrections, msgspec.structs.replace(item, created_at="later"))
    assert not was_added and len(again) == 1


def test_promotion_gate_backoff_and_block() -> None:
    ref = promotable_ref()
    assert promotion_gate(ref, T0, S) == "attempt"
    ref = record_promotion_attempt(ref, T0)
    assert promotion_gate(ref, T0 + timedelta(minutes=29), S) == "wait"
    assert promotion_gate(ref, T0 + timedelta(minutes=30), S) == "attempt"
    for i in range(4):
        ref = record_promotion_attempt(ref, T0 + timedelta(hours=i + 1))
    assert ref.promote_attempt_count == 5
    assert promotion_gate(ref, T0 + timedelta(hours=4, minutes=10), S) == "wait"
    assert promotion_gate(ref, T0 + timedelta(hours=5), S) == "block"


def test_promote_decision_creates_entry() -> None:
    out = apply_promotion_decision(promotable_ref(), {"action": "promote", "reason": "new"}, card_persona(), [], T0, S, NAMES)
    assert out.kind == "promoted" and out.reflection.status == "promoted" and out.entry_id == "prom_ref_p"
    assert out.persona["neko"][-1].source == "reflection"


def test_merge_decision_rewrites_target_and_takes_max_evidence() -> None:
    persona = card_persona()
    target = PersonaEntry(
        id="manual_t",
        text="Mimi likes windows",
        reinforcement=1.0,
        rein_last_signal_at=to_iso(T0),
        disputation=0.5,
        disp_last_signal_at=to_iso(T0),
        sub_zero_days=3,
    )
    persona["neko"].append(target)
    ref = promotable_ref()
    out = apply_promotion_decision(
        ref, {"action": "merge", "target_id": "manual_t", "text": "Mimi loves sunny windows"}, persona, [], T0, S
    )
    assert out.kind == "merged" and out.reflection.status == "merged" and out.reflection.absorbed_into == "manual_t"
    merged = find_entry(out.persona, "manual_t")[1]
    assert merged.text == "Mimi loves sunny windows" and merged.merged_from_ids == ["ref_p"]
    assert (merged.reinforcement, merged.disputation, merged.sub_zero_days) == (2.5, 0.5, 0)
    assert merged.version_history[-1].text == "Mimi likes windows"
    # merging the same reflection again changes nothing
    twice = apply_promotion_decision(ref, {"action": "merge", "target_id": "manual_t", "text": "other"}, out.persona, [], T0, S)
    assert find_entry(twice.persona, "manual_t")[1] == merged


def test_invalid_and_stale_decisions_change_nothing() -> None:
    persona = card_persona()
    ref = promotable_ref()
    card_id = persona["neko"][0].id
    for output in (
        {"action": "merge", "target_id": card_id, "text": "x"},
        {"action": "merge", "target_id": "nope", "text": "x"},
        {"action": "merge", "target_id": card_id, "text": None},
        {"action": "contradiction", "target_id": None},
        {"action": "dance"},
    ):
        out = apply_promotion_decision(ref, output, persona, [], T0, S)
        assert out.kind == "invalid" and out.reflection == ref and out.persona == persona
    weak = promotable_ref(reinforcement=1.5)
    assert apply_promotion_decision(weak, {"action": "promote"}, persona, [], T0, S).kind == "stale"
    assert apply_promotion_decision(promotable_ref(status="denied"), {"action": "promote"}, persona, [], T0, S).kind == "stale"


def test_reject_and_contradiction_decisions() -> None:
    persona = card_persona()
    persona["neko"].append(PersonaEntry(id="manual_t", text="Mimi sleeps all day"))
    rejected = apply_promotion_decision(promotable_ref(), {"action": "reject", "reason": "trivial"}, persona, [], T0, S)
    assert rejected.reflection.status == "denied"
    assert (rejected.reflection.denied_reason, rejected.reflection.reject_reason) == ("llm_merge_rejected", "trivial")
    contra = apply_promotion_decision(promotable_ref(), {"action": "contradiction", "target_id": "manual_t"}, persona, [], T0, S)
    assert contra.kind == "queued" and contra.reflection.status == "confirmed"
    assert contra.corrections[0].old_entry_id == "manual_t" and contra.corrections[0].source_id == "ref_p"


def test_time_driven_promotion_without_llm() -> None:
    persona = card_persona()
    ref = promotable_ref(reinforcement=0.0)  # the time path ignores the score
    out = time_driven_promotion(ref, persona, [], T0, S, NAMES)
    assert out.kind == "promoted" and out.persona["neko"][-1].source == "reflection_time_driven"
    card_clash = time_driven_promotion(promotable_ref(text="Mimi likes fish"), persona, [], T0, S, NAMES)
    assert card_clash.reflection.denied_reason == "rejected_by_persona_card_time_driven"


def test_promotion_pool_budget_and_prompt() -> None:
    persona = card_persona()
    persona["neko"] += [PersonaEntry(id=f"manual_{i}", text="w " * 1500, reinforcement=float(i)) for i in range(3)]
    others = [promotable_ref("ref_o", text="Mimi purrs"), promotable_ref("ref_m", entity="master", text="Boss codes")]
    pool = promotion_pool(promotable_ref(), persona, others, T0, S, words)
    assert [o.id for o in pool] == ["manual_2", "manual_1"]  # 1500 + 1500 <= 4000, a third would not fit
    pool = promotion_pool(promotable_ref(), {"neko": []}, others, T0, S, words)
    assert [o.id for o in pool] == ["ref_o"]
    body = judge_promotion_messages(promotable_ref(), 2.5, pool, master_name="Boss", ai_name="Mimi")[1]["content"]
    assert "[ref_p]" in body and "[ref_o] (reflection)" in body and "evidence_score=2.50" in body


# --- contradiction queue -----------------------------------------------------------------------


def _queued():
    persona = {"neko": [PersonaEntry(id="manual_t", text="Mimi sleeps all day", reinforcement=1.0, recent_mentions=["x"])]}
    item = Correction(
        old_text="Mimi sleeps all day",
        new_text="Mimi sleeps only at noon",
        entity="neko",
        created_at=to_iso(T0),
        old_entry_id="manual_t",
        source_id="ref_p",
    )
    return persona, [item], item


def test_correction_merge_keeps_id_and_evidence() -> None:
    persona, queue, item = _queued()
    out = apply_correction(persona, queue, item, {"action": "merge", "text": "Mimi naps a lot, mostly at noon"}, T0, S)
    entry = out.persona["neko"][0]
    assert out.kind == "merged" and entry.id == "manual_t" and entry.reinforcement == 1.0 and entry.recent_mentions == ["x"]
    assert entry.text == "Mimi naps a lot, mostly at noon" and entry.version_history[0].text == "Mimi sleeps all day"
    assert out.corrections == [] and out.source_id == "ref_p"


def test_correction_replace_and_keep_old() -> None:
    persona, queue, item = _queued()
    out = apply_correction(persona, queue, item, {"action": "replace", "text": None}, T0, S)
    assert out.kind == "replaced" and out.entry_id.startswith("corr_20240301120000_")
    assert [e.text for e in out.persona["neko"]] == ["Mimi sleeps only at noon"]
    kept = apply_correction(persona, queue, item, {"action": "keep_old", "text": None}, T0, S)
    assert kept.kind == "kept_old" and kept.persona == persona and kept.corrections == []
    bad = apply_correction(persona, queue, item, {"action": "merge", "text": None}, T0, S)
    assert bad.kind == "invalid" and bad.corrections == queue


def test_version_history_is_capped() -> None:
    persona, _, _ = _queued()
    small = LongTermSettings(persona_version_history_max=2)
    for i in range(4):
        text = persona["neko"][0].text
        item = Correction(old_text=text, new_text="n", entity="neko", created_at=f"t{i}", old_entry_id="manual_t")
        persona = apply_correction(persona, [item], item, {"action": "merge", "text": f"v{i}"}, T0, small).persona
    assert [v.text for v in persona["neko"][0].version_history] == ["v1", "v2"]


def test_correction_failures_drop_at_five() -> None:
    _, queue, item = _queued()
    for _ in range(4):
        queue, dropped = record_correction_failure(queue, item, S)
        assert not dropped
    queue, dropped = record_correction_failure(queue, item, S)
    assert dropped and queue == []


def test_resolve_correction_prompt() -> None:
    _, _, item = _queued()
    body = resolve_correction_messages(item, master_name="Boss", ai_name="Mimi")[1]["content"]
    assert "Mimi sleeps all day" in body and "Mimi sleeps only at noon" in body


# --- evidence and mentions on entries -------------------------------------------------------------


def test_signals_and_mentions_on_non_protected_entries() -> None:
    persona = card_persona()
    persona["neko"].append(PersonaEntry(id="manual_t", text="Mimi enjoys tuna"))
    out, changed = apply_entry_signal(persona, "manual_t", "reinforce", "user_fact", T0, S)
    assert changed and net_score(find_entry(out, "manual_t")[1], T0, S) == 0.5
    for h in range(3):
        out, ids = record_reply_mentions(out, "Some tuna, Mimi?", T0 + timedelta(hours=h), S, ["Mimi"])
        assert ids == ["manual_t"]  # the card entries never count mentions
    assert find_entry(out, "manual_t")[1].suppress


def test_v1_persona_file_is_migrated() -> None:
    raw = {
        "user": {"dynamics": [{"id": "legacy_1", "text": "likes tea"}]},
        "ai": {"facts": [{"id": "x", "text": "cat"}]},
        "__meta__": {"facts": [{"id": "__evidence_migration_v1__", "text": "", "protected": True}]},
        "relationship": {"facts": [{"no_id": True}]},
    }
    persona = persona_from_disk(raw)
    assert list(persona) == ["master", "neko", "relationship"]
    assert persona["master"][0].text == "likes tea" and persona["relationship"] == []


def test_reflection_after_correction() -> None:
    ref = promotable_ref()
    assert reflection_after_correction(ref, "replaced", T0).status == "promoted"
    assert reflection_after_correction(ref, "merged", T0).status == "promoted"
    kept = reflection_after_correction(ref, "kept_old", T0)
    assert kept.status == "denied" and kept.denied_reason == "correction_kept_old"
    assert reflection_after_correction(ref, "invalid", T0) is ref
    assert reflection_after_correction(kept, "merged", T0) is kept
