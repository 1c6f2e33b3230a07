"""Scrubbing erased text out of the files that keep copies of it.

An erasure (a forgotten fact, reflection, persona entry or turn) names ids, and the texts
those ids carried. The layer's own view drops the id; this module removes the copies the
other files keep: edit history (``recent_edits.ndjson``), outbox payloads, journal events
(``stores.applied.SharedJournal.purge``), queued corrections, archive shards.

:func:`scrub_value` is the one rule, applied to any JSON value: a record (a JSON object)
whose text field (``text``, ``content``, ``old_text``, ``new_text``) equals an erased text,
white space around it aside, goes, and so does every object around it up to the nearest
list, which drops it (a stored turn ``{"type", "data": {"content"}}`` goes whole from the
window it is in); a bare string in a list goes when it equals one. So a window kept in the
edit history loses the erased turn and keeps the others, an outbox record keeps its other
messages, and a journal event about the record is changed (its caller drops it).
Equality, not containment: erasing the turn "ok" must not touch every text with "ok" in
it, and only text fields count: a persona entry that reads "master" does not match every
``"entity": "master"``. A text that merely quotes the erased one (a summary memo, a fact or
a reflection learned from it) is a memory of its own (see docs/OPERATIONS.md, "Forgetting").
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Any

import msgspec

from nekomem.stores.atomic import atomic_write_bytes, atomic_write_json, read_json

log = logging.getLogger(__name__)

_GONE = object()
# The fields that hold memory text in every record nekomem keeps (facts, reflections,
# persona entries, surfacing records, corrections, stored turns).
TEXT_KEYS = frozenset({"text", "content", "old_text", "new_text"})


def _hit(text: str, needles: Collection[str]) -> bool:
    return text.strip() in needles


def _scrub(value: Any, needles: Collection[str]) -> Any:
    if isinstance(value, str):
        return _GONE if _hit(value, needles) else value  # a bare string: in a list, or the whole value
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if isinstance(item, str):
                if key in TEXT_KEYS and _hit(item, needles):
                    return _GONE
                out[key] = item
                continue
            scrubbed = _scrub(item, needles)
            if scrubbed is _GONE:
                return _GONE  # a record inside this one held the text: this one goes with it
            out[key] = scrubbed
        return out
    if isinstance(value, list):
        return [s for s in (_scrub(item, needles) for item in value) if s is not _GONE]
    return value


def scrub_value(value: Any, needles: Collection[str]) -> tuple[Any, bool]:
    """``(value without the erased texts, whether anything went)``; ``None`` in place of a
    top-level value that went whole (see the module docstring)."""
    wanted = frozenset(n.strip() for n in needles if n.strip())
    if not wanted:
        return value, False
    scrubbed = _scrub(value, wanted)
    if scrubbed is _GONE:
        return None, True
    return scrubbed, scrubbed != value


def mentions(value: Any, needles: Collection[str]) -> bool:
    """True when a string anywhere in the JSON value equals one of ``needles``."""
    return scrub_value(value, needles)[1]


def scrub_ndjson_file(path: Path, needles: Collection[str]) -> int:
    """Rewrite the ndjson file at ``path`` (atomically) with every line scrubbed; a line
    that goes whole is dropped, an undecodable line too (it may hold anything). Returns
    the lines changed or dropped; a missing file is 0. Raises OSError."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return 0
    kept: list[bytes] = []
    changed = 0
    for raw in data.split(b"\n"):
        if not raw.strip():
            continue
        try:
            value = msgspec.json.decode(raw)
        except msgspec.DecodeError:
            changed += 1
            continue
        scrubbed, hit = scrub_value(value, needles)
        if not hit:
            kept.append(raw)
            continue
        changed += 1
        if scrubbed is not None:
            kept.append(msgspec.json.encode(scrubbed))
    if changed:
        atomic_write_bytes(path, b"".join(line + b"\n" for line in kept))
        log.info("%s: %d lines scrubbed", path.name, changed)
    return changed


def drop_from_shards(folder: Path, ids: Iterable[str]) -> int:
    """Remove the entries whose ``id`` is in ``ids`` from every archive shard (a JSON list)
    in ``folder``; returns how many went. Raises OSError."""
    wanted = set(ids)
    if not wanted or not folder.is_dir():
        return 0
    removed = 0
    for shard in sorted(folder.glob("*.json")):
        items, status = read_json(shard, default=[])
        if status != "ok" or not isinstance(items, list):
            continue
        kept = [e for e in items if not (isinstance(e, dict) and e.get("id") in wanted)]
        if len(kept) != len(items):
            removed += len(items) - len(kept)
            atomic_write_json(shard, kept)
    return removed
