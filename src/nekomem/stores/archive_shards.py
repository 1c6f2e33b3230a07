"""The archive shard files of a layer (``reflection_archive/``, ``persona_archive/``):
JSON lists named ``<day>_<suffix>.json`` (see :func:`nekomem.domain.records.assign_shards`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from nekomem.stores.atomic import atomic_write_json, read_json


def shard_counts(folder: Path) -> dict[str, int]:
    """Entries per shard file name in ``folder`` (empty when the folder does not exist; an
    unreadable or non-list shard counts 0)."""
    counts: dict[str, int] = {}
    if folder.exists():
        for path in folder.glob("*.json"):
            raw, _ = read_json(path, default=[])
            counts[path.name] = len(raw) if isinstance(raw, list) else 0
    return counts


def append_to_shard(path: Path, items: Iterable[object], key: Callable[[object], object]) -> None:
    """Append ``items`` (JSON-ready) to the shard at ``path``, skipping those whose
    ``key`` is already there, and rewrite it atomically. Raises OSError on write failure."""
    existing, _ = read_json(path, default=[])
    existing = existing if isinstance(existing, list) else []
    known = {key(e) for e in existing}
    existing.extend(item for item in items if key(item) not in known)
    atomic_write_json(path, existing)
