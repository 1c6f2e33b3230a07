"""The Chinese and Japanese recall sets under bench/data load and are well-formed, and the
bench runs one user of a set through a real server."""

from __future__ import annotations

import json
import shutil
from datetime import date, datetime
from pathlib import Path

import pytest

from bench.cjk_quality import DATA, DATASETS, RecallSet, facts_of, load_set, rank_measures, run_set
from bench.locomo_quality import RankedAnswer, bench_settings
from nekomem.models.embeddings import EmbeddingService
from tests.support.live import make_settings


@pytest.fixture(scope="module", params=sorted(DATASETS.values()))
def recall_set(request: pytest.FixtureRequest) -> RecallSet:
    return load_set(DATA / request.param)


def test_every_question_has_evidence_that_exists_and_belongs_to_its_user(recall_set: RecallSet) -> None:
    owner = {t.id: user for user, turns in recall_set.users.items() for t in turns}
    assert recall_set.questions
    for q in recall_set.questions:
        assert q.question.strip()
        assert len(q.evidence) >= 1
        assert all(owner.get(e) == q.user for e in q.evidence), q.id
        assert q.answer_in in ("user", "reply")
    assert len({q.id for q in recall_set.questions}) == len(recall_set.questions)


def test_days_parse_and_every_user_talks_on_several_days(recall_set: RecallSet) -> None:
    raw = json.loads((DATA / recall_set.name / "dialogues.json").read_text(encoding="utf-8"))
    for user in raw["users"]:
        days = [date.fromisoformat(d["date"]) for d in user["days"]]
        assert days == sorted(days) and len(set(days)) == len(days) >= 3
        assert all(t["user"].strip() for d in user["days"] for t in d["turns"])


def test_set_sizes_and_provenance() -> None:
    cn = load_set(DATA / "memorybank-cn")
    assert (len(cn.users), len(cn.questions)) == (15, 100)
    assert "MIT License" in (DATA / "memorybank-cn" / "LICENSE").read_text(encoding="utf-8")
    assert "zhongwanjun/MemoryBank-SiliconFriend" in (DATA / "memorybank-cn" / "README.md").read_text(encoding="utf-8")
    ja = load_set(DATA / "companion-ja")
    assert len(ja.questions) >= 50 and len(ja.users) >= 5
    assert "authored for nekomem" in (DATA / "companion-ja" / "README.md").read_text(encoding="utf-8")


def test_facts_are_the_user_statements_dated_on_their_day_and_citing_their_turn() -> None:
    ja = load_set(DATA / "companion-ja")
    turns = ja.users["u01"]
    facts = facts_of(turns)
    assert [f["text"] for f in facts] == [t.user for t in turns]
    assert [f["source"]["dia_ids"] for f in facts] == [[t.id] for t in turns]
    for fact, turn in zip(facts, turns, strict=True):
        assert datetime.fromisoformat(fact["event_start_at"]).date() == turn.day


def _broken_copy(tmp_path: Path, edit_question: dict[str, object] | None = None, bad_date: bool = False) -> Path:
    folder = tmp_path / "broken"
    shutil.copytree(DATA / "companion-ja", folder)
    if edit_question is not None:
        lines = (folder / "questions.jsonl").read_text(encoding="utf-8").splitlines()
        first = json.loads(lines[0])
        first.update(edit_question)
        lines[0] = json.dumps(first, ensure_ascii=False)
        (folder / "questions.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    if bad_date:
        raw = json.loads((folder / "dialogues.json").read_text(encoding="utf-8"))
        raw["users"][0]["days"][0]["date"] = "2024-13-01"
        (folder / "dialogues.json").write_text(json.dumps(raw, ensure_ascii=False), encoding="utf-8")
    return folder


@pytest.mark.parametrize(
    ("edit", "bad_date", "message"),
    [
        ({"evidence": ["u01-2024-06-03-t99"]}, False, "is not a turn of user u01"),
        ({"evidence": ["u02-2024-06-03-t1"]}, False, "is not a turn of user u01"),
        ({"evidence": []}, False, "no evidence"),
        ({"user": "u99"}, False, "unknown user u99"),
        (None, True, "not YYYY-MM-DD"),
    ],
)
def test_a_broken_set_is_refused_naming_the_problem(tmp_path: Path, edit: dict[str, object] | None, bad_date: bool, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        load_set(_broken_copy(tmp_path, edit, bad_date))


def test_one_user_through_a_real_server_bm25_only(tmp_path: Path) -> None:
    ja = load_set(DATA / "companion-ja")
    one = RecallSet(ja.name, {"u04": ja.users["u04"]}, [q for q in ja.questions if q.user == "u04"])
    disabled = EmbeddingService(make_settings(tmp_path, embedding_enabled=False).embeddings)
    row, p50 = run_set(one, {"embedding_enabled": False}, disabled, tmp_path / "run")
    assert p50 > 0
    # BM25 alone over this user's 25 statements: most evidence is found, not all of it
    # (the companion's own advice is never stored, only the question that asked for it).
    assert 0.5 <= row["overall"] < 1.0
    assert row["reply"] < row["user"]
    # The first rows hold less of the evidence than all eight; the first hit is near the top.
    assert 0.0 < row["r@1"] <= row["r@3"] <= row["overall"]
    assert row["r@1"] <= row["mrr"] <= 1.0


def test_rank_measures_count_evidence_in_the_first_rows_and_the_first_hit() -> None:
    def answer(evidence: str, *rows: str) -> RankedAnswer:
        return RankedAnswer(frozenset(evidence), tuple(frozenset(r) for r in rows))

    answers = [
        answer("a", "a", "", ""),  # first row: r@1 1, r@3 1, rr 1
        answer("ab", "", "b", "a"),  # r@1 0, r@3 1, rr 1/2
        answer("ab", "", "", "", "b"),  # r@1 0, r@3 0, rr 1/4
        answer("c"),  # nothing returned: 0, 0, 0
    ]
    measures = rank_measures(answers)
    assert measures["r@1"] == pytest.approx(1 / 4)
    assert measures["r@3"] == pytest.approx(2 / 4)
    assert measures["mrr"] == pytest.approx((1 + 1 / 2 + 1 / 4) / 4)
    assert all(v != v for v in rank_measures([]).values())  # NaN without questions


def test_bench_settings_follow_the_environment_and_the_configuration_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NEKOMEM_EMBEDDING_MODEL_DIR", "models/some-other-model")
    monkeypatch.setenv("NEKOMEM_RECALL_BM25_THRESHOLD", "0.3")
    monkeypatch.setenv("NEKOMEM_MEMORY_ROOT", "/nowhere")
    settings = bench_settings(tmp_path, recall_bm25_threshold=0.05)
    assert settings.embeddings.embedding_model_dir == "models/some-other-model"
    assert settings.recall.recall_bm25_threshold == 0.05
    assert settings.server.memory_root == str(tmp_path)
