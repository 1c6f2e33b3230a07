"""Imports into the memory root of a running server (``POST /api/import/neko``).

The importer writes character files directly, so each character is imported under a
registry hold: its actors finish what is in flight, flush their views and stop; requests
for it wait; the files are merged; the hold ends and the next request activates the
character again from disk (journal, views and indexes rebuilt as at any activation). No
live actor state can overwrite the imported records or be overwritten by them. One import
runs at a time.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

from nekomem.config import Settings
from nekomem.importer.neko import ImportBlocked, plan, run_import
from nekomem.importer.report import ImportReport
from nekomem.runtime.registry import CharacterBusy, CharacterRegistry


class ImportRunning(RuntimeError):
    """Another import is already running in this process."""


class ImportService:
    def __init__(self, settings: Settings, registry: CharacterRegistry, memory_root: Path) -> None:
        self.settings = settings
        self.registry = registry
        self.memory_root = memory_root
        self._running = threading.Lock()

    @contextlib.contextmanager
    def _guard(self, name: str) -> Iterator[None]:
        try:
            with self.registry.hold(name, self.settings.importer.import_character_timeout_seconds):
                yield
        except CharacterBusy as exc:
            raise ImportBlocked(f"not imported: {exc}") from None

    def import_neko(self, source: Path, characters: list[str] | None = None) -> ImportReport:
        """Import a reference memory folder (blocking; run it off the event loop).

        Raises ImportRunning, SourceError (the source cannot be imported), OSError or
        sqlite3.Error (the target cannot be written). A character that stays busy is
        reported in the answer's problems and left untouched.
        """
        if not self._running.acquire(blocking=False):
            raise ImportRunning("another import is running; try again when it has finished")
        try:
            report, sources = plan(source, self.memory_root, self.settings, characters)
            return run_import(report, sources, self.settings, guard=self._guard)
        finally:
            self._running.release()
