"""The per-root summary behind the memory browser's character list.

``<memory root>/character_summary.json`` keeps, for each character folder, what its row of
``GET /api/browse/characters`` shows without asking its actors: the counts of its views,
its stored turns and the time of its last one. Each entry carries the *stamp* it was read
under: the modification times of the character's folder (an atomic view write renames a
file in it), its view folder, its reflection archive and its journal (``time_indexed.db``
and its WAL). A listing compares the stamps, a few ``stat`` calls per character and no
file read, and reads again only the characters whose stamp moved: so the summary follows
every write (a server's, an offline import's, a restore's, a hand edit's) and a missing,
damaged or stale summary is rebuilt from the views.

The summary is derived and never authoritative: it holds names and numbers, no memory
text, and deleting it loses nothing (the next listing rebuilds it). The stamp is taken
before the counts are read, so a write that lands during the read leaves a stamp older
than the files and is read again next time.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import Any

import msgspec

from nekomem.stores.atomic import atomic_write_json
from nekomem.stores.layout import CharacterPaths, list_characters

log = logging.getLogger(__name__)

SUMMARY_FILE = "character_summary.json"
SUMMARY_VERSION = 1


class CharacterRow(msgspec.Struct, kw_only=True):
    """What the summary knows of one character."""

    stamp: list[int]
    turns: int = 0
    last_conversation_at: str | None = None
    counts: dict[str, Any] = msgspec.field(default_factory=dict)


class _SummaryFile(msgspec.Struct, kw_only=True):
    version: int = SUMMARY_VERSION
    characters: dict[str, CharacterRow] = msgspec.field(default_factory=dict)
    # The character folders of the last listing (taken as characters while they are there).
    names: list[str] = msgspec.field(default_factory=list)


def _mtime(path: str) -> int:
    try:
        return os.stat(path).st_mtime_ns
    except OSError:
        return 0


def stamp_of(paths: CharacterPaths) -> list[int]:
    """The modification times a change to the character's views or journal moves."""
    places = dict.fromkeys(
        (
            str(paths.folder),
            str(paths.facts.parent),
            str(paths.reflection_archive_dir),
            str(paths.time_index_db),
            str(paths.time_index_db) + "-wal",
        )
    )
    return [_mtime(p) for p in places]


Reader = Callable[[CharacterPaths], tuple[int, str | None, dict[str, Any]]]


class CharacterSummary:
    """The summary of one memory root (see the module). Thread-safe: listings may run
    concurrently on worker threads."""

    def __init__(self, root: Path) -> None:
        self.path = Path(root) / SUMMARY_FILE
        self._lock = threading.Lock()
        self._rows: dict[str, CharacterRow] | None = None
        self._names: frozenset[str] = frozenset()

    def names(self, max_length: int) -> list[str]:
        """The characters of the root (:func:`~nekomem.stores.layout.list_characters`),
        the folders of the last listing (kept in the summary) taken as characters while
        they are there."""
        with self._lock:
            self._load()
            settled = self._names
        names = list_characters(self.path.parent, max_length=max_length, settled=settled)
        with self._lock:
            if set(names) != self._names:
                self._names = frozenset(names)
                self._write()
        return names

    def forget(self, name: str) -> None:
        """Drop ``name`` from the summary now (a deleted character leaves no trace in it).
        Raises nothing (a summary that cannot be written is logged)."""
        with self._lock:
            rows = self._load()
            if name not in rows and name not in self._names:
                return
            rows.pop(name, None)
            self._names = self._names - {name}
            if rows or self._names:
                self._write()
            else:
                self.path.unlink(missing_ok=True)

    def _write(self) -> None:
        rows = self._rows or {}
        if not rows and not self._names:
            return  # nothing to keep: a read of an empty root leaves it empty
        try:
            atomic_write_json(
                self.path, _SummaryFile(characters=rows, names=sorted(self._names)), durable=False
            )  # derived: rebuilt when lost
        except OSError:
            log.warning("the character summary %s could not be written", self.path, exc_info=True)

    def _load(self) -> dict[str, CharacterRow]:
        if self._rows is None:
            kept = _SummaryFile()
            try:
                kept = msgspec.json.decode(self.path.read_bytes(), type=_SummaryFile)
            except FileNotFoundError:
                pass
            except (OSError, msgspec.DecodeError, msgspec.ValidationError):
                log.warning("the character summary %s is unreadable: it is rebuilt from the views", self.path)
            self._rows, self._names = kept.characters, frozenset(kept.names)
        return self._rows

    def rows(
        self, names: Sequence[str], paths_of: Callable[[str], CharacterPaths], read: Reader, known: Collection[str]
    ) -> dict[str, CharacterRow]:
        """The row of each of ``names``: kept ones whose stamp still holds, the others read
        again with ``read(paths) -> (turns, last, counts)``. Rows of characters not in
        ``known`` (every character on disk) are dropped. The summary file is rewritten
        when a row changed or a name left; a summary file deleted since the last call is
        rebuilt from the views. A summary that cannot be written is logged (the rows are
        right all the same)."""
        with self._lock:
            if self._rows is not None and not self.path.exists():
                self._rows, self._names = None, frozenset()  # deleted behind our back: rebuilt from the views
            rows = self._load()
            changed = bool(rows) and not self.path.exists()
            result: dict[str, CharacterRow] = {}
            for name in names:
                paths = paths_of(name)
                stamp = stamp_of(paths)  # before the read: a write during it shows next time
                row = rows.get(name)
                if row is None or row.stamp != stamp:
                    turns, last, counts = read(paths)
                    row = rows[name] = CharacterRow(stamp=stamp, turns=turns, last_conversation_at=last, counts=counts)
                    changed = True
                result[name] = row
            for name in [n for n in rows if n not in known]:
                del rows[name]
                changed = True
            if changed:
                self._write()
            return result


_SUMMARIES: dict[Path, CharacterSummary] = {}
_SUMMARIES_LOCK = threading.Lock()


def summary_of(root: Path) -> CharacterSummary:
    """The one :class:`CharacterSummary` of ``root`` in this process."""
    key = Path(root)
    with _SUMMARIES_LOCK:
        summary = _SUMMARIES.get(key)
        if summary is None:
            summary = _SUMMARIES[key] = CharacterSummary(key)
        return summary
