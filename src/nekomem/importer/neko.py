"""Import a reference (N.E.K.O.) memory folder into a nekomem memory root.

Each layer is merged, never overwritten: a record whose id (or, for the journal, whose
session, time, speaker and text) is already in the target is left alone, so running the
same import twice writes nothing the second time. Records are validated into nekomem's
own record types (a record that does not fit is reported, not guessed at), times get the
offset of the zone the source wrote them in, and cached embeddings are dropped because
they belong to another model (nekomem re-embeds). Fields a nekomem record has no place
for go into the record's passthrough field when it has one (``Fact.source_ref``) and are
reported otherwise. A record scoped to a group or participant is refused (and reported)
by a record type that cannot keep its subject: imported unscoped it would become the
owner's memory.

This module writes character files directly. Its caller must make sure nobody else does
meanwhile: the CLI holds the memory root's lock exclusive, the server releases each
character's actors and keeps them from starting again (``guard``) while it is imported.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from collections import Counter
from collections.abc import Callable, Hashable, Iterable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from nekomem.config import Settings
from nekomem.domain.records import Correction, Fact, PersonaEntry, Reflection, SurfacedEntry
from nekomem.domain.turns import Turn, from_disk
from nekomem.importer import neko_source as src
from nekomem.importer.neko_source import SourceCharacter, SourceError, TimeLocalizer
from nekomem.importer.report import CharacterReport, ImportReport
from nekomem.stores.atomic import atomic_write_json, read_json
from nekomem.stores.cursors import Cursors
from nekomem.stores.layout import CharacterPaths, InvalidName
from nekomem.stores.timeindex import TimeIndex, encode_row

log = logging.getLogger(__name__)

S = TypeVar("S", bound=msgspec.Struct)
Progress = Callable[[int], None]
"""Called with the number of source records just handled."""
Guard = Callable[[str], contextlib.AbstractContextManager[object]]
"""Keeps a character's live actors away from its files while it is imported."""

_EMBEDDING_FIELDS = ("embedding", "embedding_text_sha256", "embedding_model_id")
_FACT_SOURCES = ("user_observation", "ai_disclosure")
# Rows of the journal written per SQLite transaction.
_JOURNAL_BATCH = 2000


class ImportBlocked(RuntimeError):
    """A guard could not take a character (its actors stayed busy); it is reported and skipped."""


@functools.cache
def _fields(cls: type[msgspec.Struct]) -> frozenset[str]:
    return frozenset(cls.__struct_fields__)


class ScopedRecord(ValueError):
    """A record scoped to a subject that this nekomem's record type cannot scope."""


def convert(raw: dict[str, Any], cls: type[S], passthrough: str | None = None) -> tuple[S, list[str]]:
    """``raw`` as a ``cls`` record: cached embeddings dropped, fields ``cls`` lacks moved
    under ``{"neko": {...}}`` in ``passthrough`` (when given). Returns the record and the
    names of the fields that were dropped. Raises msgspec.ValidationError, and
    ScopedRecord for a record scoped to a group or participant when ``cls`` has no
    ``subject_kind`` (imported unscoped it would surface in the owner's memory)."""
    known = _fields(cls)
    if any(raw.get(k) for k in src.SUBJECT_FIELDS if k != "scope") and "subject_kind" not in known:
        raise ScopedRecord(
            f"scoped to subject {raw.get('subject_kind')}:{raw.get('subject_id')}, and nekomem keeps no subject on "
            f"{cls.__name__} records; not imported, so it cannot surface unscoped"
        )
    data = {k: v for k, v in raw.items() if k in known and k not in _EMBEDDING_FIELDS}
    extra = {k: v for k, v in raw.items() if k not in known}
    dropped: list[str] = []
    if extra and passthrough is not None and passthrough not in raw:
        data[passthrough] = {"neko": extra}
    else:
        dropped = sorted(extra)
    return msgspec.convert(data, cls, strict=False), dropped


def _record_id(record: Reflection) -> str:
    return record.id


def _text_ok(raw: dict[str, Any]) -> str | None:
    """Why a record's id/text cannot be used, or None."""
    if not isinstance(raw.get("id"), str) or not raw["id"].strip():
        return "has no id"
    if not isinstance(raw.get("text"), str) or not raw["text"].strip():
        return "has no text"
    return None


class CharacterImport:
    """Import of one source character into one target folder."""

    def __init__(self, source: SourceCharacter, paths: CharacterPaths, report: CharacterReport, progress: Progress) -> None:
        self.source = source
        self.paths = paths
        self.report = report
        self.progress = progress
        self._dropped: dict[str, set[str]] = {}

    def problem(self, layer: str, file: str, reason: str, record: str | None = None) -> None:
        self.source.problem(layer, file, reason, record)

    def run(self) -> None:
        recent = self.source.recent()
        wanted: set[tuple[str, str]] = {(t.role, t.text) for t in recent}
        times = self.journal(wanted)
        self.recent(recent, times)
        self.facts()
        self.reflections()
        self.surfaced()
        self.persona()
        self.corrections()
        self.cursors()
        for layer, names in self._dropped.items():
            if names:
                self.problem(layer, "", f"fields nekomem does not keep were dropped: {', '.join(sorted(names))}")

    def _validated(self, layer: str, file: str, raw: dict[str, Any], index: int, cls: type[S], passthrough: str | None = None) -> S | None:
        why = _text_ok(raw) if cls is not SurfacedEntry and cls is not Correction else None
        if why is None:
            try:
                record, dropped = convert(raw, cls, passthrough)
            except (msgspec.ValidationError, ScopedRecord) as exc:
                why = str(exc)
            else:
                self._dropped.setdefault(layer, set()).update(dropped)
                return record
        self.problem(layer, file, why, str(raw.get("id") or f"[{index}]"))
        return None

    def _unseen(
        self, layer: str, file: str, records: Iterable[dict[str, Any]], cls: type[S], key: Callable[[S], Hashable], seen: set[Any]
    ) -> Iterator[S]:
        """The valid records whose ``key`` is not in ``seen`` yet (added to it), counted in
        the layer's report: read and unchanged for every valid record, added for each one
        yielded."""
        count = self.report.count(layer)
        for index, raw in enumerate(records):
            record = self._validated(layer, file, raw, index, cls)
            if record is None:
                continue
            count.read += 1
            k = key(record)
            if k in seen:
                count.unchanged += 1
                continue
            seen.add(k)
            count.added += 1
            yield record

    # -- recent window and journal -------------------------------------------------------
    def journal(self, wanted: set[tuple[str, str]]) -> dict[tuple[str, str], str]:
        """Merge the journal rows; return the newest time of each (role, text) in ``wanted``."""
        count = self.report.count("journal")
        times: dict[tuple[str, str], str] = {}
        index = TimeIndex(self.paths.time_index_db)
        try:
            # A row is the same when its stored form is: compared undecoded, so a repeated
            # import costs one pass over the target's rows.
            have: Counter[tuple[str | None, str, str]] = Counter()
            if self.paths.time_index_db.exists():
                have.update(index.raw_rows())
            batch: list[tuple[str, Turn]] = []
            handled = 0
            for row in self.source.journal():
                count.read += 1
                handled += 1
                key = encode_row(row.session_id, row.turn)
                if (row.turn.role, row.turn.text) in wanted:
                    times[(row.turn.role, row.turn.text)] = row.turn.ts
                if have[key] > 0:
                    have[key] -= 1
                    count.unchanged += 1
                else:
                    batch.append((row.session_id, row.turn))
                if len(batch) >= _JOURNAL_BATCH or handled >= _JOURNAL_BATCH:
                    count.added += index.append_rows(batch) if batch else 0
                    self.progress(handled)
                    batch, handled = [], 0
            if batch:
                count.added += index.append_rows(batch)
            self.progress(handled)
        finally:
            index.close()
        return times

    def recent(self, turns: list[Turn], times: dict[tuple[str, str], str]) -> None:
        count = self.report.count("recent")
        count.read = len(turns)
        memo_at = self.source.recent_meta()
        if turns:
            stamped = []
            for i, t in enumerate(turns):
                ts = times.get((t.role, t.text)) or (memo_at if i == 0 and t.role == "system" else None) or t.ts
                stamped.append(msgspec.structs.replace(t, ts=ts or ""))
            raw, _ = read_json(self.paths.recent, default=[])
            existing = [x for x in (from_disk(item) for item in (raw if isinstance(raw, list) else [])) if x is not None]
            if not existing:
                atomic_write_json(self.paths.recent, [t.to_disk() for t in stamped])
                count.added = len(stamped)
            elif [(t.role, t.text) for t in existing] == [(t.role, t.text) for t in stamped]:
                count.unchanged = len(stamped)
            else:
                count.skipped = len(stamped)
                self.problem(
                    "recent", src.RECENT, f"the target already holds a different recent window ({len(existing)} items); it was kept"
                )
        self.progress(len(turns))
        meta = self.report.count("recent_meta")
        if memo_at is None:
            return
        meta.read = 1
        raw_meta, _ = read_json(self.paths.recent_meta, default={})
        raw_meta = raw_meta if isinstance(raw_meta, dict) else {}
        if raw_meta.get("last_past_block_update_at"):
            meta.unchanged = 1
            return
        atomic_write_json(self.paths.recent_meta, {**raw_meta, "last_past_block_update_at": memo_at})
        meta.added = 1

    # -- facts, reflections, surfaced ---------------------------------------------------
    def facts(self) -> None:
        active, _ = read_json(self.paths.facts, default=[])
        archive, _ = read_json(self.paths.facts_archive, default=[])
        active = active if isinstance(active, list) else []
        archive = archive if isinstance(archive, list) else []
        ids = {item.get("id") for item in active + archive if isinstance(item, dict)}
        texts = {(item.get("entity"), str(item.get("text", "")).strip()) for item in active if isinstance(item, dict)}
        for layer, file, target in (("facts", src.FACTS, active), ("facts_archive", src.FACTS_ARCHIVE, archive)):
            count = self.report.count(layer)
            before = len(target)
            for index, raw in enumerate(self.source.records(layer, file)):
                if raw.get("source") is not None and raw.get("source") not in _FACT_SOURCES:
                    raw = {**raw, "source": "user_observation", "neko_source": raw["source"]}
                fact = self._validated(layer, file, raw, index, Fact, passthrough="source_ref")
                if fact is None:
                    continue
                count.read += 1
                if fact.id in ids:
                    count.unchanged += 1
                elif layer == "facts" and (fact.entity, fact.text.strip()) in texts:
                    count.skipped += 1
                    self.problem(layer, file, "the same text is already stored under another id", fact.id)
                else:
                    ids.add(fact.id)
                    texts.add((fact.entity, fact.text.strip()))
                    target.append(msgspec.to_builtins(fact))
                    count.added += 1
            if len(target) > before:
                atomic_write_json(self.paths.facts if layer == "facts" else self.paths.facts_archive, target)
            self.progress(count.read)

    def reflections(self) -> None:
        current, _ = read_json(self.paths.reflections, default=[])
        current = current if isinstance(current, list) else []
        shard_dir = self.paths.reflection_archive_dir
        shards: dict[str, list[Any]] = {}
        if shard_dir.is_dir():
            for path in sorted(shard_dir.glob("*.json")):
                raw, _ = read_json(path, default=[])
                shards[path.name] = raw if isinstance(raw, list) else []
        ids = {item.get("id") for item in current if isinstance(item, dict)}
        ids |= {item.get("id") for entries in shards.values() for item in entries if isinstance(item, dict)}
        before = len(current)
        records = self.source.records("reflections", src.REFLECTIONS)
        for ref in self._unseen("reflections", src.REFLECTIONS, records, Reflection, _record_id, ids):
            current.append(msgspec.to_builtins(ref))
        if len(current) > before:
            atomic_write_json(self.paths.reflections, current)
        self.progress(self.report.count("reflections").read)
        for name, records in self.source.reflection_shards():
            file = f"{src.REFLECTION_ARCHIVE}/{name}"
            target = shards.setdefault(name, [])
            before = len(target)
            for ref in self._unseen("reflection_archive", file, records, Reflection, _record_id, ids):
                target.append(msgspec.to_builtins(msgspec.structs.replace(ref, archive_shard_path=name)))
            if len(target) > before:
                shard_dir.mkdir(parents=True, exist_ok=True)
                atomic_write_json(shard_dir / name, target)
            self.progress(len(records))

    def surfaced(self) -> None:
        current, _ = read_json(self.paths.surfaced, default=[])
        current = current if isinstance(current, list) else []
        keys = {(item.get("reflection_id"), item.get("surfaced_at")) for item in current if isinstance(item, dict)}
        before = len(current)
        records = self.source.records("surfaced", src.SURFACED)
        for entry in self._unseen("surfaced", src.SURFACED, records, SurfacedEntry, lambda e: (e.reflection_id, e.surfaced_at), keys):
            current.append(msgspec.to_builtins(entry))
        if len(current) > before:
            atomic_write_json(self.paths.surfaced, current)
        self.progress(self.report.count("surfaced").read)

    # -- persona, corrections, cursors --------------------------------------------------
    def persona(self) -> None:
        current, _ = read_json(self.paths.persona, default={})
        current = current if isinstance(current, dict) else {}
        ids = {
            item.get("id")
            for section in current.values()
            if isinstance(section, dict)
            for item in (section.get("facts") or [])
            if isinstance(item, dict)
        }
        count = self.report.count("persona")
        entries = self.source.persona()
        for index, (entity, raw) in enumerate(entries):
            entry = self._validated("persona", src.PERSONA, raw, index, PersonaEntry)
            if entry is None:
                continue
            count.read += 1
            if entry.id in ids:
                count.unchanged += 1
                continue
            ids.add(entry.id)
            section = current.get(entity)
            if not isinstance(section, dict) or not isinstance(section.get("facts"), list):
                # A new scoped section carries its subject descriptor, as the reference writes it.
                stamp = {k: raw[k] for k in src.SUBJECT_FIELDS if raw.get(k) is not None} if entity.startswith("@subject/") else {}
                section = current[entity] = {"facts": [], **stamp}
            section["facts"].append(msgspec.to_builtins(entry))
            count.added += 1
        if count.added:
            atomic_write_json(self.paths.persona, current)
        self.progress(len(entries))

    def corrections(self) -> None:
        current, _ = read_json(self.paths.persona_corrections, default=[])
        current = current if isinstance(current, list) else []
        keys = {(i.get("created_at"), i.get("old_text"), i.get("new_text")) for i in current if isinstance(i, dict)}
        before = len(current)
        layer, file = "persona_corrections", src.PERSONA_CORRECTIONS
        for item in self._unseen(
            layer, file, self.source.records(layer, file), Correction, lambda c: (c.created_at, c.old_text, c.new_text), keys
        ):
            current.append(msgspec.to_builtins(item))
        if len(current) > before:
            atomic_write_json(self.paths.persona_corrections, current)
        self.progress(self.report.count(layer).read)

    def cursors(self) -> None:
        values = self.source.cursors()
        count = self.report.count("cursors")
        count.read = len(values)
        target = Cursors(self.paths.cursors)
        for key, value in values.items():
            if target.get(key) is not None:
                count.unchanged += 1
            else:
                target.set(key, value)
                count.added += 1


def count_records(sources: Iterable[SourceCharacter]) -> int:
    """Records an import of ``sources`` will go through (sizes the progress bar): every
    layer the import reports progress for, so the bar ends at the count it drew."""
    total = 0
    for s in sources:
        total += s.journal_count() + len(s.recent()) + len(s.persona())
        total += sum(len(records) for _name, records in s.reflection_shards())
        for layer, file in (
            ("facts", src.FACTS),
            ("facts_archive", src.FACTS_ARCHIVE),
            ("reflections", src.REFLECTIONS),
            ("surfaced", src.SURFACED),
            ("persona_corrections", src.PERSONA_CORRECTIONS),
        ):
            total += len(s.records(layer, file))
    return total


def check_paths(source: Path, memory_root: Path) -> tuple[Path, Path]:
    """Resolved (source, root); raises SourceError when one lies inside the other (an
    import must never write into its source nor read its own output)."""
    source, root = source.expanduser().resolve(), memory_root.expanduser().resolve()
    if source == root or root in source.parents or source in root.parents:
        raise SourceError(f"the source {source} and the memory root {root} overlap; import from a separate folder")
    return source, root


def plan(source: Path, memory_root: Path, settings: Settings, only: list[str] | None = None) -> tuple[ImportReport, list[SourceCharacter]]:
    """The characters an import would take, with the report it starts from. Raises SourceError."""
    source, root = check_paths(source, memory_root)
    localizer = TimeLocalizer(settings.importer.import_source_timezone)
    found, ignored = src.discover(source, only)
    report = ImportReport(source_dir=str(source), memory_root=str(root), ignored_files=list(ignored))
    characters = [SourceCharacter(name, folder, localizer, report.problems) for name, folder in found]
    return report, characters


def run_import(
    report: ImportReport,
    characters: list[SourceCharacter],
    settings: Settings,
    *,
    progress: Progress = lambda n: None,
    guard: Guard = lambda name: contextlib.nullcontext(),
) -> ImportReport:
    """Import every planned character into ``report.memory_root``; returns the report.
    Raises OSError / sqlite3.Error when the target cannot be written."""
    root = Path(report.memory_root)
    for source in characters:
        try:
            paths = CharacterPaths(root, source.name, max_length=settings.server.name_max_length, max_units=settings.server.name_max_units)
        except InvalidName as exc:
            source.problem("character", source.name, f"the name is not allowed in nekomem: {exc.message}")
            continue
        char_report = CharacterReport(name=paths.name)
        try:
            with guard(paths.name):
                char_report.created = not paths.exists()
                paths.ensure()
                CharacterImport(source, paths, char_report, progress).run()
        except ImportBlocked as exc:
            source.problem("character", source.name, str(exc))
            continue
        report.characters.append(char_report)
        _note_bookkeeping(source, report)
        log.info("imported a character: %d records added", char_report.added)
    return report


def _note_bookkeeping(source: SourceCharacter, report: ImportReport) -> None:
    events = source.unapplied_events()
    if events:
        source.problem(
            "events",
            src.EVENTS,
            f"{events} journal events lie after the source's applied mark; their effects were not imported (start the reference server once so it applies them, then import again)",
        )
    pending = source.pending_outbox()
    if pending:
        source.problem(
            "outbox",
            src.OUTBOX,
            f"{pending} background operations were still pending in the source (their turns are in the imported journal; facts they would have extracted are not)",
        )
    for name in src.BOOKKEEPING_FILES:
        if (source.folder / name).exists():
            report.ignored_files.append(f"{source.name}/{name}")
