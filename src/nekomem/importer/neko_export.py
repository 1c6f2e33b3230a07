"""``nekomem export-neko``: write a memory root back out as a reference (N.E.K.O.) memory folder.

nekomem keeps times offset-aware (the journal in UTC, ``+00:00``); the reference writes
and compares naive local times, so it cannot read nekomem's files in place. The export
writes, per character, the files the reference reads
(``/work/shared/reference/neko-ondisk.md``), with every time in the reference's forms:

- ``time_indexed.db``: ``time_indexed_original`` and ``time_indexed_compressed`` with the
  reference's columns; ``timestamp`` as naive local ``YYYY-MM-DD HH:MM:SS.ffffff`` (the
  SQLAlchemy form), NULL stays NULL; each message without nekomem's own
  ``additional_kwargs.timestamp`` annotation (``metadata`` is kept);
- ``recent.json`` (same annotation removed), ``recent_meta.json``
  (``last_past_block_update_at``);
- ``facts.json``, ``facts_archive.json``, ``reflections.json``, ``reflection_archive/*.json``,
  ``surfaced.json``, ``persona.json``, ``persona_corrections.json``, ``cursors.json``:
  every ``*_at`` time, ``recent_mentions`` and ``version_history`` time as naive local
  ISO (``YYYY-MM-DDTHH:MM:SS.ffffff``); cached embeddings are dropped (they belong to
  nekomem's model: the reference re-embeds); fields that ``import-neko`` parked under a
  fact's ``source_ref.neko`` go back to their places (``neko_source`` back to ``source``);
- ``theater_retractions.json`` as it is (same file, same shape, epoch-second stamps).

"Local" is the zone given (``--timezone``, default the ``import_source_timezone``
setting, empty meaning this machine's zone), so export and import are inverses. nekomem's
own bookkeeping (outbox, event journal, sidecars) is not exported: the reference starts
with none of its own. A target character folder that already holds files is refused,
never overwritten.
"""

from __future__ import annotations

import json
import shutil
import sqlite3
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from nekomem.domain.turns import parse_iso
from nekomem.importer import neko_source as names
from nekomem.stores.atomic import atomic_write_json, read_json
from nekomem.stores.layout import CharacterPaths, list_characters
from nekomem.stores.timeindex_read import ORIGINAL_TABLE

_EMBEDDING = ("embedding", "embedding_text_sha256", "embedding_model_id")
_DB_FORMAT = "%Y-%m-%d %H:%M:%S.%f"
_JSON_LAYERS = (names.FACTS, names.FACTS_ARCHIVE, names.REFLECTIONS, names.SURFACED, names.PERSONA_CORRECTIONS)
_COMPRESSED = "time_indexed_compressed"


class ExportError(ValueError):
    """The export cannot run (bad zone, a target folder that already holds files, ...)."""


class LocalTimes:
    """Converts offset-aware ISO times into the reference's naive local forms."""

    def __init__(self, zone: str = "") -> None:
        try:
            self.zone = ZoneInfo(zone) if zone else None
        except (ZoneInfoNotFoundError, ValueError):
            raise ExportError(f"unknown time zone {zone!r}") from None

    def moment(self, value: object) -> datetime | None:
        """The naive local datetime of an ISO time (a naive one is taken as already local)."""
        if not isinstance(value, str):
            return None
        parsed = parse_iso(value.strip().replace(" ", "T", 1), naive_tz=None)
        if parsed is None or parsed.tzinfo is None:
            return parsed
        local = parsed.astimezone(self.zone) if self.zone is not None else parsed.astimezone()
        return local.replace(tzinfo=None)

    def json_text(self, value: object) -> object:
        moment = self.moment(value)
        return moment.isoformat(timespec="microseconds") if moment is not None else value

    def db_text(self, value: object) -> str | None:
        moment = self.moment(value)
        return moment.strftime(_DB_FORMAT) if moment is not None else None

    def record(self, raw: Any) -> Any:
        """A JSON value with every ``*_at`` / ``recent_mentions`` time localized, recursively."""
        if isinstance(raw, list):
            return [self.record(v) for v in raw]
        if not isinstance(raw, dict):
            return raw
        out: dict[str, Any] = {}
        for key, value in raw.items():
            if key.endswith("_at") and isinstance(value, str):
                out[key] = self.json_text(value)
            elif key == "recent_mentions" and isinstance(value, list):
                out[key] = [self.json_text(v) for v in value]
            else:
                out[key] = self.record(value)
        return out


def _reference_record(raw: Any) -> Any:
    """A nekomem record in the reference's shape: embeddings dropped, import passthrough restored."""
    if not isinstance(raw, dict):
        return raw
    out = {k: v for k, v in raw.items() if k not in _EMBEDDING}
    for key in _EMBEDDING:
        if key in raw:
            out[key] = None
    ref = out.get("source_ref")
    if isinstance(ref, dict) and isinstance(ref.get("neko"), dict) and set(ref) == {"neko"}:
        parked = dict(ref["neko"])
        del out["source_ref"]
        if "neko_source" in parked:
            out["source"] = parked.pop("neko_source")
        out.update({k: v for k, v in parked.items() if k not in out})
    return out


def reference_message(message: Any) -> Any:
    """A stored message without nekomem's ``additional_kwargs.timestamp`` annotation."""
    if not isinstance(message, dict) or not isinstance(message.get("data"), dict):
        return message
    data = dict(message["data"])
    kwargs = data.get("additional_kwargs")
    if isinstance(kwargs, dict) and "timestamp" in kwargs:
        kwargs = {k: v for k, v in kwargs.items() if k != "timestamp"}
        if kwargs:
            data["additional_kwargs"] = kwargs
        else:
            data.pop("additional_kwargs")
    return {**message, "data": data}


def reference_file_records(name: str, raw: Any, times: LocalTimes) -> Any:
    """The content of reference file ``name`` (facts.json, persona.json, a
    reflection_archive shard, ...) made from nekomem's content ``raw`` of the same file:
    times naive local, embeddings dropped, import passthrough restored."""
    if name == names.PERSONA and isinstance(raw, dict):
        sections = {}
        for key, section in raw.items():
            if isinstance(section, dict) and isinstance(section.get("facts"), list):
                section = {**section, "facts": [_reference_record(e) for e in section["facts"]]}
            sections[key] = times.record(section)
        return sections
    if not isinstance(raw, list):
        return times.record(raw)
    if name == names.REFLECTION_ARCHIVE:
        return [times.record({k: v for k, v in _reference_record(r).items() if k != "archive_shard_path"}) for r in raw]
    return [times.record(_reference_record(r)) for r in raw]


def write_reference_journal(source: Path, target: Path, times: LocalTimes) -> int:
    """Write nekomem's time_indexed.db ``source`` as a new reference time_indexed.db at
    ``target`` (which must not exist); returns the rows written. Raises sqlite3.Error."""
    return _journal(source, target, times)


def _journal(source: Path, target: Path, times: LocalTimes) -> int:
    """Copy time_indexed_original in the reference's forms; returns the rows written."""
    target.parent.mkdir(parents=True, exist_ok=True)
    out = sqlite3.connect(target)
    try:
        for table in (ORIGINAL_TABLE, _COMPRESSED):
            out.execute(
                f"CREATE TABLE {table} (id INTEGER PRIMARY KEY AUTOINCREMENT, session_id VARCHAR, message TEXT, timestamp DATETIME)"
            )
        written = 0
        if source.exists():
            db = sqlite3.connect(f"{source.resolve().as_uri()}?mode=ro", uri=True)
            try:
                cursor = db.execute(f"SELECT id, session_id, message, timestamp FROM {ORIGINAL_TABLE} ORDER BY id")
                while rows := cursor.fetchmany(500):
                    batch = []
                    for row_id, session_id, message, stamp in rows:
                        try:
                            decoded = json.loads(message) if isinstance(message, str) else None
                        except ValueError:
                            decoded = None
                        text = json.dumps(reference_message(decoded), ensure_ascii=False) if decoded is not None else message
                        batch.append((row_id, session_id, text, times.db_text(stamp)))
                    out.executemany(f"INSERT INTO {ORIGINAL_TABLE} (id, session_id, message, timestamp) VALUES (?, ?, ?, ?)", batch)
                    written += len(batch)
            finally:
                db.close()
        out.execute(f"CREATE INDEX idx_{ORIGINAL_TABLE}_timestamp ON {ORIGINAL_TABLE}(timestamp)")
        out.commit()
    finally:
        out.close()
    return written


def export_character(source: Path, target: Path, times: LocalTimes) -> dict[str, int]:
    """Write one character folder ``source`` (nekomem) as ``target`` (reference); returns
    records written per file. Raises ExportError when ``target`` already holds files."""
    if target.exists() and any(target.iterdir()):
        raise ExportError(f"{target} already holds files; export into an empty folder")
    target.mkdir(parents=True, exist_ok=True)
    counts: dict[str, int] = {}
    counts[names.TIME_INDEX] = _journal(source / names.TIME_INDEX, target / names.TIME_INDEX, times)
    recent, status = read_json(source / names.RECENT, default=None)
    if status == "ok" and isinstance(recent, list):
        atomic_write_json(target / names.RECENT, [reference_message(m) for m in recent])
        counts[names.RECENT] = len(recent)
    meta, _ = read_json(source / names.RECENT_META, default={})
    if isinstance(meta, dict) and meta.get("last_past_block_update_at"):
        atomic_write_json(target / names.RECENT_META, {"last_past_block_update_at": times.json_text(meta["last_past_block_update_at"])})
        counts[names.RECENT_META] = 1
    for file in _JSON_LAYERS:
        raw, status = read_json(source / file, default=None)
        if status == "ok" and isinstance(raw, list):
            atomic_write_json(target / file, [times.record(_reference_record(r)) for r in raw])
            counts[file] = len(raw)
    shards = source / names.REFLECTION_ARCHIVE
    if shards.is_dir():
        for path in sorted(shards.glob("*.json")):
            raw, status = read_json(path, default=None)
            if status == "ok" and isinstance(raw, list):
                out = [times.record({k: v for k, v in _reference_record(r).items() if k != "archive_shard_path"}) for r in raw]
                atomic_write_json(target / names.REFLECTION_ARCHIVE / path.name, out)
                counts[f"{names.REFLECTION_ARCHIVE}/{path.name}"] = len(raw)
    persona, status = read_json(source / names.PERSONA, default=None)
    if status == "ok" and isinstance(persona, dict):
        sections = {}
        for key, section in persona.items():
            if isinstance(section, dict) and isinstance(section.get("facts"), list):
                section = {**section, "facts": [_reference_record(e) for e in section["facts"]]}
            sections[key] = times.record(section)
        atomic_write_json(target / names.PERSONA, sections)
        counts[names.PERSONA] = sum(len(s.get("facts") or []) for s in sections.values() if isinstance(s, dict))
    cursors, status = read_json(source / names.CURSORS, default=None)
    if status == "ok" and isinstance(cursors, dict):
        atomic_write_json(target / names.CURSORS, {k: times.json_text(v) for k, v in cursors.items()})
        counts[names.CURSORS] = len(cursors)
    if (source / "theater_retractions.json").is_file():
        shutil.copyfile(source / "theater_retractions.json", target / "theater_retractions.json")
    return counts


def export_root(root: Path, target: Path, zone: str, characters: list[str] | None, progress: Callable[[str], None]) -> dict[str, Any]:
    """Export every character of ``root`` (or only ``characters``) into ``target``.
    Returns ``{"characters": {name: counts}}``. Raises ExportError."""
    times = LocalTimes(zone)
    known = list_characters(root)
    wanted = characters or known
    missing = [n for n in wanted if n not in known]
    if missing:
        raise ExportError(f"no such character in {root}: {', '.join(missing)}")
    if target.resolve() == root.resolve() or root.resolve() in target.resolve().parents:
        raise ExportError("the target must be outside the memory root")
    report: dict[str, Any] = {"characters": {}}
    for name in wanted:
        # CharacterPaths: in a N.E.K.O. memory folder nekomem's files are in <name>/.nekomem/.
        report["characters"][name] = export_character(CharacterPaths(root, name).folder, target / name, times)
        progress(name)
    return report


def export_neko(settings: Any, target_dir: str, characters: list[str] | None, zone: str | None, *, out: TextIO, err: TextIO) -> int:
    """The CLI command: hold the memory root exclusively (no server may write meanwhile),
    export, print the report (JSON) to ``out``. Returns 0, or 1 when refused."""
    from nekomem.stores import rootlock
    from nekomem.stores.rootlock import RootLocked

    root = Path(settings.server.memory_root).expanduser()
    chosen = settings.importer.import_source_timezone if zone is None else zone
    try:
        with rootlock.acquire(root, "exclusive", "export-neko"):
            report = export_root(root, Path(target_dir).expanduser(), chosen, characters, lambda n: None)
    except (RootLocked, ExportError) as exc:
        print(f"nekomem export-neko: {exc}", file=err)
        return 1
    out.write(json.dumps(report, ensure_ascii=False, indent=2) + "\n")
    print(f"nekomem export-neko: {len(report['characters'])} characters written to {target_dir}", file=err)
    return 0
