"""Memory-browser routes that explain: the recall playground, the working context with
its token use per section, and the evidence history of a reflection."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Callable
from datetime import datetime
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from nekomem.actors.messages import EntryAnswer, ExplainAnswer, ExplainQuery, GetEntry, ListEntries
from nekomem.domain import render_longterm as rlt
from nekomem.domain.evidence import decayed
from nekomem.domain.layers import RECALL, REFLECTIONS
from nekomem.domain.locale import context as loc
from nekomem.domain.tokens import get_counter
from nekomem.domain.turns import parse_timestamp
from nekomem.http.bodies import character_name, read_json_object
from nekomem.http.conversation import context_language, display_now, master_name, new_dialog
from nekomem.http.errors import ApiError
from nekomem.http.readonly import character_exists
from nekomem.http.recall import _optional_str, checked_time
from nekomem.http.runtime_access import ask, runtime_of
from nekomem.runtime.reply import Reply
from nekomem.runtime.runtime import Runtime
from nekomem.stores.layout import CharacterPaths
from nekomem.wire.answers import PageAnswer, PublicEntry

log = logging.getLogger("nekomem.http.browse")

NOT_SEARCHABLE = ("denied", "archived", "merged", "promote_blocked")
# Points of the evidence curve between two events (the decay is smooth in between).
CURVE_SAMPLES = 160


# -- recall playground -------------------------------------------------------------------
def _reflections_page(offset: int, limit: int) -> Callable[[Reply], ListEntries]:
    """The message that lists one page of reflections (bound now: it is built in a loop)."""
    return lambda reply: ListEntries(offset=offset, limit=limit, reply=reply)


async def _excluded_reflections(rt: Runtime, name: str) -> list[dict[str, str]]:
    """Reflections the shared hard filter keeps out of the index, with the reason."""
    out: list[dict[str, str]] = []
    offset, limit = 0, rt.settings.server.api_page_max
    while True:
        page = await ask(rt, name, REFLECTIONS, _reflections_page(offset, limit), PageAnswer)
        for r in page.items:
            reason = ""
            if r.get("status") in NOT_SEARCHABLE:
                reason = f"status {r['status']}"
            elif r.get("suppress"):
                reason = "suppressed"
            elif isinstance(r.get("evidence_score"), (int, float)) and r["evidence_score"] < 0:
                reason = "negative evidence score"
            if reason:
                out.append({"id": r["id"], "tier": "reflection", "text": r.get("text", ""), "reason": reason})
        offset += limit
        if offset >= page.total:
            return out


async def recall_explain(request: Request) -> Response:
    """``POST /api/browse/{name}/recall_explain`` with ``{"query"?, "time"?}``: each leg
    with scores, the fused result and what the filters removed (422 when both are empty)."""
    rt = runtime_of(request)
    name = character_name(request)
    body = await read_json_object(request)
    query = _optional_str(body, "query")
    spec = checked_time(_optional_str(body, "time"), rt.settings.server)
    if not query and not spec:
        raise ApiError(422, "missing_query", "give a non-empty 'query', a 'time', or both")
    if not await character_exists(request, name):
        raise ApiError(404, "not_found", f"no character {name}")
    now = display_now(request)
    excluded = await _excluded_reflections(rt, name) if query else []
    answer = await ask(
        rt,
        name,
        RECALL,
        lambda reply: ExplainQuery(query=query, time=spec, now=now, excluded=excluded, reply=reply),
        ExplainAnswer,
    )
    return JSONResponse(answer.explanation)


# -- working context ---------------------------------------------------------------------
def split_sections(text: str, name: str, master: str, language: str = "en") -> list[tuple[str, str]]:
    """``text`` (a /new_dialog answer in ``language``) cut at its known headings into
    ``(section, text)`` pieces whose concatenation is ``text`` exactly. Sections: frame,
    persona, reflections, suppressed, recent."""
    markers: list[tuple[int, str]] = []
    head = loc.text(loc.PERSONA_HEADER, language, name=name)
    inner = text.find(loc.text(loc.INNER_THOUGHTS_HEADER, language, name=name).strip("\n"))
    head_at = text.find(head.strip("\n"))
    start = text.find("\n", head_at) + 1 if head_at >= 0 else 0
    longterm = text[:inner] if inner >= 0 else text

    def mark(heading: str, section: str) -> None:
        at = longterm.find(heading, start)
        if heading and at >= 0:
            markers.append((at, section))

    for entity in ("master", "neko", "relationship"):
        mark(rlt.persona_heading(entity, master, name, language), "persona")
    for heading in (
        rlt.pending_heading(name, language),
        rlt.confirmed_heading(name, language),
        rlt.past_block_open(master, name, language),
    ):
        mark(heading, "reflections")
    mark(rlt.suppressed_heading(name, language), "suppressed")
    if inner >= 0:
        # The blank lines before the heading belong to the recent section.
        markers.append((len(text[:inner].rstrip("\n")), "recent"))
    markers.sort()
    pieces: list[tuple[str, str]] = []
    cursor, current = 0, "frame"
    for at, section in markers:
        if at > cursor:
            pieces.append((current, text[cursor:at]))
        cursor, current = max(cursor, at), section
    pieces.append((current, text[cursor:]))
    return pieces


async def context_sections(request: Request) -> Response:
    """``GET /api/browse/{name}/context``: the exact /new_dialog text and, per section,
    its text, its tokens and its budget (null where the section has none)."""
    rt = runtime_of(request)
    name = character_name(request)
    response = await new_dialog(request)  # "" for an unknown character, which it does not create
    text = bytes(response.body).decode("utf-8")
    counter = get_counter(rt.settings.recent.recent_tokenizer_encoding)
    lt = rt.settings.longterm
    budgets = {
        "persona": lt.persona_render_max_tokens,
        "reflections": lt.reflection_render_max_tokens,
        "recent": rt.settings.recent.recent_hard_cap_tokens,
    }
    merged: dict[str, str] = {}
    order: list[str] = []
    for section, piece in split_sections(text, name, master_name(request), context_language(request)):
        if section not in merged:
            order.append(section)
        merged[section] = merged.get(section, "") + piece
    sections = [
        {"section": s, "text": merged[s], "tokens": await asyncio.to_thread(counter.count, merged[s]), "budget": budgets.get(s)}
        for s in order
    ]
    total = await asyncio.to_thread(counter.count, text)
    return JSONResponse({"text": text, "tokens": total, "encoding": rt.settings.recent.recent_tokenizer_encoding, "sections": sections})


# -- evidence history --------------------------------------------------------------------
class _Snap(msgspec.Struct, frozen=True):
    at: datetime
    type: str
    status: str
    reinforcement: float
    disputation: float
    rein_last_signal_at: str | None
    disp_last_signal_at: str | None


def _journal_snapshots(paths: CharacterPaths, reflection_id: str) -> tuple[list[_Snap], str | None]:
    """Every journaled state of one reflection (oldest first) and the journal's oldest
    event time: the history reaches back to the journal's last compaction."""
    snaps: list[_Snap] = []
    oldest: str | None = None
    try:
        data = paths.events.read_bytes()
    except FileNotFoundError:
        return snaps, None
    decoder = msgspec.json.Decoder()
    for line in data.splitlines():
        try:
            event = decoder.decode(line)
        except msgspec.DecodeError:
            continue  # a torn tail or a corrupt line
        if not isinstance(event, dict):
            continue
        oldest = oldest or event.get("ts")
        ref = (event.get("payload") or {}).get("reflection")
        if not isinstance(ref, dict) or ref.get("id") != reflection_id:
            continue
        try:
            snaps.append(_snap(event["ts"], event.get("type", ""), ref))
        except (KeyError, TypeError, ValueError):
            continue
    return snaps, oldest


def _snap(ts: str, type: str, ref: PublicEntry) -> _Snap:
    return _Snap(
        at=parse_timestamp(ts),
        type=type,
        status=str(ref.get("status", "")),
        reinforcement=float(ref.get("reinforcement") or 0.0),
        disputation=float(ref.get("disputation") or 0.0),
        rein_last_signal_at=ref.get("rein_last_signal_at"),
        disp_last_signal_at=ref.get("disp_last_signal_at"),
    )


def evidence_curve(snaps: list[_Snap], start: datetime, end: datetime, rein_half: float, disp_half: float) -> list[dict[str, Any]]:
    """Decayed reinforcement, disputation and net score from ``start`` to ``end``: even
    samples plus a point just before and at each snapshot, so the jumps are vertical."""
    times = [start + (end - start) * (i / CURVE_SAMPLES) for i in range(CURVE_SAMPLES + 1)]
    for snap in snaps:
        if start <= snap.at <= end:
            times.append(snap.at)
    times = sorted(set(times))
    points: list[dict[str, Any]] = []
    j = -1
    for t in times:
        before = j
        while j + 1 < len(snaps) and snaps[j + 1].at <= t:
            j += 1
        if j != before and before >= 0:
            points.append(_point(snaps[before], t, rein_half, disp_half))  # the value just before the jump
        if j >= 0:
            points.append(_point(snaps[j], t, rein_half, disp_half))
    return points


def _point(snap: _Snap, t: datetime, rein_half: float, disp_half: float) -> dict[str, Any]:
    rein = decayed(snap.reinforcement, snap.rein_last_signal_at, t, rein_half)
    disp = decayed(snap.disputation, snap.disp_last_signal_at, t, disp_half)
    return {"t": t.isoformat(), "reinforcement": round(rein, 4), "disputation": round(disp, 4), "net": round(rein - disp, 4)}


async def evidence_history(request: Request) -> Response:
    """``GET /api/browse/{name}/reflections/{id}/evidence``: the reflection, its journaled
    evidence changes, its decayed curve up to now and the tier thresholds."""
    rt = runtime_of(request)
    name = character_name(request)
    rid = request.path_params["reflection_id"]
    if not await character_exists(request, name):
        raise ApiError(404, "not_found", f"no character {name}")
    current = (await ask(rt, name, REFLECTIONS, lambda reply: GetEntry(id=rid, reply=reply), EntryAnswer)).entry
    paths = rt.character_paths(name)
    snaps, oldest = await asyncio.to_thread(_journal_snapshots, paths, rid)
    now = rt.clock.now()
    snaps.append(_snap(now.isoformat(), "now", current))
    lt = rt.settings.longterm
    start = snaps[0].at
    created = current.get("created_at")
    if created:
        try:
            start = min(start, parse_timestamp(created))
        except ValueError:
            pass
    curve = evidence_curve(snaps, start, now, lt.evidence_rein_half_life_days, lt.evidence_disp_half_life_days)
    score = current.get("evidence_score")
    return JSONResponse(
        {
            "reflection": current,
            "events": [
                {
                    "t": s.at.isoformat(),
                    "type": s.type,
                    "status": s.status,
                    "reinforcement": s.reinforcement,
                    "disputation": s.disputation,
                    "net": _point(s, s.at, lt.evidence_rein_half_life_days, lt.evidence_disp_half_life_days)["net"],
                }
                for s in snaps[:-1]
            ],
            "curve": curve,
            "thresholds": {
                "confirm": lt.evidence_confirm_threshold,
                "promote": lt.evidence_promote_threshold,
                "archive": lt.evidence_archive_threshold,
            },
            "net_now": score if isinstance(score, (int, float)) and math.isfinite(score) else None,
            "history_since": oldest,
        }
    )
