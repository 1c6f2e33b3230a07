"""The pipeline on real conversations: recall@8 of what nekomem extracted itself from the
turns a chat server posted, beside recall@8 of the gold observations imported directly.

Run from the project root::

    .venv/bin/python -m bench.pipeline_e2e [--data ../shared/data/locomo-dev]
        [--conversations conv-26,conv-30] [--modes on,off] [--unmined-last K] [--json out.json]

For each LoCoMo dev conversation, a fresh in-process server (real HTTP on 127.0.0.1, on a
manual clock so that days between sessions pass at once) talks to the *ideal extractor*
(:mod:`bench.ideal_extractor`: path A answers with the gold observations about speaker A
whose turns are in its window, path B with those about speaker B; everything else as a
cooperative model). Speaker A is the user, speaker B the character. Each session is posted
exchange by exchange through ``/cache`` with the session's timestamps (30 s apart), then
``/process``; the clock then moves past the extraction triggers and ``/reflect`` runs, as
background synthesis would in the days between sessions. Then every question of categories
1-4 is asked through ``/query_memory`` and scored as in :mod:`bench.locomo_quality` (a fact
cites the dia_ids of the gold observation whose text it carries).

With ``--unmined-last K`` the model fails (HTTP 500) every extraction whose prompt holds a
turn of the last K sessions of each conversation, so those turns stay unmined (as after a
model outage) and reach recall only as turn rows; a returned turn row cites its own
dia_id. The scores of the questions whose evidence lies in those sessions are printed apart.

Printed per mode (powerful memory on / off): recall@8 per category and overall, for the
pipeline and for the gold import, the "kept" ratio (pipeline / gold), how many gold
observations about each speaker were offered to the model and reached facts.json, and the
model calls per task per conversation.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections import Counter
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from bench._common import smoke_option
from bench.ideal_extractor import IdealExtractor, Observation
from bench.locomo_quality import (
    CATEGORIES,
    NAME,
    Services,
    ask_questions,
    bench_settings,
    config_names,
    conversation_files,
    dia_ids,
    load_conversation,
    overrides_of,
    resolve_data,
    run_conversation,
    session_time,
    smoke_folder,
    stored_facts,
    summarise,
    wait_vectors,
)
from nekomem.runtime.clock import ManualClock
from tests.support.live import LiveServer
from tests.support.waiting import quiesce

TURN_SECONDS = 30  # between two turns of a session
MODES = {"on": True, "off": False}


def parse_mode(spec: str) -> tuple[bool, bool, str]:
    """``on``/``off``, then ``:unmined`` and ``:<config>`` flags (locomo_quality CONFIGS
    names, e.g. ``on:unmined:no-turns``): (powerful, last sessions unmined, config name).
    Raises SystemExit on an unknown part."""
    parts = spec.split(":")
    if parts[0] not in MODES:
        raise SystemExit(f"mode {spec!r}: starts with on or off")
    unmined = "unmined" in parts[1:]
    configs = [p for p in parts[1:] if p != "unmined"]
    name = "+".join(configs)
    if name:
        config_names(name)  # SystemExit naming an unknown config
    return MODES[parts[0]], unmined, name


def sessions_of(data: dict[str, Any]) -> list[tuple[datetime, list[dict[str, Any]]]]:
    """(start, turns) of every session with a parsable date, in order."""
    out = []
    n = 1
    while f"session_{n}_date_time" in data:
        when = session_time(data[f"session_{n}_date_time"])
        if when is not None and data.get(f"session_{n}"):
            out.append((datetime.fromisoformat(when), data[f"session_{n}"]))
        n += 1
    return out


def observations_of(data: dict[str, Any]) -> list[Observation]:
    """The gold observations, tagged with the speaker they are about ("a" or "b")."""
    who = {data["speaker_a"]: "a", data["speaker_b"]: "b"}
    out: list[Observation] = []
    n = 1
    while f"session_{n}_date_time" in data:
        when = session_time(data[f"session_{n}_date_time"])
        for speaker, items in (data.get(f"session_{n}_observation") or {}).items():
            for text, ids in items:
                out.append(Observation(len(out), who.get(speaker, "a"), text, frozenset(dia_ids(ids)), when))
        n += 1
    return out


def exchanges(turns: list[dict[str, Any]], speaker_a: str) -> list[list[dict[str, Any]]]:
    """The session cut into requests: each speaker-A turn with the speaker-B turns after it."""
    out: list[list[dict[str, Any]]] = []
    for turn in turns:
        if turn["speaker"] == speaker_a or not out:
            out.append([])
        out[-1].append(turn)
    return out


def post_conversation(srv: LiveServer, clock: ManualClock, data: dict[str, Any], powerful: bool) -> None:
    """Post every session as a chat server would (see the module docstring)."""
    s = srv.settings.longterm
    speaker_a = data["speaker_a"]
    if not powerful:
        srv.post("/api/memory/powerful_memory_config", json={"enabled": False}).raise_for_status()
    for start, turns in sessions_of(data):
        if start > clock.now():
            clock.advance((start - clock.now()).total_seconds())
        when = max(start, clock.now())
        for request in exchanges(turns, speaker_a):
            history = []
            for turn in request:
                role = "user" if turn["speaker"] == speaker_a else "assistant"
                history.append({"role": role, "content": turn["text"], "timestamp": when.isoformat()})
                when += timedelta(seconds=TURN_SECONDS)
            srv.post(f"/cache/{NAME}", json={"input_history": history}).raise_for_status()
            clock.advance(max(0.0, (when - clock.now()).total_seconds()))
        srv.post(f"/process/{NAME}", json={"input_history": []}).raise_for_status()
        # The days after the session: the extraction triggers and the idle passes come due.
        for step in (s.fact_extract_idle_seconds, s.fact_extract_interval_minutes * 60, getattr(s, "fact_self_disclosure_idle_seconds", 0)):
            clock.advance(step + 1)
            quiesce(srv.runtime, NAME, timeout=600)
        srv.post(f"/reflect/{NAME}").raise_for_status()
        quiesce(srv.runtime, NAME, timeout=600)


def run_pipeline(
    root: Path,
    data: dict[str, Any],
    ideal: IdealExtractor,
    services: Services,
    questions: list[dict[str, Any]],
    powerful: bool,
    unmined_last: int = 0,
    overrides: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """One conversation through the pipeline (the last ``unmined_last`` sessions' extraction
    failing); scores, what reached facts.json, model calls."""
    observations = observations_of(data)
    sessions = sessions_of(data)
    turns = [(t["dia_id"], t["text"]) for _start, ts in sessions for t in ts]
    failing = (
        frozenset(t["dia_id"] for _start, ts in sessions[len(sessions) - unmined_last :] for t in ts) if unmined_last > 0 else frozenset()
    )
    ideal.load(turns, observations, failing)
    turn_cites: dict[str, set[str]] = {}
    for dia_id, text in turns:
        turn_cites.setdefault(" ".join(text.split()), set()).add(dia_id)
    first = sessions_of(data)[0][0]
    clock = ManualClock(first - timedelta(minutes=1))
    settings = bench_settings(root, llm_base_url=ideal.base_url, llm_model="ideal-extractor", **(overrides or {}))
    service = services.get(settings.embeddings)
    with LiveServer(settings, embeddings=service, clock=clock) as srv:
        post_conversation(srv, clock, data, powerful)
        items = stored_facts(srv, NAME)
        by_text: dict[str, set[str]] = {}
        for obs in observations:
            by_text.setdefault(obs.text, set()).update(obs.dia_ids)
        cites = {fid: by_text.get(item["text"], set()) for fid, item in items.items()}
        # A first query indexes the uncovered turns; their vectors then count as pending.
        srv.post(f"/query_memory/{NAME}", json={"query": "warm-up"}).raise_for_status()
        wait_vectors(srv, name=NAME)
        scores, _latencies = ask_questions(srv, NAME, questions, cites, turn_cites=turn_cites)
    texts = {item["text"] for item in items.values()}
    reached = Counter(o.who for o in observations if o.text in texts)
    offered = Counter(observations[i].who for i in ideal.offered)
    return {
        "scores": scores,
        "facts": len(items),
        "gold": dict(Counter(o.who for o in observations)),
        "offered": dict(offered),
        "reached": dict(reached),
        "calls": ideal.tally(),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", default="../shared/data/locomo-dev")
    parser.add_argument("--conversations", default="", help="comma list of file stems (conv-26,conv-30); default: the whole split")
    parser.add_argument(
        "--modes",
        default="on,off",
        help="comma list: powerful memory on or off, each with optional :unmined (the last --unmined-last sessions fail) and :<config> flags",
    )
    parser.add_argument("--unmined-last", type=int, default=1, help="sessions left unmined by an :unmined mode")
    parser.add_argument("--json", help="also write the results to this file")
    smoke = smoke_option(parser, argv, modes="on")
    args = parser.parse_args(argv)

    folder = resolve_data(args.data)
    if smoke:
        folder = smoke_folder(folder)
    files = conversation_files(folder, args.conversations)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    parsed = {m: parse_mode(m) for m in modes}
    late: dict[str, list[tuple[int, float]]] = {m: [] for m in modes}

    services = Services()
    results: dict[str, Any] = {"gold": [], **{m: [] for m in modes}, "per_conversation": {}}
    started = time.monotonic()
    with IdealExtractor() as ideal, tempfile.TemporaryDirectory(prefix="nekomem-pipeline-") as tmp:
        for index, path in enumerate(files):
            data = json.loads(path.read_text(encoding="utf-8"))
            facts, questions = load_conversation(path, "none")
            gold_scores, _p50 = run_conversation(Path(tmp) / f"gold{index}", {}, services, facts, questions)
            results["gold"] += gold_scores
            row: dict[str, Any] = {"gold": summarise(gold_scores)["overall"]}
            # The questions about the last --unmined-last sessions, scored apart in every mode.
            last_dias = (
                {t["dia_id"] for _start, ts in sessions_of(data)[-args.unmined_last :] for t in ts} if args.unmined_last > 0 else set()
            )
            for mode in modes:
                powerful, unmined, config = parsed[mode]
                overrides = overrides_of(config) if config else {}
                run = run_pipeline(
                    Path(tmp) / f"m{len(row)}-{index}",
                    data,
                    ideal,
                    services,
                    questions,
                    powerful,
                    args.unmined_last if unmined else 0,
                    overrides,
                )
                results[mode] += run["scores"]
                late[mode] += [sc for sc, q in zip(run["scores"], questions, strict=True) if last_dias & set(q["evidence"])]
                row[mode] = {k: v for k, v in run.items() if k != "scores"} | {"overall": summarise(run["scores"])["overall"]}
            results["per_conversation"][path.stem] = row
            print(f"{path.stem}: {json.dumps(row)} ({time.monotonic() - started:.0f} s)", flush=True)
    services.close()

    gold = summarise(results["gold"])
    cats = list(CATEGORIES.values()) + ["overall"]
    print(f"\nLoCoMo dev, {len(files)} conversations, recall@8 through /query_memory ({time.monotonic() - started:.0f} s)")
    print(" | ".join([f"{'source':<28}"] + [f"{c:>11}" for c in cats] + [f"{'kept':>6}"]))
    print(" | ".join([f"{'gold observations imported':<28}"] + [f"{gold.get(c, float('nan')):>11.3f}" for c in cats] + [f"{1.0:>6.2f}"]))
    for mode in modes:
        got = summarise(results[mode])
        kept = got["overall"] / gold["overall"] if gold["overall"] else float("nan")
        label = f"raw turns, powerful {mode}"
        where = late[mode]
        tail = f" | late {statistics.fmean(v for _, v in where):.3f} over {len(where)} questions" if where else ""
        print(" | ".join([f"{label:<28}"] + [f"{got.get(c, float('nan')):>11.3f}" for c in cats] + [f"{kept:>6.2f}"]) + tail)
    print(
        "\nper conversation: gold observations about A (user) / B (character): offered to the model, reached facts.json; model calls per task"
    )
    for stem, row in results["per_conversation"].items():
        for mode in modes:
            r = row[mode]
            g, o, f = r["gold"], r["offered"], r["reached"]
            print(
                f"  {stem} powerful {mode}: A offered {o.get('a', 0)}/{g.get('a', 0)} reached {f.get('a', 0)}; "
                f"B offered {o.get('b', 0)}/{g.get('b', 0)} reached {f.get('b', 0)}; facts {r['facts']}; calls {r['calls']}"
            )
    if args.json:
        summary = {"gold": gold, **{m: summarise(results[m]) for m in modes}, "per_conversation": results["per_conversation"]}
        Path(args.json).write_text(json.dumps(summary, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
