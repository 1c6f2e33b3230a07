"""Counts of a character's JSON views read from disk, for a character that is not active
(the memory browser's character list). Each reader answers 0 (or nothing) for a missing
or unreadable file: a count is a glance, never an error. The layers' declarations name
which of these count them (``LayerSpec.disk_counts``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec


def list_length(path: Path) -> int:
    """Items in a JSON list view; 0 when missing, unreadable or not a list."""
    try:
        raw = msgspec.json.decode(path.read_bytes())
    except (OSError, msgspec.DecodeError):
        return 0
    if isinstance(raw, list):
        return len(raw)
    return 0


def status_counts(path: Path) -> dict[str, int]:
    """Items of a JSON list view per ``status`` (``pending`` when an item has none)."""
    counts: dict[str, int] = {}
    try:
        raw = msgspec.json.decode(path.read_bytes())
    except (OSError, msgspec.DecodeError):
        return counts
    for item in raw if isinstance(raw, list) else []:
        if isinstance(item, dict):
            status = str(item.get("status", "pending"))
            counts[status] = counts.get(status, 0) + 1
    return counts


def section_entries(path: Path) -> int:
    """Entries of a sectioned view (``{"section": [..]}`` or ``{"section": {"facts": [..]}}``,
    the persona's shapes)."""
    try:
        raw = msgspec.json.decode(path.read_bytes())
    except (OSError, msgspec.DecodeError):
        return 0
    total = 0
    for section in raw.values() if isinstance(raw, dict) else []:
        facts = section.get("facts") if isinstance(section, dict) else section
        total += len(facts) if isinstance(facts, list) else 0
    return total


def archived_items(folder: Path) -> list[dict[str, Any]]:
    """Every item of the JSON list shards in ``folder`` (``*.json``), newest shard first,
    without its vector and marked ``status: archived``."""
    items: list[dict[str, Any]] = []
    if not folder.is_dir():
        return items
    for shard in sorted(folder.glob("*.json"), reverse=True):
        try:
            raw = msgspec.json.decode(shard.read_bytes())
        except (OSError, msgspec.DecodeError):
            continue
        for item in raw if isinstance(raw, list) else []:
            if isinstance(item, dict):
                item.pop("embedding", None)
                items.append({**item, "status": "archived"})
    return items
