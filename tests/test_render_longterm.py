"""Rendering of the long-term /new_dialog sections: order, budgets, past block, suppression."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from nekomem.config.longterm import LongTermSettings
from nekomem.domain.records import PersonaEntry, Reflection, to_iso
from nekomem.domain.render_longterm import (
    relative_label,
    render_longterm,
    select_persona,
    select_reflections,
    suppressed_entries,
)

T0 = datetime(2024, 3, 1, 12, 0, tzinfo=timezone.utc)
words = lambda s: len(s.split())  # noqa: E731  a line "- a b c" costs 4


def entry(eid: str, text: str, rein: float = 0.0, **kw) -> PersonaEntry:
    return PersonaEntry(id=eid, text=text, reinforcement=rein, **kw)


def ref(rid: str, text: str, status: str = "confirmed", rein: float = 1.0, **kw) -> Reflection:
    return Reflection(id=rid, text=text, status=status, reinforcement=rein, created_at=to_iso(T0), **kw)


def mentioned(n: int) -> dict:
    stamps = [to_iso(T0 - timedelta(hours=1, minutes=i)) for i in range(n)]
    suppressed = n > 2
    return {"recent_mentions": stamps, "suppress": suppressed, "suppressed_at": stamps[-1] if suppressed else None}


def test_relative_labels() -> None:
    assert relative_label(T0 - timedelta(hours=5), T0) == "today"
    assert relative_label(T0 - timedelta(days=1), T0) == "1 day ago"
    assert relative_label(T0 - timedelta(days=6), T0) == "6 days ago"
    assert relative_label(T0 - timedelta(days=7), T0) == "1 week ago"
    assert relative_label(T0 - timedelta(days=29), T0) == "4 weeks ago"
    assert relative_label(T0 - timedelta(days=30), T0) == "1 month ago"
    assert relative_label(T0 - timedelta(days=95), T0) == "3 months ago"


def test_persona_budget_protected_first_and_skip_on_overflow() -> None:
    settings = LongTermSettings(persona_render_max_tokens=10)
    persona = {
        "master": [
            entry("m_low", "one two three", rein=0.5),  # 4 tokens
            entry("card_m", "nickname: Boss", protected=True),
        ],
        "neko": [
            entry("n_big", "a b c d e f g", rein=3.0),  # 8 tokens
            entry("n_mid", "x y z w", rein=2.0),  # 5 tokens: does not fit after n_big, skipped
            entry("n_neg", "bad", disputation=1.0),  # negative score: never shown
            entry("n_tiny", "ok", rein=1.0),  # 2 tokens: fits (8 + 2 = 10)
        ],
    }
    chosen = select_persona(persona, T0, settings, words)
    assert [e.id for e in chosen["master"]] == ["card_m"]
    assert [e.id for e in chosen["neko"]] == ["n_big", "n_tiny"]
    zero = select_persona(persona, T0, LongTermSettings(persona_render_max_tokens=0), words)
    assert [e.id for e in zero["master"]] == ["card_m"] and zero["neko"] == []


def test_protected_cap() -> None:
    persona = {"neko": [entry(f"card_{i}", f"f{i}: v", protected=True) for i in range(5)]}
    chosen = select_persona(persona, T0, LongTermSettings(persona_render_protected_max_entries=3), words)
    assert [e.id for e in chosen["neko"]] == ["card_0", "card_1", "card_2"]


def test_reflection_budget_is_shared_and_skips_on_overflow() -> None:
    settings = LongTermSettings(reflection_render_max_tokens=12)
    refs = [
        ref("r_conf", "c1 c2 c3", rein=3.0),  # 4
        ref("r_pend", "p1 p2 p3 p4 p5 p6 p7", status="pending", rein=2.0),  # 8: 4 + 8 = 12 fits exactly
        ref("r_pend2", "p1 p2", status="pending", rein=0.5),  # 3: no room left
        ref("r_zero", "z", rein=0.0),  # confirmed with score 0: not shown
        ref("r_denied", "d", status="denied"),
        ref(
            "r_past", "went to Kyoto", rein=1.5, temporal_scope="episode", event_start_at=to_iso(T0 - timedelta(days=14))
        ),  # "- (2 weeks ago) went to Kyoto" = 6: no room left
    ]
    sel = select_reflections(refs, T0, settings, words)
    assert [r.id for r in sel.confirmed] == ["r_conf"]
    assert [r.id for r in sel.pending] == ["r_pend"]
    assert sel.past == []
    # with 11 tokens r_pend no longer fits, so the next ones by score are tried: r_past (4 + 6 = 10)
    sel = select_reflections(refs, T0, LongTermSettings(reflection_render_max_tokens=11), words)
    assert [r.id for r in sel.pending] == [] and [r.id for r in sel.past] == ["r_past"]
    roomy = select_reflections(refs, T0, LongTermSettings(), words)
    assert [r.id for r in roomy.pending] == ["r_pend", "r_pend2"]
    assert [r.id for r in roomy.past] == ["r_past"]


def test_reflection_budget_exact_fill() -> None:
    refs = [ref("a", "x y z", rein=3.0), ref("b", "x y z w v", rein=2.0), ref("c", "x", rein=1.5)]
    sel = select_reflections(refs, T0, LongTermSettings(reflection_render_max_tokens=6), words)
    assert [r.id for r in sel.confirmed] == ["a", "c"]  # 4 + 2 = 6; b (6) skipped


def test_full_render_order_and_headings() -> None:
    persona = {
        "master": [entry("card_m", "nickname: Boss", protected=True), entry("m1", "Boss drinks tea", rein=1.0)],
        "neko": [entry("n1", "Mimi loves naps", rein=1.0, **mentioned(3))],
        "relationship": [],
    }
    refs = [
        ref("r_p", "Boss may be busy at work", status="pending", rein=0.2),
        ref("r_c", "Boss prefers mornings"),
        ref("r_old", "Boss had a cold", temporal_scope="state", event_start_at=to_iso(T0 - timedelta(days=10))),
        ref("r_sup", "Boss collects stamps", **mentioned(3)),
        ref("r_dup", "Mimi loves naps", status="pending"),  # same text as a suppressed persona entry
    ]
    text = render_longterm(persona, refs, now=T0, settings=LongTermSettings(), count_tokens=words, master_name="Boss", ai_name="Mimi")
    expected_order = [
        "## About Boss",
        "- nickname: Boss",
        "- Boss drinks tea",
        "### Mimi's recent impressions (not certain yet)",
        "- Boss may be busy at work",
        "### Mimi's fairly certain impressions",
        "- Boss prefers mornings",
        "====== Older memories below ======",
        "- (1 week ago) Boss had a cold",
        "====== End of older memories ======",
        "### Do not bring these up on your own",
        "- Mimi loves naps",
        "- Boss collects stamps",
    ]
    positions = [text.index(part) for part in expected_order]
    assert positions == sorted(positions)
    assert "## About Mimi" not in text  # its only entry is suppressed
    assert text.count("Mimi loves naps") == 1
    assert "relationship" not in text


def test_do_not_bring_up_list_needs_more_than_two_recent_mentions() -> None:
    persona = {
        "neko": [
            entry("a", "two mentions", **mentioned(2)),
            entry("b", "three mentions", **mentioned(3)),
            entry("c", "card", protected=True, **mentioned(3)),
        ]
    }
    assert suppressed_entries(persona, [], T0, LongTermSettings()) == ["three mentions"]
    # five hours after the suppression started it is lifted
    later = T0 + timedelta(hours=5)
    assert suppressed_entries(persona, [], later, LongTermSettings()) == []
    cap = {"neko": [entry(f"e{i}", f"text {i}", **mentioned(3)) for i in range(5)]}
    assert len(suppressed_entries(cap, [], T0, LongTermSettings(persona_render_suppressed_max_entries=2))) == 2


def test_empty_render() -> None:
    assert render_longterm({}, [], now=T0, settings=LongTermSettings(), count_tokens=words, master_name="A", ai_name="B") == ""
