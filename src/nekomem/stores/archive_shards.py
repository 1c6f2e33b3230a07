"""The archive shard files of a layer (``reflection_archive/``, ``persona_archive/``):
JSON lists named ``<day>_<suffix>.json`` (see :func:`nekomem.domain.records.assign_shards`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path

from nekomem.stores.atomic import atomic_write_json, read_json


def append_to_shard(path: Path, items: Iterable[object], key: Callable[[object], object]) -> None:
    """Append ``items`` (JSON-ready) to the shard at ``path``, skipping those whose
    ``key`` is already there, and rewrite it atomically. Raises OSError on write failure."""
    existing, _ = read_json(path, default=[])
    existing = existing if isinstance(existing, list) else []
    known = {key(e) for e in existing}
    existing.extend(item for item in items if key(item) not in known)
    atomic_write_json(path, existing)
