"""Recall quality on the LoCoMo development split: evidence recall@8 through /query_memory.

Run from the project root::

    .venv/bin/python -m bench.locomo_quality [--data ../shared/data/locomo-dev]
        [--configs defaults] [--prefix none|speaker] [--limit-conversations N]
        [--conversations conv-26,conv-30] [--unmined-last K [--unmined-only]] [--stand-in]
        [--json out.json]

For every configuration and every conversation a fresh in-process server (uvicorn in a
thread, real HTTP on 127.0.0.1) runs on a temporary memory root. The conversation's
observations are imported as facts through ``POST /api/characters/{name}/facts`` (event
time = the session's date, ``source = {"dia_ids": [...]}``), the vectors are left to
finish (``/health`` pending = 0), then every question of categories 1-4 is asked through
``POST /query_memory/{name}``. A question scores the share of its evidence dia_ids cited by
the returned facts (fact id -> dia_ids through ``GET /api/characters/{name}/facts``).
Printed: recall@8 per category (1 multi-hop, 2 temporal, 3 open-domain, 4 single-hop) and
overall (micro-average over questions) for each configuration, plus the ceiling (evidence
cited by any observation at all).

With ``--unmined-last K`` every configuration is measured twice: fully mined (as above), and
with the last K sessions of each conversation left unmined: their observations are not
imported, their turns are posted through ``/cache`` instead (speaker A as the user, no model
configured, so no fact covers them) and a returned turn row cites its own dia_id. The
scores of the questions whose evidence lies in those sessions are printed apart. ``turns``
in a configuration name's place keeps the default; ``no-turns`` sets
``recall_uncovered_turns`` to 0 (recall as it was before uncovered turns were candidates).
``turn-keys`` (``turn-keys1``, ``turn-keys3``: weights 1 and 3) turns ``recall_turn_keys`` on: the mined
sessions' turns are then posted too and marked covered, and each fact names the time span
of the turns it cites, so the covered turns act as more keys of their facts.

With ``--stand-in`` a local OpenAI-compatible embedding server (:mod:`bench.embedding_server`,
the bundled e5 without its prefixes) runs beside, and the configuration ``remote`` embeds
through it (``embedding_model = "remote"``, e5's prefixes and threshold): compare it with
``e5``; and the configuration ``leg`` adds it as a leg beside the bundled use
(``embedding_model = "use+remote"``: compare it with ``both``, use+e5 in process); the
server's request latencies are printed at the end.

Configuration sets (``--configs``): ``legs`` (BM25 only, vector only, hybrid with the
current defaults), ``defaults`` (legs + the reference's numbers), ``ablation`` (hybrid
without each of nekomem's query-side additions), ``query`` (the vector leg's hubness
correction and unnamed query vector, on and off), ``sweep`` (legs plus a grid of
thresholds, per-leg depth and RRF k), ``sametime`` (the same-time leg off, with 1-5
anchors, and with the consensus leg), ``consensus`` (the consensus leg's pool depth and BM25
weight), ``models`` (each embedding model, vector leg alone and hybrid: use, e5, both =
use+e5 as two vector legs), or a comma list of names from
CONFIGS (``a+b`` merges two, e.g. ``e5+vector``).
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from bench._common import smoke_option
from nekomem.config import Settings, load_settings
from nekomem.config.embeddings import EmbeddingSettings
from nekomem.models.embeddings import EmbeddingService
from nekomem.runtime.clock import Clock
from tests.support.live import ROOT, LiveServer

CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop"}
NAME = "locomo"
PAGE = 1000

# The reference implementation's numbers, and none of nekomem's additions.
REFERENCE = {
    "recall_budget_each": 4,
    "recall_budget_total": 8,
    "recall_rrf_k": 60,
    "recall_bm25_threshold": 0.1,
    "recall_cosine_threshold": 0.3,
    "recall_stem_english": False,
    "recall_query_stopwords": False,
    "recall_query_time_hints": False,
    "recall_vector_hub_weight": 0.0,
    "recall_query_unnamed_weight": 0.0,
    "recall_query_time_year_lookback": 0,
}
CONFIGS: dict[str, dict[str, Any]] = {
    "bm25": {"embedding_enabled": False},
    "vector": {"recall_legs": "vector"},
    "hybrid": {},
    "reference-bm25": {**REFERENCE, "embedding_enabled": False},
    "reference-vector": {**REFERENCE, "recall_legs": "vector"},
    "reference-hybrid": dict(REFERENCE),
    "no-stem": {"recall_stem_english": False},
    "no-stopwords": {"recall_query_stopwords": False},
    "no-time-hints": {"recall_query_time_hints": False},
    "no-hub": {"recall_vector_hub_weight": 0.0},
    "no-unnamed": {"recall_query_unnamed_weight": 0.0},
    "plain-vector": {"recall_vector_hub_weight": 0.0, "recall_query_unnamed_weight": 0.0},
    "no-lookback": {"recall_query_time_year_lookback": 0},
    # Today's main before this branch's query-side additions.
    "before": {"recall_vector_hub_weight": 0.0, "recall_query_unnamed_weight": 0.0, "recall_query_time_year_lookback": 0},
    # The journal turns no memory covers as candidates (issue 36): off.
    "no-turns": {"recall_uncovered_turns": 0},
}
for _weight in (0.5, 0.75, 1.5, 2.0, 3.0):
    CONFIGS[f"tw{_weight}"] = {"recall_turn_leg_weight": _weight}
CONFIGS["turn-bm25"] = {"recall_turn_vectors": False}  # the uncovered turns by BM25 alone
# The covered turns as more keys of their facts (LongMemEval's key expansion), three weights.
CONFIGS["turn-keys"] = {"recall_turn_keys": True}
CONFIGS["turn-keys1"] = {"recall_turn_keys": True, "recall_turn_keys_weight": 1.0}
CONFIGS["turn-keys3"] = {"recall_turn_keys": True, "recall_turn_keys_weight": 3.0}
for _each in (4, 6, 8, 12):
    CONFIGS[f"each{_each}"] = {"recall_budget_each": _each}
for _cos in (0.0, 0.05, 0.1, 0.15, 0.2, 0.3):
    CONFIGS[f"cos{_cos}"] = {"recall_cosine_threshold": _cos}
for _bm in (0.0, 0.05, 0.1, 0.2):
    CONFIGS[f"bm{_bm}"] = {"recall_bm25_threshold": _bm}
for _k in (10, 30, 60, 120):
    CONFIGS[f"rrf{_k}"] = {"recall_rrf_k": _k}
# The same-time leg (recall_same_time_anchors; 0 = off) and the consensus leg (recall_consensus_leg).
for _anchors in (0, 1, 2, 3, 4, 5):
    CONFIGS[f"same{_anchors}"] = {"recall_same_time_anchors": _anchors}
CONFIGS["consensus"] = {"recall_consensus_leg": True}
for _pool in (8, 12, 16, 24):
    CONFIGS[f"cpool{_pool}"] = {"recall_consensus_leg": True, "recall_consensus_pool": _pool}
for _cbm in (0.0, 0.3, 0.5, 1.0):
    CONFIGS[f"cbm{_cbm}"] = {"recall_consensus_leg": True, "recall_consensus_bm25_weight": _cbm}
# BM25 term saturation / length normalisation.
for _k1, _b in ((0.9, 0.3), (0.9, 0.5), (1.2, 0.5), (1.2, 0.75), (1.5, 0.5), (1.5, 0.9), (2.0, 0.75)):
    CONFIGS[f"k1-{_k1}-b{_b}"] = {"recall_bm25_k1": _k1, "recall_bm25_b": _b}
# The embedding models (each with its profile's thresholds); merge with "vector" for the leg alone.
CONFIGS.update({"use": {"embedding_model": "use"}, "e5": {"embedding_model": "e5"}, "both": {"embedding_model": "use+e5"}})
SETS = {
    "legs": ["bm25", "vector", "hybrid"],
    "defaults": ["reference-bm25", "reference-vector", "reference-hybrid", "bm25", "vector", "hybrid"],
    "ablation": ["hybrid", "no-stem", "no-stopwords", "no-time-hints", "no-hub", "no-unnamed", "plain-vector", "no-lookback"],
    "query": ["hybrid", "no-hub", "no-unnamed", "plain-vector", "no-lookback", "before", "vector", "vector+before"],
    "sweep": ["hybrid"] + [n for n in CONFIGS if n.startswith(("each", "cos", "bm0", "rrf"))],
    "models": ["use+vector", "e5+vector", "both+vector", "use", "e5", "both"],
    "sametime": ["both+same0"] + [f"both+same{n}" for n in (1, 2, 3, 4, 5)] + ["both+consensus", "both+consensus+same0"],
    "consensus": ["both", "both+consensus"] + [f"both+{n}" for n in CONFIGS if n.startswith(("cpool", "cbm"))],
}

_DATE = re.compile(r"(\d{1,2}):(\d{2})\s*([ap]m)\s+on\s+(\d{1,2})\s+([A-Za-z]+),?\s+(\d{4})", re.I)
_MONTHS = {
    m: i
    for i, m in enumerate(
        ["january", "february", "march", "april", "may", "june", "july", "august", "september", "october", "november", "december"], start=1
    )
}


def session_time(text: str) -> str | None:
    """ "1:56 pm on 8 May, 2023" -> ISO 8601 (UTC); None if it does not parse."""
    found = _DATE.search(text or "")
    if not found:
        return None
    hour, minute, half, day, month, year = found.groups()
    h = int(hour) % 12 + (12 if half.lower() == "pm" else 0)
    month_no = _MONTHS.get(month.lower())
    if month_no is None:
        return None
    return datetime(int(year), month_no, int(day), h, int(minute), tzinfo=timezone.utc).isoformat()


def dia_ids(value: Any) -> list[str]:
    items = value if isinstance(value, list) else [value]
    out: list[str] = []
    for item in items:
        out += [p for p in re.split(r"[;,\s]+", str(item)) if p]
    return out


def load_conversation(path: Path, prefix: str) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    data = json.loads(path.read_text(encoding="utf-8"))
    facts: list[dict[str, Any]] = []
    session = 1
    while f"session_{session}_date_time" in data:
        when = session_time(data[f"session_{session}_date_time"])
        for speaker, observations in (data.get(f"session_{session}_observation") or {}).items():
            for text, ids in observations:
                shown = f"{speaker}: {text}" if prefix == "speaker" else text
                facts.append(
                    {"text": shown, "importance": 5, "entity": "master", "event_start_at": when, "source": {"dia_ids": dia_ids(ids)}}
                )
        session += 1
    questions = [
        {"question": q["question"], "evidence": dia_ids(q.get("evidence", [])), "category": q["category"]}
        for q in data["qa"]
        if q.get("category") in CATEGORIES and q.get("evidence")
    ]
    return facts, questions


@dataclass(frozen=True)
class Unmined:
    """The last sessions of a conversation left unmined: their first session number, the
    requests to post (each speaker-A turn with the speaker-B turns after it, as
    ``input_history`` items with the session's time) and the dia_ids of each turn text."""

    first_session: int
    requests: list[list[dict[str, str]]]
    cites: dict[str, set[str]]

    def holds(self, dia_id: str) -> bool:
        """Whether ``dia_id`` ("D12:3") is a turn of these sessions."""
        head = dia_id.split(":", 1)[0]
        return head.startswith("D") and head[1:].isdigit() and int(head[1:]) >= self.first_session


def unmined_sessions(path: Path, last: int) -> Unmined:
    """The last ``last`` sessions (with turns and a date) of the conversation at ``path``."""
    data = json.loads(path.read_text(encoding="utf-8"))
    numbered = []
    n = 1
    while f"session_{n}_date_time" in data:
        when = session_time(data[f"session_{n}_date_time"])
        if when is not None and data.get(f"session_{n}"):
            numbered.append((n, when, data[f"session_{n}"]))
        n += 1
    chosen = numbered[-last:] if last > 0 else []
    requests: list[list[dict[str, str]]] = []
    cites: dict[str, set[str]] = defaultdict(set)
    for _n, when, turns in chosen:
        start = datetime.fromisoformat(when)
        for i, turn in enumerate(turns):
            role = "user" if turn["speaker"] == data["speaker_a"] else "assistant"
            if role == "user" or not requests:
                requests.append([])
            stamp = (start + timedelta(seconds=30 * i)).isoformat()
            requests[-1].append({"role": role, "content": turn["text"], "timestamp": stamp})
            cites[" ".join(turn["text"].split())].add(turn["dia_id"])
    return Unmined(chosen[0][0] if chosen else 10**9, requests, dict(cites))


@dataclass(frozen=True)
class Journal:
    """Every session's turns of a conversation as ``/cache`` requests (as :class:`Unmined`
    builds them), by session number, and each turn's time by dia_id: what the configurations
    with ``recall_turn_keys`` need (the mined sessions' turns in the journal, covered, and
    each fact naming the time span of the turns it cites)."""

    requests: dict[int, list[list[dict[str, str]]]]
    stamps: dict[str, str]


def conversation_journal(path: Path) -> Journal:
    """The :class:`Journal` of the conversation at ``path``."""
    data = json.loads(path.read_text(encoding="utf-8"))
    requests: dict[int, list[list[dict[str, str]]]] = {}
    stamps: dict[str, str] = {}
    n = 1
    while f"session_{n}_date_time" in data:
        when = session_time(data[f"session_{n}_date_time"])
        if when is not None and data.get(f"session_{n}"):
            start = datetime.fromisoformat(when)
            session: list[list[dict[str, str]]] = []
            for i, turn in enumerate(data[f"session_{n}"]):
                role = "user" if turn["speaker"] == data["speaker_a"] else "assistant"
                if role == "user" or not session:
                    session.append([])
                stamp = (start + timedelta(seconds=30 * i)).isoformat()
                session[-1].append({"role": role, "content": turn["text"], "timestamp": stamp})
                stamps[turn["dia_id"]] = stamp
            requests[n] = session
        n += 1
    return Journal(requests, stamps)


def with_turn_spans(facts: list[dict[str, Any]], journal: Journal) -> list[dict[str, Any]]:
    """``facts`` whose source also names the time span of the turns they cite, as a fact
    extracted from the journal does (``{"kind": "turns", "from", "to"}``)."""
    out: list[dict[str, Any]] = []
    for fact in facts:
        times = sorted(journal.stamps[d] for d in fact["source"]["dia_ids"] if d in journal.stamps)
        if times:
            fact = {**fact, "source": {**fact["source"], "kind": "turns", "from": times[0], "to": times[-1]}}
        out.append(fact)
    return out


def post_covered_turns(srv: LiveServer, root: Path, name: str, journal: Journal, before_session: int) -> None:
    """Post the turns of the sessions before ``before_session`` through ``/cache`` and mark
    them covered, as a finished extraction over them does (TurnsMined to the journal's writer)."""
    from nekomem.actors.messages import TurnsMined
    from nekomem.stores.timeindex_read import TimeIndexReader

    for number, session in sorted(journal.requests.items()):
        if number < before_session:
            for request in session:
                srv.post(f"/cache/{name}", json={"input_history": request}).raise_for_status()
    found = sorted(root.rglob("time_indexed.db"))
    if not found:
        return
    with TimeIndexReader.read_only(found[0]) as reader:
        top, _count = reader.shape()
    if top:
        srv.runtime.registry.tell(name, "recent", TurnsMined(ranges=[(1, top)]))
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with TimeIndexReader.read_only(found[0]) as reader:
                if (reader.mined_ranges() or [(0, 0)])[-1][1] >= top:
                    return
            time.sleep(0.05)
        raise RuntimeError("the posted turns were not marked covered")


def without_unmined(facts: list[dict[str, Any]], unmined: Unmined) -> list[dict[str, Any]]:
    """``facts`` without the observations that cite only turns of the unmined sessions."""
    return [f for f in facts if not all(unmined.holds(d) for d in f["source"]["dia_ids"])]


def bench_settings(memory_root: Path, **overrides: Any) -> Settings:
    """Settings of one bench server: the NEKOMEM_* environment (so the embedding model and any
    other setting can be chosen as for ``nekomem serve``), this memory root, port 0, then the
    configuration's overrides."""
    values: dict[str, Any] = {"memory_root": str(memory_root), "port": 0}
    values.update(overrides)
    return load_settings(None, env=os.environ, overrides=values)


def wait_vectors(srv: LiveServer, timeout: float = 900.0, name: str = NAME) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        emb = srv.get("/health").json()["embeddings"]
        if emb["state"] != "ready" or emb["pending"] == 0:
            return
        time.sleep(0.05)
    raise RuntimeError("vectors did not finish")


class Services:
    """One loaded EmbeddingService per embedding model, shared by the configurations."""

    def __init__(self) -> None:
        self.loaded: dict[tuple[str, str], EmbeddingService] = {}

    def get(self, settings: EmbeddingSettings) -> EmbeddingService:
        if not settings.embedding_enabled:
            return EmbeddingService(settings)
        key = (settings.embedding_model, settings.embedding_model_dir)
        if key not in self.loaded:
            service = EmbeddingService(settings)
            service.start()
            if not service.wait_ready(300):
                print(f"embeddings {key} unavailable ({service.reason}); vector legs measure nothing", file=sys.stderr)
            self.loaded[key] = service
        return self.loaded[key]

    def close(self) -> None:
        for service in self.loaded.values():
            service.close()


@dataclass(frozen=True)
class RankedAnswer:
    """One question's evidence ids and, for each returned row in rank order, the evidence
    ids that row cites (empty for a row citing none) and, when kept, its text."""

    evidence: frozenset[str]
    cited: tuple[frozenset[str], ...]
    texts: tuple[str, ...] = ()


def run_conversation(
    root: Path,
    overrides: dict[str, Any],
    emb: EmbeddingService | Services,
    facts: list[dict[str, Any]],
    questions: list[dict[str, Any]],
    name: str = NAME,
    clock: Clock | None = None,
    ranked: list[RankedAnswer] | None = None,
    unmined: Unmined | None = None,
    journal: Journal | None = None,
) -> tuple[list[tuple[int, float]], float]:
    """Import ``facts`` as character ``name`` of a fresh server (on ``clock``, the real one by
    default), ask every question; returns (category, share of the evidence ids cited by the
    results) per question and the p50 ms. With ``ranked``, a :class:`RankedAnswer` per
    question is appended to it (for rank measures such as recall@1). With ``unmined``, the
    facts of those sessions are left out and their turns posted through ``/cache`` instead
    (no model: nothing covers them). With ``journal`` and ``recall_turn_keys`` on, the mined
    sessions' turns are posted and marked covered, and each fact names its turns' span."""
    settings = bench_settings(root, **overrides)
    if isinstance(emb, Services):
        service = emb.get(settings.embeddings)  # the configuration's own model
    else:
        service = emb if settings.embeddings.embedding_enabled else EmbeddingService(settings.embeddings)
    with LiveServer(settings, embeddings=service, clock=clock) as srv:
        keys = journal is not None and bool(overrides.get("recall_turn_keys"))
        kept = facts if unmined is None else without_unmined(facts, unmined)
        r = srv.post(f"/api/characters/{name}/facts", json={"facts": with_turn_spans(kept, journal) if keys and journal else kept})
        r.raise_for_status()
        if keys and journal is not None:
            post_covered_turns(srv, root, name, journal, unmined.first_session if unmined is not None else 10**9)
        for request in unmined.requests if unmined is not None else ():
            srv.post(f"/cache/{name}", json={"input_history": request}).raise_for_status()
        if unmined is not None:
            # A first query indexes the uncovered turns; their vectors then count as pending.
            srv.post(f"/query_memory/{name}", json={"query": "warm-up"}).raise_for_status()
        refs = {fid: item.get("source_ref") for fid, item in stored_facts(srv, name).items()}
        cites = {fid: set(ref.get("dia_ids", [])) if isinstance(ref, dict) else set() for fid, ref in refs.items()}
        wait_vectors(srv, name=name)
        turn_cites = unmined.cites if unmined is not None else None
        scores, latencies = ask_questions(srv, name, questions, cites, ranked, turn_cites)
    return scores, statistics.median(latencies) * 1000 if latencies else 0.0


def stored_facts(srv: LiveServer, name: str = NAME) -> dict[str, Any]:
    """Every stored fact of ``name`` (active and archived) as id -> its public fields, read
    page by page through ``GET /api/characters/{name}/facts``."""
    refs: dict[str, Any] = {}
    offset = 0
    while True:
        listing = srv.get(f"/api/characters/{name}/facts", params={"status": "all", "limit": PAGE, "offset": offset}).json()
        for item in listing["items"]:
            refs[item["id"]] = item
        offset += len(listing["items"])
        if offset >= listing["total"] or not listing["items"]:
            return refs


def ask_questions(
    srv: LiveServer,
    name: str,
    questions: list[dict[str, Any]],
    cites: dict[str, set[str]],
    ranked: list[RankedAnswer] | None = None,
    turn_cites: dict[str, set[str]] | None = None,
) -> tuple[list[tuple[int, float]], list[float]]:
    """Ask every question through ``POST /query_memory/{name}``; returns (category, share of
    the evidence ids cited by the results, through ``cites``: fact id -> dia_ids, and for a
    journal turn's row ``turn_cites``: its whitespace-flattened text -> dia_ids) per
    question and the latencies in seconds. Raises RuntimeError when a recall fails."""

    def cited_by(row: dict[str, Any]) -> set[str]:
        if turn_cites is not None and row.get("tier") in ("turn", "journal"):
            return turn_cites.get(" ".join(str(row["text"]).split()), set())
        return cites.get(row["id"], set())

    scores: list[tuple[int, float]] = []
    latencies: list[float] = []
    for q in questions:
        started = time.perf_counter()
        body = srv.post(f"/query_memory/{name}", json={"query": q["question"]}).json()
        latencies.append(time.perf_counter() - started)
        if "error_code" in body:
            raise RuntimeError(f"recall failed: {body}")
        cited: set[str] = set()
        for row in body["results"]:
            cited |= cited_by(row)
        evidence = set(q["evidence"])
        scores.append((q["category"], len(evidence & cited) / len(evidence)))
        if ranked is not None:
            per_row = tuple(frozenset(cited_by(row) & evidence) for row in body["results"])
            ranked.append(RankedAnswer(frozenset(evidence), per_row, tuple(row["text"] for row in body["results"])))
    return scores, latencies


def ceiling(facts_by_conv: list[list[dict[str, Any]]], questions_by_conv: list[list[dict[str, Any]]]) -> list[tuple[int, float]]:
    out: list[tuple[int, float]] = []
    for facts, questions in zip(facts_by_conv, questions_by_conv, strict=False):
        known = set().union(*(set(f["source"]["dia_ids"]) for f in facts))
        for q in questions:
            evidence = set(q["evidence"])
            out.append((q["category"], len(evidence & known) / len(evidence)))
    return out


def summarise(scores: list[tuple[int, float]]) -> dict[str, float]:
    by_cat: dict[int, list[float]] = defaultdict(list)
    for cat, value in scores:
        by_cat[cat].append(value)
    row = {CATEGORIES[c]: statistics.fmean(v) for c, v in sorted(by_cat.items())}
    row["overall"] = statistics.fmean(v for _, v in scores) if scores else float("nan")
    return row


def overrides_of(name: str) -> dict[str, Any]:
    """Settings of a configuration name; ``a+b`` merges a and b (b wins)."""
    merged: dict[str, Any] = {}
    for part in name.split("+"):
        merged.update(CONFIGS[part])
    return merged


def conversation_files(folder: Path, wanted: str) -> list[Path]:
    """The conversation files of ``folder``, only those named in ``wanted`` (a comma list of
    file stems) when it is not empty; SystemExit naming any unknown one."""
    files = sorted(folder.glob("*.json"))
    if wanted:
        keep = {c.strip() for c in wanted.split(",") if c.strip()}
        files = [f for f in files if f.stem in keep]
        if len(files) != len(keep):
            raise SystemExit(f"unknown conversations: {', '.join(sorted(keep - {f.stem for f in files}))}")
    return files


def resolve_data(value: str) -> Path:
    """The LoCoMo folder ``value`` names: as given, relative to the project root, to the
    working directory, or to the project root's parent (a work tree one folder deeper than a
    clone, whose ``../shared`` is then its parent's sibling)."""
    path = Path(value).expanduser()
    for candidate in (path, ROOT / path, Path.cwd() / path, ROOT.parent / path):
        if candidate.is_dir():
            return candidate
    raise SystemExit(f"no LoCoMo folder at {value} (also tried relative to {ROOT} and its parent)")


SMOKE_SESSIONS = 2
SMOKE_QUESTIONS = 6


def smoke_folder(folder: Path) -> Path:
    """A temporary LoCoMo folder (removed at exit) holding the first conversation of ``folder`` cut to its
    first SMOKE_SESSIONS sessions and SMOKE_QUESTIONS questions whose evidence lies in them:
    the smallest input that runs a LoCoMo bench to its last line (``--smoke``)."""
    first = sorted(folder.glob("*.json"))[0]
    data = json.loads(first.read_text(encoding="utf-8"))
    kept_sessions = {str(n) for n in range(1, SMOKE_SESSIONS + 1)}
    trimmed: dict[str, Any] = {}
    for key, value in data.items():
        match = re.fullmatch(r"(?:events_)?session_(\d+)(?:_\w+)?", key)
        if match is None or match.group(1) in kept_sessions:
            trimmed[key] = value
    prefixes = tuple(f"D{n}:" for n in kept_sessions)
    questions = [q for q in data["qa"] if q.get("evidence") and all(str(e).startswith(prefixes) for e in q["evidence"])]
    trimmed["qa"] = questions[:SMOKE_QUESTIONS]
    dest = Path(tempfile.mkdtemp(prefix="nekomem-locomo-smoke-"))
    atexit.register(shutil.rmtree, dest, True)
    (dest / first.name).write_text(json.dumps(trimmed), encoding="utf-8")
    return dest


def config_names(spec: str) -> list[str]:
    """The configuration names of a ``--configs`` value: a comma list of CONFIGS names
    (``a+b`` merges two) and SETS names (expanded). Raises SystemExit naming unknown ones."""
    names: list[str] = []
    for item in (n.strip() for n in spec.split(",")):
        names += SETS.get(item, [item] if item else [])
    unknown = sorted({part for n in names for part in n.split("+") if part not in CONFIGS})
    if unknown:
        raise SystemExit(f"unknown configs: {', '.join(unknown)} (known: {', '.join(CONFIGS)}; sets: {', '.join(SETS)})")
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default="../shared/data/locomo-dev")
    parser.add_argument(
        "--configs", default="defaults", help="comma-separated sets (legs, defaults, ablation, sweep) or config names; a+b merges two"
    )
    parser.add_argument("--prefix", choices=("none", "speaker"), default="none", help="prefix each fact with its speaker")
    parser.add_argument("--limit-conversations", type=int, default=0)
    parser.add_argument("--conversations", default="", help="comma list of file stems to keep (conv-26,conv-30): a cross-check on a subset")
    parser.add_argument("--json", help="also write the results to this file")
    parser.add_argument(
        "--unmined-last",
        type=int,
        default=0,
        help="also measure each config with the last K sessions unmined (their turns posted, no facts)",
    )
    parser.add_argument("--unmined-only", action="store_true", help="with --unmined-last: skip the fully mined runs")
    parser.add_argument(
        "--stand-in", action="store_true", help="serve e5 from bench.embedding_server and add the config remote (embedding_model=remote)"
    )
    smoke = smoke_option(parser, argv, configs="use")
    args = parser.parse_args(argv)
    stand_in = None
    if args.stand_in:
        from bench.embedding_server import REMOTE_E5, StandInServer

        stand_in = StandInServer().start()
        CONFIGS["remote"] = {**REMOTE_E5, "embedding_remote_base_url": stand_in.base_url}
        # The endpoint as a leg beside the bundled use: use+e5 with e5 served over HTTP.
        CONFIGS["leg"] = {**CONFIGS["remote"], "embedding_model": "use+remote"}

    folder = resolve_data(args.data)
    if smoke:
        folder = smoke_folder(folder)
    files = conversation_files(folder, args.conversations)
    if args.limit_conversations:
        files = files[: args.limit_conversations]
    names = config_names(args.configs)
    loaded = [load_conversation(f, args.prefix) for f in files]
    facts_by_conv = [f for f, _ in loaded]
    questions_by_conv = [q for _, q in loaded]

    services = Services()
    emb = services.get(bench_settings(Path(tempfile.gettempdir())).embeddings)
    print(
        f"LoCoMo: {len(files)} conversations, {sum(len(f) for f in facts_by_conv)} facts, "
        f"{sum(len(q) for q in questions_by_conv)} questions (categories 1-4), prefix={args.prefix}, "
        f"embeddings={emb.state}"
    )
    header = ["config"] + list(CATEGORIES.values()) + ["overall", "p50 ms", "seconds"]
    print(" | ".join(f"{h:>11}" if i else f"{h:<28}" for i, h in enumerate(header)))
    results: dict[str, dict[str, float]] = {}
    ceil = summarise(ceiling(facts_by_conv, questions_by_conv))
    print(" | ".join([f"{'(ceiling)':<28}"] + [f"{ceil.get(c, float('nan')):>11.3f}" for c in list(CATEGORIES.values()) + ["overall"]]))
    unmined = [unmined_sessions(f, args.unmined_last) for f in files] if args.unmined_last > 0 else []
    wants_journal = any(overrides_of(n).get("recall_turn_keys") for n in names)
    journals: list[Journal | None] = [conversation_journal(f) for f in files] if wants_journal else [None] * len(files)
    modes: list[str] = ([] if args.unmined_only and unmined else ["mined"]) + (["unmined"] if unmined else [])
    for name in names:
        for mode in modes:
            started = time.monotonic()
            scores: list[tuple[int, float]] = []
            late: list[tuple[int, float]] = []  # the questions whose evidence is in the unmined sessions
            p50s: list[float] = []
            with tempfile.TemporaryDirectory(prefix="nekomem-locomo-") as tmp:
                for index, (facts, questions) in enumerate(loaded):
                    left = unmined[index] if mode == "unmined" else None
                    conv_scores, p50 = run_conversation(
                        Path(tmp) / f"c{index}", overrides_of(name), services, facts, questions, unmined=left, journal=journals[index]
                    )
                    scores += conv_scores
                    if unmined:
                        late += [
                            sc for sc, q in zip(conv_scores, questions, strict=True) if any(unmined[index].holds(e) for e in q["evidence"])
                        ]
                    p50s.append(p50)
            row = summarise(scores)
            row["p50_ms"] = statistics.median(p50s)
            label = name if mode == "mined" else f"{name} (last {args.unmined_last} unmined)"
            if unmined:
                row["late_questions"] = len(late)
                row["late_overall"] = statistics.fmean(v for _, v in late) if late else float("nan")
            results[label] = row
            cells = [f"{row.get(c, float('nan')):>11.3f}" for c in list(CATEGORIES.values()) + ["overall"]]
            extra = f" | late {row['late_overall']:.3f} over {len(late)} questions" if unmined else ""
            print(
                " | ".join([f"{label:<28}"] + cells + [f"{row['p50_ms']:>11.1f}", f"{time.monotonic() - started:>11.1f}"]) + extra,
                flush=True,
            )
    if args.json:
        Path(args.json).write_text(json.dumps({"ceiling": ceil, "configs": results}, indent=2), encoding="utf-8")
    services.close()
    if stand_in is not None:
        print(f"stand-in embedding server: {stand_in.latency_summary()} (server side, batches of the backfill and queries)")
        stand_in.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
