"""Renaming a character and merging one into another: an operator's repair of a mistyped
name. Both work on *quiet* folders (no actor writing them: the server holds both
characters stopped, or no server runs and the caller holds the memory root exclusively).

- :func:`rename_character` moves the folder (no file names the character: its memory
  text may, and stays as it is) and notes the former name in ``origin.json``.
- :func:`merge_characters` makes one folder of two through the portable document of
  :mod:`nekomem.stores.snapshot`, then removes the source:

  * the journal: every row of both, ordered by time (then by source), numbered anew;
    the post-turn cursor stops before the first row either side had not handed on yet
    (that work is enqueued again at load; the outbox drops ranges it holds and dedup
    absorbs repeats), the fact backlog covers the rows either side had not mined;
  * facts, reflections, their archives, surfaced marks and the contradiction queue:
    both sides' entries (an id, or a fact's text hash, already present is kept once); persona: both sides'
    entries per entity, an entry whose text the target already holds kept once;
  * the recent window: both windows' items in time order (the window is compressed
    by the next write as usual); ``recent_meta.json`` of the target, covering every row;
  * the outbox: both sides' records, their row ranges mapped to the new numbers;
  * the event journal is left out: the views already hold every applied event (a
    quiet folder has applied them all), as after a compaction;
  * other small files (settings, cursors of passes) are the target's, else the source's;
    ``origin.json`` is the target's with the merge noted.

  Vectors travel inside the entries; the recall index is rebuilt when the merged
  character next activates.
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path
from typing import Any

import msgspec

from nekomem.domain.post_turn import POST_TURN_CURSOR
from nekomem.stores.atomic import TEMP_PREFIX, fsync_dir
from nekomem.stores.fact_backlog import BACKLOG_FROM, BACKLOG_ROWS_KEY, BACKLOG_TO
from nekomem.stores.layout import (
    DEFAULT_NAME_MAX_LENGTH,
    DEFAULT_NAME_MAX_UNITS,
    EVENTS_APPLIED_FILE,
    EVENTS_FILE,
    OUTBOX_FILE,
    PERSONA_FILE,
    RECENT_FILE,
    RECENT_META_FILE,
    is_neko_folder,
)
from nekomem.stores.origin import ORIGIN_FILE, CharacterOrigin, Merged, Renamed, read_origin, write_origin
from nekomem.stores.snapshot import read_character
from nekomem.stores.snapshot_check import check_character
from nekomem.stores.snapshot_write import write_characters


class MoveError(ValueError):
    """A rename or merge that cannot be done; ``code`` is the machine-readable reason
    (``unknown_character``, ``character_exists``, ``same_character``, ``neko_folder``)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _unknown_origin() -> CharacterOrigin:
    """The origin of a folder from before origins were recorded."""
    return CharacterOrigin(created_at="", route="", client="")


def rename_character(old: Path, new: Path, now: str) -> None:
    """Move the quiet character folder ``old`` to ``new`` (a folder that must not hold a
    character; on a case-folding disk it may be ``old`` itself spelt otherwise) and note
    the former name. Raises MoveError and OSError."""
    if not old.is_dir():
        raise MoveError("unknown_character", f"no character {old.name}")
    same = new.exists() and old.samefile(new)
    if new.is_dir() and not same and not any(new.iterdir()):
        new.rmdir()  # an empty folder left behind holds nothing to keep
    if new.exists() and not same:
        raise MoveError("character_exists", f"{new.name} already exists: merge into it instead")
    new.parent.mkdir(parents=True, exist_ok=True)
    old.rename(new)
    fsync_dir(new.parent)
    origin = read_origin(new) or _unknown_origin()
    write_origin(new, msgspec.structs.replace(origin, renamed_from=[*origin.renamed_from, Renamed(name=old.name, at=now)]))


# -- merging -------------------------------------------------------------------------------
def _keys(item: Any) -> set[tuple[str, Any]]:
    """What makes two entries the same: the id, and a fact's text hash."""
    if not isinstance(item, dict):
        return set()
    return {(k, item[k]) for k in ("id", "hash") if item.get(k) is not None}


def _union(into: list[Any], extra: list[Any]) -> list[Any]:
    """``into`` then the items of ``extra`` whose id (or text hash) is not there yet."""
    seen = set().union(*(_keys(item) for item in into)) if into else set()
    out = list(into)
    for item in extra:
        keys = _keys(item)
        if keys & seen:
            continue
        out.append(item)
        seen |= keys
    return out


def _persona(into: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(into)
    for entity, section in extra.items():
        mine = out.get(entity)
        if not isinstance(section, dict) or not isinstance(mine, dict):
            out.setdefault(entity, section)
            continue
        have = [e for e in mine.get("facts", []) if isinstance(e, dict)]
        texts = {e.get("text") for e in have}
        added = [e for e in section.get("facts", []) if isinstance(e, dict) and e.get("text") not in texts]
        out[entity] = {**mine, "facts": _union(have, added)}
    return out


def _window_time(item: Any) -> str:
    data = item.get("data") if isinstance(item, dict) else None
    extra = data.get("additional_kwargs") if isinstance(data, dict) else None
    stamp = extra.get("timestamp") if isinstance(extra, dict) else None
    return stamp if isinstance(stamp, str) else ""


def _journal(into: dict[str, Any], source: dict[str, Any]) -> tuple[dict[str, Any], list[dict[int, int]]]:
    """The merged journal and, per side, the map old row id -> new row id."""
    tagged = [(str(r.get("timestamp") or ""), side, r["id"], r) for side, j in enumerate((into, source)) for r in j.get("rows", [])]
    tagged.sort(key=lambda t: (t[0], t[1], t[2]))
    maps: list[dict[int, int]] = [{}, {}]
    rows = []
    for new_id, (_, side, old_id, row) in enumerate(tagged, start=1):
        maps[side][old_id] = new_id
        rows.append({**row, "id": new_id})
    top = len(rows)

    def after(side: int, cursor: str, default: int) -> list[int]:
        """New ids of the side's rows after its cursor (all rows when it has none)."""
        mark = (into, source)[side].get("cursors", {}).get(cursor, default)
        return [new for old, new in maps[side].items() if old > mark]

    pending = after(0, POST_TURN_CURSOR, 0) + after(1, POST_TURN_CURSOR, 0)
    cursors: dict[str, int] = {POST_TURN_CURSOR: (min(pending) - 1) if pending else top}
    backlog: list[int] = []
    for side, j in enumerate((into, source)):
        marks = j.get("cursors", {})
        lo, hi = marks.get(BACKLOG_FROM), marks.get(BACKLOG_TO)
        if isinstance(lo, int) and isinstance(hi, int):
            backlog += [new for old, new in maps[side].items() if lo < old <= hi]
    if backlog:
        cursors[BACKLOG_FROM], cursors[BACKLOG_TO] = min(backlog) - 1, max(backlog)
    return {"rows": rows, "cursors": cursors, "sequence": top}, maps


def _outbox(lines: list[Any], id_map: dict[int, int]) -> list[Any]:
    """Outbox lines with their row ranges in the new numbering."""

    def mapped(pair: Any) -> Any:
        if isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, int) for x in pair):
            ids = [new for old, new in id_map.items() if pair[0] <= old <= pair[1]]
            return [min(ids), max(ids)] if ids else pair
        return pair

    out = []
    for line in lines:
        payload = line.get("payload") if isinstance(line, dict) else None
        if isinstance(payload, dict):
            payload = {**payload}
            for key in ("rows", BACKLOG_ROWS_KEY):
                if key in payload:
                    payload[key] = mapped(payload[key])
            line = {**line, "payload": payload}
        out.append(line)
    return out


def merge_documents(into: dict[str, Any], source: dict[str, Any], now: str) -> dict[str, Any]:
    """The document of ``source`` merged into ``into`` (see the module docstring)."""
    journal, maps = _journal(into["journal"], source["journal"])
    files: dict[str, Any] = {}
    mine, theirs = into["files"], source["files"]
    for rel in sorted(set(mine) | set(theirs)):
        if rel in (EVENTS_APPLIED_FILE, ORIGIN_FILE):
            continue
        a, b = mine.get(rel), theirs.get(rel)
        if a is None or b is None:
            files[rel] = a if a is not None else b
        elif rel == PERSONA_FILE and isinstance(a, dict) and isinstance(b, dict):
            files[rel] = _persona(a, b)
        elif rel == RECENT_FILE and isinstance(a, list) and isinstance(b, list):
            files[rel] = sorted([*a, *b], key=_window_time)  # stable: memos without a time first
        elif isinstance(a, list) and isinstance(b, list):
            files[rel] = _union(a, b)
        else:
            files[rel] = a
    if isinstance(files.get(RECENT_META_FILE), dict):
        files[RECENT_META_FILE] = {**files[RECENT_META_FILE], "journal_row": journal["sequence"]}
    logs: dict[str, Any] = {}
    for rel in sorted(set(into["logs"]) | set(source["logs"])):
        if rel == EVENTS_FILE:
            continue
        if rel == OUTBOX_FILE:
            logs[rel] = _outbox(into["logs"].get(rel, []), maps[0]) + _outbox(source["logs"].get(rel, []), maps[1])
        else:
            logs[rel] = [*into["logs"].get(rel, []), *source["logs"].get(rel, [])]
    return {**into, "files": files, "logs": logs, "journal": journal}


def merge_characters(source: Path, target: Path, now: str) -> int:
    """Merge the quiet character folder ``source`` into ``target`` (both must exist and
    differ), then remove ``source``. Returns the number of journal rows of the result.
    Raises MoveError, OSError and sqlite3.Error. The merged folder is written aside and
    swapped in (the old target moved aside with it, under one folder the character
    listing ignores), so a failure before the swap leaves both characters as they were;
    after it, the source is removed last."""
    if not source.is_dir():
        raise MoveError("unknown_character", f"no character {source.name}")
    if not target.is_dir():
        raise MoveError("unknown_character", f"no character {target.name}: rename instead")
    if source.samefile(target):
        raise MoveError("same_character", "a character cannot be merged into itself")
    if is_neko_folder(target.parent):
        # There each folder also holds the reference's own files, which N.E.K.O. manages.
        raise MoveError("neko_folder", "characters in a N.E.K.O. memory folder are renamed and deleted in N.E.K.O.; merging is not offered")
    merged = merge_documents(read_character(target), read_character(source), now)
    origin = read_origin(target) or _unknown_origin()
    noted = msgspec.structs.replace(origin, merged_from=[*origin.merged_from, Merged(name=source.name, at=now, origin=read_origin(source))])
    aside = target.parent / f"{TEMP_PREFIX}-merge-{uuid.uuid4().hex[:12]}"
    aside.mkdir()
    try:
        # Own data, checked as an import is (depth bounded generously: the views are shallow).
        checked = check_character(
            {**merged, "name": target.name},
            where=target.name,
            max_depth=256,
            name_max_length=DEFAULT_NAME_MAX_LENGTH,
            name_max_units=DEFAULT_NAME_MAX_UNITS,
        )
        (folder,) = write_characters([checked], lambda _name: aside / "new", replace=False)
        write_origin(folder, noted)
        (aside / "old").mkdir()
        target.rename(aside / "old" / target.name)
        folder.rename(target)
        fsync_dir(target.parent)
        shutil.rmtree(source)
    finally:
        shutil.rmtree(aside, ignore_errors=True)
    return int(merged["journal"]["sequence"])
