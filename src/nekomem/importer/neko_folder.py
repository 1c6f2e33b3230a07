"""Serving N.E.K.O.'s own memory folder in place (``<data dir>/memory/``).

N.E.K.O.'s main process works on ``memory/<name>/`` itself: it renames and deletes
character folders, its memory browser rewrites ``recent.json``, its cloud save copies the
folder and its card-forge and facts-sync read ``facts.json``. So nekomem serves that folder
(see :mod:`nekomem.stores.layout`): nekomem's own files of a character live in
``<name>/.nekomem/`` and move with the folder, ``recent.json`` is shared, and every other
file the reference reads is kept in the reference's format beside them (the *mirror*,
written by :func:`mirror_views` and :func:`mirror_journal` with the conversions of
:mod:`nekomem.importer.neko_export`). The rules followed are in ``docs/NEKO-FILES.md``.

:func:`adopt` turns a reference folder into one nekomem serves: one idempotent step, run
at start and at ``/reload``. For each character folder not adopted yet it copies every
reference file into ``.nekomem/reference-backup/`` (once: a re-run keeps the first copy),
imports the folder into ``.nekomem/`` with the importer (which merges, so a re-run adds
nothing) and marks it adopted. A folder whose mirrored files were changed by someone else
since nekomem wrote them (the reference's memory server ran on it meanwhile) is imported
again the same way, so what that server added is kept.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sqlite3
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import msgspec

from nekomem.config import Settings
from nekomem.domain.layers import FACTS, PERSONA, REFLECTIONS
from nekomem.importer import neko_source as src
from nekomem.importer.neko import run_import
from nekomem.importer.neko_export import ExportError, LocalTimes, reference_file_records, write_reference_journal
from nekomem.importer.neko_source import SourceCharacter, SourceError, TimeLocalizer
from nekomem.importer.report import ImportReport
from nekomem.stores.atomic import atomic_write_bytes, atomic_write_json, read_json
from nekomem.stores.layout import (
    ADOPTED_FILE,
    MIRROR_FILE,
    NEKO_FOLDER_MARKER,
    STATE_DIR,
    CharacterPaths,
    forget_neko_folder,
    is_neko_folder,
)

log = logging.getLogger("nekomem.neko_folder")

BACKUP_DIR = "reference-backup"
# The reference's files each owner's view flush rewrites (besides nekomem's own view).
OWNER_FILES: dict[str, tuple[str, ...]] = {
    FACTS: (src.FACTS, src.FACTS_ARCHIVE),
    REFLECTIONS: (src.REFLECTIONS, src.SURFACED, src.REFLECTION_ARCHIVE),
    PERSONA: (src.PERSONA, src.PERSONA_CORRECTIONS),
}
_JOURNAL_FILES = (src.TIME_INDEX, src.RECENT_META, src.CURSORS, "theater_retractions.json")


class Adoption(msgspec.Struct, kw_only=True):
    """What :func:`adopt` did: characters imported first, imported again, left as they were."""

    root: str
    adopted: list[str] = msgspec.field(default_factory=list)
    refreshed: list[str] = msgspec.field(default_factory=list)
    unchanged: list[str] = msgspec.field(default_factory=list)
    problems: list[str] = msgspec.field(default_factory=list)


def mark(root: Path) -> None:
    """Mark ``root`` as a N.E.K.O. memory folder (idempotent). Raises OSError."""
    marker = root / NEKO_FOLDER_MARKER
    if not marker.exists():
        root.mkdir(parents=True, exist_ok=True)
        atomic_write_json(marker, {"version": 1, "layout": f"<name>/{STATE_DIR}/ holds nekomem's files; see docs/NEKO-FILES.md"})
    forget_neko_folder()


def _identity(path: Path) -> list[int] | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return [st.st_size, st.st_mtime_ns]


def _mirrored_names(home: Path) -> list[str]:
    """The reference files of a character folder that the mirror writes (and watches)."""
    names = [n for group in OWNER_FILES.values() for n in group if n != src.REFLECTION_ARCHIVE]
    names += list(_JOURNAL_FILES)
    shards = home / src.REFLECTION_ARCHIVE
    if shards.is_dir():
        names += [f"{src.REFLECTION_ARCHIVE}/{p.name}" for p in sorted(shards.glob("*.json"))]
    return names


def _remember(home: Path, names: Iterable[str]) -> None:
    """Record the identity of mirrored files just written (in ``.nekomem/mirror.json``)."""
    state = home / STATE_DIR / MIRROR_FILE
    raw, _ = read_json(state, default={})
    known: dict[str, Any] = raw if isinstance(raw, dict) else {}
    for name in names:
        known[name] = _identity(home / name)
    atomic_write_json(state, known, durable=False)


def _changed_outside(home: Path) -> list[str]:
    """Mirrored files whose identity is not the one nekomem recorded (someone else wrote)."""
    raw, status = read_json(home / STATE_DIR / MIRROR_FILE, default={})
    known: dict[str, Any] = raw if isinstance(raw, dict) else {}
    changed = []
    for name in _mirrored_names(home):
        now = _identity(home / name)
        if now is not None and known.get(name) != now:
            changed.append(name)  # written since (or created: recorded as absent, or never seen)
    return changed


def _backup(home: Path) -> None:
    """Copy every reference file of ``home`` into ``.nekomem/reference-backup/`` unless a
    backup exists already (the first one is what the user had before nekomem)."""
    target = home / STATE_DIR / BACKUP_DIR
    if target.exists():
        return
    staging = home / STATE_DIR / (BACKUP_DIR + ".partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    for entry in home.iterdir():
        if entry.name == STATE_DIR or entry.name.startswith(".nkatmp"):
            continue
        if entry.is_dir():
            shutil.copytree(entry, staging / entry.name)
        else:
            shutil.copy2(entry, staging / entry.name)
    os.replace(staging, target)


def serves_neko_folder(settings: Settings) -> bool:
    """Whether the configured memory root is a N.E.K.O. memory folder to serve in place:
    the ``memory/`` of the configured N.E.K.O. data directory, or a folder already marked."""
    root = Path(settings.server.memory_root).expanduser().resolve()
    data_dir = settings.server.neko_data_dir.strip()
    if data_dir and root == (Path(data_dir).expanduser() / "memory").resolve():
        return True
    return is_neko_folder(root)


def adopt(root: Path, settings: Settings, only: list[str] | None = None) -> Adoption:
    """Make ``root`` (a reference memory folder) one nekomem serves; see the module.

    The caller must keep the characters' actors away meanwhile (at start nothing runs; at
    ``/reload`` they are released first). Raises OSError when the folder cannot be written
    and SourceError for a bad ``import_source_timezone``.
    """
    root = Path(root)
    mark(root)
    report = Adoption(root=str(root))
    localizer = TimeLocalizer(settings.importer.import_source_timezone)
    for entry in sorted(root.iterdir()) if root.is_dir() else []:
        name = entry.name
        if not entry.is_dir() or name.startswith((".nkatmp", STATE_DIR)) or (only is not None and name not in only):
            continue
        state = entry / STATE_DIR
        adopted = (state / ADOPTED_FILE).is_file()
        if adopted:
            outside = _changed_outside(entry)
            if not outside:
                report.unchanged.append(name)
                continue
            log.info("a character's reference files were changed outside nekomem (%d files); importing them again", len(outside))
        elif not src.is_character_folder(entry):
            continue
        try:
            _import_one(root, name, entry, settings, localizer, report)
        except (OSError, sqlite3.Error, SourceError) as exc:
            report.problems.append(f"{name}: {type(exc).__name__}: {exc}")
            log.warning("adopting a character folder failed: %s", type(exc).__name__)
            continue
        (report.refreshed if adopted else report.adopted).append(name)
    return report


def _import_one(root: Path, name: str, home: Path, settings: Settings, localizer: TimeLocalizer, report: Adoption) -> None:
    state = home / STATE_DIR
    state.mkdir(exist_ok=True)
    _backup(home)
    imported = ImportReport(source_dir=str(home), memory_root=str(root))
    source = SourceCharacter(name, home, localizer, imported.problems)
    run_import(imported, [source], settings)
    report.problems += [f"{name}: {p.layer} {p.file}: {p.reason}" for p in imported.problems]
    paths = CharacterPaths(root, name, max_length=settings.server.name_max_length, max_units=settings.server.name_max_units)
    zone = settings.importer.import_source_timezone
    mirror_views(paths, zone, [n for group in OWNER_FILES.values() for n in group])
    mirror_journal(paths, zone)
    # Every reference file as it now is (also those nekomem keeps no view of, such as a
    # torn one it could not import): a later change by someone else is what counts.
    _remember(home, _mirrored_names(home))
    atomic_write_json(state / ADOPTED_FILE, {"source": "reference", "characters_imported": len(imported.characters)})


def mirror_views(paths: CharacterPaths, zone: str, names: Iterable[str]) -> None:
    """Write the reference files ``names`` (facts.json, reflections.json, ...) of a
    character from nekomem's views, in the reference's format. A no-op outside a N.E.K.O.
    memory folder. Raises OSError (ExportError for a bad zone)."""
    if not paths.neko_folder:
        return
    times = LocalTimes(zone)
    written: list[str] = []
    for name in names:
        if name == src.REFLECTION_ARCHIVE:
            shards = paths.folder / src.REFLECTION_ARCHIVE
            kept = set()
            for path in sorted(shards.glob("*.json")) if shards.is_dir() else []:
                raw, status = read_json(path, default=None)
                if status == "ok" and isinstance(raw, list):
                    rel = f"{src.REFLECTION_ARCHIVE}/{path.name}"
                    _write_json(paths.home / rel, reference_file_records(src.REFLECTION_ARCHIVE, raw, times))
                    written.append(rel)
                    kept.add(path.name)
            mirror_dir = paths.home / src.REFLECTION_ARCHIVE
            for stale in sorted(mirror_dir.glob("*.json")) if mirror_dir.is_dir() else []:
                if stale.name not in kept:
                    stale.unlink()  # a shard nekomem dropped (erasure) goes from the mirror too
            continue
        raw, status = read_json(paths.folder / name, default=None)
        if status != "ok" or raw is None:
            continue
        _write_json(paths.home / name, reference_file_records(name, raw, times))
        written.append(name)
    if written:
        _remember(paths.home, written)


def mirror_journal(paths: CharacterPaths, zone: str) -> None:
    """Write ``time_indexed.db``, ``recent_meta.json``, ``cursors.json`` and
    ``theater_retractions.json`` of a character in the reference's format from nekomem's
    (the journal whole, into a temporary file renamed over the old one, so a copy taken
    meanwhile is never torn and an erased turn is gone from it). A no-op outside a
    N.E.K.O. memory folder. Raises OSError and sqlite3.Error."""
    if not paths.neko_folder or not paths.time_index_db.exists():
        return
    times = LocalTimes(zone)
    target = paths.home / src.TIME_INDEX
    temp = paths.home / (".nkatmp-" + src.TIME_INDEX)
    temp.unlink(missing_ok=True)
    write_reference_journal(paths.time_index_db, temp, times)
    for suffix in ("-wal", "-shm", "-journal"):
        Path(str(target) + suffix).unlink(missing_ok=True)
    os.replace(temp, target)
    written = [src.TIME_INDEX]
    meta, _ = read_json(paths.recent_meta, default={})
    if isinstance(meta, dict) and meta.get("last_past_block_update_at"):
        _write_json(paths.home / src.RECENT_META, {"last_past_block_update_at": times.json_text(meta["last_past_block_update_at"])})
        written.append(src.RECENT_META)
    cursors, status = read_json(paths.cursors, default=None)
    if status == "ok" and isinstance(cursors, dict):
        _write_json(paths.home / src.CURSORS, {k: times.json_text(v) for k, v in cursors.items()})
        written.append(src.CURSORS)
    retractions = paths.folder / "theater_retractions.json"
    if retractions.is_file():
        shutil.copyfile(retractions, paths.home / "theater_retractions.json")
        written.append("theater_retractions.json")
    _remember(paths.home, written)


def _write_json(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(path, json.dumps(value, ensure_ascii=False, indent=1).encode("utf-8") + b"\n")


__all__ = ["Adoption", "ExportError", "adopt", "is_neko_folder", "mark", "mirror_journal", "mirror_views", "serves_neko_folder"]
