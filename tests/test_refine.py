"""Pure refinement logic: clustering from hand-made vectors, cluster hashes and revisits,
validation of refine_cluster answers, and their application to reflections and persona."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import numpy as np
import pytest

from nekomem.config.longterm import LongTermSettings
from nekomem.domain import refine as rf
from nekomem.domain import vector_codec
from nekomem.domain.evidence import net_score
from nekomem.domain.records import PersonaEntry, Reflection, text_sha256, to_iso

NOW = datetime(2026, 4, 1, 12, 0, tzinfo=timezone.utc)
S = LongTermSettings()


def unit(*xs: float) -> np.ndarray:
    v = np.asarray(xs, dtype=np.float32)
    return v / np.linalg.norm(v)


def near(base: np.ndarray, k: int, eps: float = 0.05) -> np.ndarray:
    """A vector close to ``base`` (cosine well above 0.82)."""
    v = base.copy()
    v[(k % (len(v) - 1)) + 1] += eps * (k + 1)
    return v / np.linalg.norm(v)


def ref(rid: str, text: str, **kw) -> Reflection:
    kw.setdefault("created_at", to_iso(NOW - timedelta(days=2)))
    return Reflection(id=rid, text=text, entity=kw.pop("entity", "master"), **kw)


def entry(eid: str, text: str, **kw) -> PersonaEntry:
    return PersonaEntry(id=eid, text=text, **kw)


# --- clustering -----------------------------------------------------------------------


def test_clusters_group_near_duplicates_and_leave_strangers_out():
    a = unit(1, 0, 0, 0)
    b = unit(0, 1, 0, 0)
    vecs = [a, near(a, 0), near(a, 1), b, near(b, 2), unit(0, 0, 1, 0)]
    ids = ["a1", "a2", "a3", "b1", "b2", "lone"]
    sim = rf.cosine_matrix(vecs)
    clusters = rf.build_clusters(ids, sim, threshold=0.82, topk=5, size_max=6, limit=3)
    assert sorted(sorted(c) for c in clusters) == [["a1", "a2", "a3"], ["b1", "b2"]]
    assert all("lone" not in c for c in clusters)


def test_threshold_is_inclusive_and_strict_below():
    sim = np.array([[1.0, 0.82], [0.82, 1.0]])
    assert rf.build_clusters(["x", "y"], sim, threshold=0.82, topk=5, size_max=6, limit=3) == [["x", "y"]]
    sim = np.array([[1.0, 0.8199], [0.8199, 1.0]])
    assert rf.build_clusters(["x", "y"], sim, threshold=0.82, topk=5, size_max=6, limit=3) == []


def test_size_cap_topk_and_limit():
    n = 10
    sim = np.full((n, n), 0.9)
    np.fill_diagonal(sim, 1.0)
    ids = [f"e{i}" for i in range(n)]
    clusters = rf.build_clusters(ids, sim, threshold=0.82, topk=5, size_max=4, limit=3)
    # e8 and e9 are not among each other's 5 nearest (ties go to lower indexes): left out.
    assert clusters == [["e0", "e1", "e2", "e3"], ["e4", "e5", "e6", "e7"]]
    assert len(rf.build_clusters(ids, sim, threshold=0.82, topk=5, size_max=6, limit=1)) == 1
    # One neighbour per entry: every entry names e0, which gathers them up to the size cap;
    # the rest have no unassigned neighbour left.
    small = rf.build_clusters(ids, sim, threshold=0.82, topk=1, size_max=6, limit=10)
    assert small == [["e0", "e1", "e2", "e3", "e4", "e5"]]


def test_seed_is_the_strongest_pair_and_members_by_similarity():
    sim = np.array(
        [
            [1.0, 0.85, 0.83, 0.10],
            [0.85, 1.0, 0.84, 0.10],
            [0.83, 0.84, 1.0, 0.97],
            [0.10, 0.10, 0.97, 1.0],
        ]
    )
    clusters = rf.build_clusters(["p", "q", "r", "s"], sim, threshold=0.82, topk=5, size_max=6, limit=3)
    assert clusters[0][:2] == ["r", "s"]  # strongest edge seeds first
    assert clusters[0] == ["r", "s", "q", "p"]


def test_skipped_cluster_keeps_its_members_and_does_not_count():
    sim = np.eye(4)
    sim[0, 1] = sim[1, 0] = 0.95
    sim[1, 2] = sim[2, 1] = 0.85
    ids = ["a", "b", "c", "d"]
    skipped = []

    def skip(cluster):
        if set(cluster) == {"a", "b"}:
            skipped.append(cluster)
            return True
        return False

    # "c" has only "b" as neighbour, and "b" belongs to the skipped cluster: nothing to do.
    assert rf.build_clusters(ids, sim, threshold=0.82, topk=5, size_max=6, limit=1, skip=skip) == []
    assert skipped == [["a", "b"]]
    sim[2, 3] = sim[3, 2] = 0.9
    # A skipped cluster does not use up the limit.
    assert rf.build_clusters(ids, sim, threshold=0.82, topk=5, size_max=6, limit=1, skip=skip) == [["c", "d"]]


def test_matrix_shape_is_checked():
    with pytest.raises(ValueError):
        rf.build_clusters(["a", "b"], np.eye(3), threshold=0.5, topk=2, size_max=3, limit=1)


def test_cluster_hash_ignores_order_and_changes_with_members():
    assert rf.cluster_hash(["b", "a"]) == rf.cluster_hash(["a", "b"])
    assert rf.cluster_hash(["a", "b"]) != rf.cluster_hash(["a", "b", "c"])
    assert len(rf.cluster_hash(["a"])) == 16


def test_cached_vector_requires_model_and_text_match():
    v = unit(3, 4, 0, 0)
    enc = vector_codec.encode(v)
    r = ref("ref_1", "tea", embedding=enc, embedding_model_id="m", embedding_text_sha256=text_sha256("tea"))
    got = rf.cached_vector(r, "m", 4)
    assert got is not None and float(got @ v) > 0.999
    assert rf.cached_vector(r, "other", 4) is None
    assert rf.cached_vector(r, "m", 8) is None
    stale = ref("ref_1", "coffee", embedding=enc, embedding_model_id="m", embedding_text_sha256=text_sha256("tea"))
    assert rf.cached_vector(stale, "m", 4) is None
    assert (
        rf.cached_vector(ref("ref_2", "x", embedding="%%%", embedding_model_id="m", embedding_text_sha256=text_sha256("x")), "m", 4) is None
    )


def test_plan_skips_recent_clusters_until_revisit_and_counts_across_groups():
    a = unit(1, 0, 0, 0)
    vecs = {"r1": a, "r2": near(a, 0), "r3": unit(0, 1, 0, 0), "r4": near(unit(0, 1, 0, 0), 1), "r5": unit(0, 0, 1, 0)}
    chash = rf.cluster_hash(["r1", "r2"])
    fresh = {"last_refine_cluster_hash": chash, "last_refine_at": to_iso(NOW - timedelta(days=29))}
    g1 = [ref("r1", "a", **fresh), ref("r2", "b", **fresh)]
    g2 = [ref("r3", "c"), ref("r4", "d"), ref("r5", "e")]
    plan = rf.plan_clusters([g1, g2], lambda r: vecs[r.id], NOW, S)
    assert plan == [["r3", "r4"]] or plan == [["r4", "r3"]]
    old = {"last_refine_cluster_hash": chash, "last_refine_at": to_iso(NOW - timedelta(days=31))}
    g1 = [ref("r1", "a", **old), ref("r2", "b", **old)]
    plan = rf.plan_clusters([g1, g2], lambda r: vecs[r.id], NOW, S)
    assert len(plan) == 2
    one = LongTermSettings(longterm_refine_clusters_per_pass=1)
    assert len(rf.plan_clusters([g1, g2], lambda r: vecs[r.id], NOW, one)) == 1
    # Entries without vectors are left out.
    assert rf.plan_clusters([g2], lambda r: None, NOW, S) == []


def test_failed_members_are_excluded_until_self_heal():
    a = unit(1, 0, 0, 0)
    vecs = {"r1": a, "r2": near(a, 0)}
    dead = {"refine_attempts": S.longterm_refine_max_attempts, "last_refine_at": to_iso(NOW - timedelta(hours=1))}
    group = [ref("r1", "a", **dead), ref("r2", "b")]
    assert rf.plan_clusters([group], lambda r: vecs[r.id], NOW, S) == []
    healed = {"refine_attempts": S.longterm_refine_max_attempts, "last_refine_at": to_iso(NOW - timedelta(hours=6))}
    group = [ref("r1", "a", **healed), ref("r2", "b")]
    assert len(rf.plan_clusters([group], lambda r: vecs[r.id], NOW, S)) == 1
    failed = rf.record_failure([ref("r1", "a")], NOW)[0]
    assert failed.refine_attempts == 1 and failed.last_refine_at == to_iso(NOW)


# --- validation of the answer ---------------------------------------------------------


def test_parse_actions_drops_invalid_parts():
    ids = ["a", "b", "c", "d"]
    out = {
        "actions": [
            {"op": "merge", "ids": ["a", "zzz", "b"], "texts": ["  ", "a and b"]},  # unknown id dropped, empty text skipped
            {"op": "modify", "ids": ["a"], "texts": ["again"]},  # a already used
            {"op": "modify", "ids": ["c"], "texts": []},  # no text
            {"op": "split", "ids": ["d"], "texts": ["only one"]},  # becomes a modify
            {"op": "explode", "ids": ["c"], "texts": []},
            {"op": "keep", "ids": "c"},
            "garbage",
            {"op": "discard", "ids": ["card_1"], "texts": []},  # outside the cluster
        ]
    }
    ops = rf.parse_actions(out, ids)
    assert ops == [rf.RefineOp("merge", ("a", "b"), ("a and b",)), rf.RefineOp("modify", ("d",), ("only one",))]
    assert rf.parse_actions(None, ids) == []
    assert rf.parse_actions({"actions": "x"}, ids) == []
    assert rf.parse_actions({"actions": [{"op": "merge", "ids": ["a"], "texts": ["t"]}]}, ids) == []


def test_discarding_every_member_is_refused():
    out = {"actions": [{"op": "discard", "ids": ["a"], "texts": []}, {"op": "discard", "ids": ["b"], "texts": []}]}
    assert rf.parse_actions(out, ["a", "b"]) == []
    out = {"actions": [{"op": "discard", "ids": ["a"], "texts": []}, {"op": "keep", "ids": ["b"], "texts": []}]}
    assert [o.op for o in rf.parse_actions(out, ["a", "b"])] == ["discard", "keep"]


def test_parse_accepts_validated_structs():
    from nekomem.models.tasks import RefineAction, RefineClusterOutput

    out = RefineClusterOutput(actions=[RefineAction(op="split", ids=["a"], texts=["x", "y", "x"])])
    assert rf.parse_actions(out, ["a", "b"]) == [rf.RefineOp("split", ("a",), ("x", "y"))]


# --- reflections ----------------------------------------------------------------------


def members():
    return [
        ref(
            "r1",
            "Master likes tea",
            status="pending",
            source_fact_ids=["f1", "f2"],
            reinforcement=0.4,
            rein_last_signal_at=to_iso(NOW),
            embedding="vec",
            embedding_model_id="m",
            embedding_text_sha256="s",
        ),
        ref(
            "r2",
            "Master enjoys tea",
            status="confirmed",
            source_fact_ids=["f2", "f3"],
            reinforcement=1.2,
            rein_last_signal_at=to_iso(NOW),
            confirmed_at=to_iso(NOW - timedelta(days=1)),
        ),
        ref(
            "r3",
            "Master drinks tea and jogs",
            status="pending",
            source_fact_ids=["f4"],
            reinforcement=0.6,
            disputation=0.1,
            rein_last_signal_at=to_iso(NOW),
            disp_last_signal_at=to_iso(NOW),
        ),
        ref("r4", "Master's tea is green", status="pending", source_fact_ids=["f5"]),
    ]


def test_merge_keeps_sources_status_and_strongest_evidence():
    ms = members()
    ops = [rf.RefineOp("merge", ("r1", "r2"), ("Master loves tea",))]
    result = rf.refine_reflections(ms, ops, NOW, S)
    by = {r.id: r for r in result.records}
    survivor, other = by["r2"], by["r1"]
    assert survivor.text == "Master loves tea" and survivor.status == "confirmed"
    assert survivor.source_fact_ids == ["f1", "f2", "f3"]
    assert survivor.reinforcement == pytest.approx(1.2)
    assert survivor.modification_history[-1]["reason"] == "refine_merge"
    assert survivor.modification_history[-1]["old_text"] == "Master enjoys tea"
    assert survivor.modification_history[-1]["merged_from_ids"] == ["r1"]
    assert survivor.modification_history[-1]["absorbed_fact_ids"] == ["f1"]
    assert survivor.embedding is None
    assert other.status == "merged" and other.absorbed_into == "r2" and other.merged_at == to_iso(NOW)
    assert other.source_fact_ids == ["f1", "f2"]
    chash = rf.cluster_hash([m.id for m in ms])
    assert all(r.last_refine_cluster_hash == chash and r.last_refine_at == to_iso(NOW) for r in result.records)
    assert by["r3"] == rf._stamp(ms[2], chash, NOW)  # not named: kept
    assert result.outcome.counts["merge"] == 1


def test_merge_takes_highest_status_when_the_stronger_is_pending():
    a = ref("a", "x", status="pending", reinforcement=1.9, rein_last_signal_at=to_iso(NOW))
    b = ref("b", "y", status="confirmed", reinforcement=0.1, rein_last_signal_at=to_iso(NOW), confirmed_at="2026-03-01T00:00:00+00:00")
    # Status outranks score when choosing the survivor; the evidence is the max of both.
    out = rf.refine_reflections([a, b], [rf.RefineOp("merge", ("a", "b"), ("xy",))], NOW, S)
    by = {r.id: r for r in out.records}
    assert by["b"].status == "confirmed" and by["b"].reinforcement == pytest.approx(1.9)
    assert by["a"].status == "merged"
    # Between equals, the higher score wins.
    c = ref("c", "z", status="pending", reinforcement=0.2, rein_last_signal_at=to_iso(NOW))
    out = rf.refine_reflections([a, c], [rf.RefineOp("merge", ("c", "a"), ("xz",))], NOW, S)
    assert {r.id: r.status for r in out.records} == {"a": "pending", "c": "merged"}


def test_modify_split_discard():
    ms = members()
    ops = [
        rf.RefineOp("modify", ("r1",), ("Master likes green tea",)),
        rf.RefineOp("split", ("r3",), ("Master drinks tea", "Master jogs")),
        rf.RefineOp("discard", ("r4",)),
    ]
    result = rf.refine_reflections(ms, ops, NOW, S, taken_ids=["r1", "r2", "r3", "r4"])
    by = {r.id: r for r in result.records}
    assert by["r1"].text == "Master likes green tea" and by["r1"].embedding is None and by["r1"].embedding_model_id is None
    assert by["r1"].modification_history == [
        {"old_text": "Master likes tea", "modified_at": to_iso(NOW), "reason": "refine_modify", "absorbed_fact_ids": []}
    ]
    assert by["r4"].status == "denied" and by["r4"].denied_reason == "refine_discard" and by["r4"].denied_at == to_iso(NOW)
    new = [by[i] for i in result.outcome.created]
    assert [r.text for r in new] == ["Master drinks tea", "Master jogs"]
    assert len({r.id for r in new}) == 2 and all(r.id.startswith("ref_") and len(r.id) == 20 for r in new)
    for part in new:
        assert part.source_fact_ids == ["f4"] and part.status == "pending" and part.entity == "master"
        assert part.reinforcement == ms[2].reinforcement and part.disputation == ms[2].disputation
        assert part.created_at == ms[2].created_at
        assert part.modification_history[0]["split_from"] == "r3"
    assert by["r3"].status == "merged" and by["r3"].absorbed_into == new[0].id
    assert by["r3"].modification_history[-1]["split_into"] == [r.id for r in new]
    assert result.outcome.counts == {"keep": 0, "modify": 1, "merge": 0, "split": 1, "discard": 1}


def test_modify_to_same_text_changes_nothing_but_stamps():
    ms = members()
    result = rf.refine_reflections(ms, [rf.RefineOp("modify", ("r1",), ("Master likes tea",))], NOW, S)
    r1 = result.records[0]
    assert r1.text == "Master likes tea" and r1.embedding == "vec" and r1.modification_history == []


def test_terminal_members_are_not_changed():
    gone = ref("r9", "old", status="denied")
    live = ref("r8", "new")
    result = rf.refine_reflections([gone, live], [rf.RefineOp("merge", ("r9", "r8"), ("both",))], NOW, S)
    by = {r.id: r for r in result.records}
    assert by["r9"].status == "denied" and by["r9"].text == "old" and by["r8"].text == "new"


def test_new_reflection_ids_avoid_collisions():
    first = rf.new_reflection_id("t", NOW, [])
    assert rf.new_reflection_id("t", NOW, [first]) != first


# --- persona --------------------------------------------------------------------------


def persona():
    return {
        "master": [
            entry("card_1", "Master: likes tea", source="character_card", protected=True),
            entry("p1", "Master likes tea", source="reflection", source_id="ref_a", reinforcement=0.5, rein_last_signal_at=to_iso(NOW)),
            entry(
                "p2",
                "Master enjoys tea",
                source="reflection",
                source_id="ref_b",
                reinforcement=1.5,
                rein_last_signal_at=to_iso(NOW),
                merged_from_ids=["ref_c"],
            ),
            entry("p3", "Master jogs and paints", reinforcement=0.3, rein_last_signal_at=to_iso(NOW), token_count=7),
            entry("p4", "Master is tall"),
        ],
        "neko": [entry("n1", "Lan likes fish")],
    }


def test_persona_merge_modify_split_discard_and_protection():
    before = persona()
    ids = ["p1", "p2", "p3", "p4"]
    out = {
        "actions": [
            {"op": "merge", "ids": ["p1", "p2"], "texts": ["Master loves tea"]},
            {"op": "split", "ids": ["p3"], "texts": ["Master jogs", "Master paints"]},
            {"op": "discard", "ids": ["p4", "card_1"], "texts": []},
            {"op": "modify", "ids": ["card_1"], "texts": ["hacked"]},
            {"op": "modify", "ids": ["n1"], "texts": ["hacked"]},
        ]
    }
    ops = rf.parse_actions(out, ids)
    result = rf.refine_persona(before, "master", ids, ops, NOW, S)
    master = result.persona["master"]
    assert master[0] == before["master"][0]  # protected, untouched, still first
    assert result.persona["neko"] == before["neko"]
    texts = [e.text for e in master]
    assert texts == ["Master: likes tea", "Master loves tea", "Master jogs", "Master paints"]
    survivor = master[1]
    assert survivor.id == "p2" and survivor.reinforcement == pytest.approx(1.5)
    assert survivor.merged_from_ids == ["ref_c", "ref_a", "p1"]
    assert survivor.version_history[-1].text == "Master enjoys tea" and survivor.version_history[-1].reason == "refine_merge"
    for part in master[2:]:
        assert part.reinforcement == pytest.approx(0.3) and part.merged_from_ids == ["p3"]
        assert part.version_history[-1].text == "Master jogs and paints" and part.token_count is None
        assert part.id.startswith("manual_") and not part.protected
    assert master[2].id != master[3].id
    chash = rf.cluster_hash(ids)
    assert all(e.last_refine_cluster_hash == chash for e in master[1:])
    assert master[0].last_refine_cluster_hash is None
    assert result.outcome.counts["discard"] == 1 and len(result.outcome.created) == 2
    # The input is not modified.
    assert [e.id for e in before["master"]] == ["card_1", "p1", "p2", "p3", "p4"]


def test_persona_protected_ids_in_cluster_list_are_still_untouchable():
    before = persona()
    ops = [rf.RefineOp("modify", ("card_1",), ("hacked",)), rf.RefineOp("keep", ("p1",))]
    result = rf.refine_persona(before, "master", ["card_1", "p1"], ops, NOW, S)
    assert result.persona["master"][0] == before["master"][0]
    assert result.persona["master"][1].last_refine_cluster_hash == rf.cluster_hash(["card_1", "p1"])


def test_persona_failure_counts_attempts():
    after = rf.persona_failure(persona(), "master", ["p1", "p2", "card_1"], NOW)
    by = {e.id: e for e in after["master"]}
    assert by["p1"].refine_attempts == 1 and by["p2"].refine_attempts == 1 and by["p3"].refine_attempts == 0
    assert by["card_1"].refine_attempts == 0


def test_merged_persona_score_is_max_of_members():
    before = persona()
    result = rf.refine_persona(before, "master", ["p1", "p2"], [rf.RefineOp("merge", ("p1", "p2"), ("t",))], NOW, S)
    survivor = [e for e in result.persona["master"] if e.id == "p2"][0]
    assert net_score(survivor, NOW, S) == pytest.approx(max(net_score(e, NOW, S) for e in before["master"][1:3]))
