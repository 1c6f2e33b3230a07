"""Recall quality in Chinese and Japanese: evidence recall@8 through /query_memory.

Run from the project root::

    .venv/bin/python -m bench.cjk_quality [--sets zh,ja] [--configs legs] [--json out.json]

Two labelled sets live under ``bench/data/`` (see docs/BENCHMARKS.md and each set's README):
``memorybank-cn`` (the public MemoryBank-SiliconFriend Chinese evaluation dialogues, 15
users, 100 probing questions, evidence labelled for this project) and ``companion-ja``
(Japanese companion dialogues and probing questions written for this project). Each set
is a ``dialogues.json`` (users -> dated days -> turns ``{id, user, reply}``) and a
``questions.jsonl`` (``{id, user, question, evidence: [turn ids], answer_in}``).

For every configuration and every user a fresh in-process server (the same path as
``bench.locomo_quality``: uvicorn in a thread, real HTTP on 127.0.0.1, settings from the
NEKOMEM_* environment plus the configuration's overrides) imports the user's own
statements as facts (event time = the day, one minute apart per turn, ``source =
{"dia_ids": [turn id]}``) and answers the user's questions through ``POST
/query_memory``, asked on the day after the user's last conversation (the server runs on
a clock set to that day, so "5月2号" in a question is a date of the conversation's year;
``--real-clock`` asks on the machine's clock instead). A question scores the share of its evidence turns cited by the returned
facts (at most 8). Printed per set: recall@8 for questions whose answer the user stated
(``user``), questions whose answer the companion gave in its reply (``reply``: only the
user's turn that asked for it is stored), and overall; then, over all questions, the rank
measures recall@1 and recall@3 (the share of the evidence cited by the first one or three
rows) and MRR (the mean of 1 / the rank of the first row citing evidence, 0 when none
does), which still separate configurations when recall@8 is near its ceiling.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from bench._common import smoke_option
from bench.locomo_quality import RankedAnswer, bench_settings, config_names, overrides_of, run_conversation
from nekomem.models.embeddings import EmbeddingService
from nekomem.runtime.clock import ManualClock
from tests.support.live import ROOT

DATA = ROOT / "bench" / "data"
DATASETS = {"zh": "memorybank-cn", "ja": "companion-ja"}
ANSWER_IN = {1: "user", 2: "reply"}
_CATEGORY = {v: k for k, v in ANSWER_IN.items()}
# Turns of one day are stamped from this hour on, a minute apart (the sets give days only).
DAY_START_HOUR = 20


@dataclass(frozen=True)
class Turn:
    id: str
    day: date
    index: int
    user: str
    reply: str


@dataclass(frozen=True)
class Question:
    id: str
    user: str
    question: str
    evidence: tuple[str, ...]
    answer_in: str


@dataclass(frozen=True)
class RecallSet:
    name: str
    users: dict[str, list[Turn]]  # user id -> turns in order
    questions: list[Question]

    def turn_ids(self) -> set[str]:
        return {t.id for turns in self.users.values() for t in turns}


def load_set(folder: Path) -> RecallSet:
    """Read ``dialogues.json`` and ``questions.jsonl`` of one set and check them.

    Raises ValueError naming the problem: a date that does not parse, a duplicate turn or
    question id, a question of an unknown user, without evidence, or citing a turn that
    does not exist or belongs to another user; also a set without questions.
    """
    dialogues = json.loads((folder / "dialogues.json").read_text(encoding="utf-8"))
    users: dict[str, list[Turn]] = {}
    owner: dict[str, str] = {}
    for user in dialogues["users"]:
        turns: list[Turn] = []
        for day in user["days"]:
            try:
                when = date.fromisoformat(day["date"])
            except ValueError:
                raise ValueError(f"{folder.name}: user {user['id']} has a day {day['date']!r} that is not YYYY-MM-DD") from None
            for index, turn in enumerate(day["turns"]):
                if turn["id"] in owner:
                    raise ValueError(f"{folder.name}: turn id {turn['id']} appears twice")
                if not str(turn["user"]).strip():
                    raise ValueError(f"{folder.name}: turn {turn['id']} has an empty user statement")
                owner[turn["id"]] = user["id"]
                turns.append(Turn(turn["id"], when, index, turn["user"], turn.get("reply", "")))
        users[user["id"]] = turns
    questions: list[Question] = []
    seen: set[str] = set()
    for line_no, line in enumerate((folder / "questions.jsonl").read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        raw = json.loads(line)
        q = Question(raw["id"], raw["user"], raw["question"], tuple(raw["evidence"]), raw["answer_in"])
        where = f"{folder.name}/questions.jsonl line {line_no} ({q.id})"
        if q.id in seen:
            raise ValueError(f"{where}: question id appears twice")
        seen.add(q.id)
        if q.user not in users:
            raise ValueError(f"{where}: unknown user {q.user}")
        if not q.evidence:
            raise ValueError(f"{where}: no evidence")
        if q.answer_in not in _CATEGORY:
            raise ValueError(f"{where}: answer_in must be one of {', '.join(_CATEGORY)}")
        for turn_id in q.evidence:
            if owner.get(turn_id) != q.user:
                raise ValueError(f"{where}: evidence {turn_id} is not a turn of user {q.user}")
        questions.append(q)
    if not questions:
        raise ValueError(f"{folder.name}: no questions")
    return RecallSet(folder.name, users, questions)


def facts_of(turns: list[Turn]) -> list[dict[str, Any]]:
    """The user's statements as facts, each dated on its day and citing its turn id."""
    facts = []
    for t in turns:
        start = datetime(t.day.year, t.day.month, t.day.day, DAY_START_HOUR, tzinfo=timezone.utc) + timedelta(minutes=t.index)
        facts.append(
            {"text": t.user, "importance": 5, "entity": "master", "event_start_at": start.isoformat(), "source": {"dia_ids": [t.id]}}
        )
    return facts


def questions_of(recall_set: RecallSet, user: str) -> list[dict[str, Any]]:
    return [
        {"question": q.question, "evidence": list(q.evidence), "category": _CATEGORY[q.answer_in]}
        for q in recall_set.questions
        if q.user == user
    ]


def summarise(scores: list[tuple[int, float]]) -> dict[str, float]:
    row: dict[str, float] = {}
    for category, label in ANSWER_IN.items():
        values = [v for c, v in scores if c == category]
        row[label] = statistics.fmean(values) if values else float("nan")
    row["overall"] = statistics.fmean(v for _, v in scores) if scores else float("nan")
    return row


RANK_MEASURES = ("r@1", "r@3", "mrr")


def rank_measures(answers: Sequence[RankedAnswer]) -> dict[str, float]:
    """recall@1 and recall@3 (the share of each question's evidence cited by its first one
    or three rows, averaged over questions) and the mean reciprocal rank of the first row
    that cites any evidence (0 for a question where none does); NaN without questions."""
    if not answers:
        return {m: float("nan") for m in RANK_MEASURES}

    def recall_at(k: int) -> float:
        return statistics.fmean(len(frozenset().union(*a.cited[:k])) / len(a.evidence) for a in answers)

    def reciprocal(a: RankedAnswer) -> float:
        return next((1 / rank for rank, cited in enumerate(a.cited, start=1) if cited), 0.0)

    return {"r@1": recall_at(1), "r@3": recall_at(3), "mrr": statistics.fmean(map(reciprocal, answers))}


def asking_time(turns: list[Turn]) -> datetime:
    """When the questions are asked: noon (UTC) of the day after the user's last conversation."""
    last = max(t.day for t in turns) + timedelta(days=1)
    return datetime(last.year, last.month, last.day, 12, tzinfo=timezone.utc)


def first_user(recall_set: RecallSet) -> RecallSet:
    """``recall_set`` cut to its first user and that user's questions (``--smoke``)."""
    user, turns = next(iter(recall_set.users.items()))
    return RecallSet(recall_set.name, {user: turns}, [q for q in recall_set.questions if q.user == user])


def run_set(
    recall_set: RecallSet, overrides: dict[str, Any], emb: EmbeddingService, root: Path, *, ask_next_day: bool = True
) -> tuple[dict[str, float], float]:
    """Recall@8 (and the :func:`rank_measures`) of one set under one configuration; returns
    the summary row and the p50 ms. With ``ask_next_day`` each user's server runs on a clock
    set to :func:`asking_time`, so a date in a question ("5月2号") means that date of the
    conversation's year."""
    scores: list[tuple[int, float]] = []
    ranked: list[RankedAnswer] = []
    p50s: list[float] = []
    for user, turns in recall_set.users.items():
        questions = questions_of(recall_set, user)
        if not questions:
            continue
        clock = ManualClock(asking_time(turns)) if ask_next_day else None
        user_scores, p50 = run_conversation(root / user, overrides, emb, facts_of(turns), questions, name=user, clock=clock, ranked=ranked)
        scores += user_scores
        p50s.append(p50)
    return summarise(scores) | rank_measures(ranked), statistics.median(p50s) if p50s else 0.0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sets", default="zh,ja", help=f"comma list of {', '.join(DATASETS)} or folder names under bench/data")
    parser.add_argument(
        "--configs", default="legs", help="as bench.locomo_quality: sets (legs, ablation, sweep) or config names; a+b merges"
    )
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument(
        "--real-clock", action="store_true", help="ask on the machine's clock instead of the day after each user's last conversation"
    )
    smoke = smoke_option(parser, argv, sets="ja", configs="hybrid")
    args = parser.parse_args(argv)

    sets = [load_set(DATA / DATASETS.get(s.strip(), s.strip())) for s in args.sets.split(",") if s.strip()]
    if smoke:  # each set's first user alone
        sets = [first_user(s) for s in sets]
    names = config_names(args.configs)

    base = bench_settings(Path(tempfile.gettempdir()))
    emb = EmbeddingService(base.embeddings)
    emb.start()
    if not emb.wait_ready(60):
        print(f"embeddings unavailable ({emb.reason}); vector configurations measure BM25 only", file=sys.stderr)
    print(f"embeddings={emb.state} model={emb.model_id} model_dir={base.embeddings.embedding_model_dir}")
    for s in sets:
        print(f"{s.name}: {len(s.users)} users, {len(s.turn_ids())} user statements (facts), {len(s.questions)} questions")
    header = ["config", "set", *ANSWER_IN.values(), "overall", *RANK_MEASURES, "p50 ms", "seconds"]
    print(" | ".join(f"{h:>9}" if i > 1 else f"{h:<16}" for i, h in enumerate(header)))
    results: dict[str, dict[str, dict[str, float]]] = {}
    for name in names:
        for s in sets:
            started = time.monotonic()
            with tempfile.TemporaryDirectory(prefix="nekomem-cjk-") as tmp:
                row, p50 = run_set(s, overrides_of(name), emb, Path(tmp), ask_next_day=not args.real_clock)
            row["p50_ms"] = p50
            results.setdefault(name, {})[s.name] = row
            cells = [f"{row[c]:>9.3f}" for c in [*ANSWER_IN.values(), "overall", *RANK_MEASURES]]
            print(" | ".join([f"{name:<16}", f"{s.name:<16}", *cells, f"{p50:>9.1f}", f"{time.monotonic() - started:>9.1f}"]), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2), encoding="utf-8")
    emb.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
