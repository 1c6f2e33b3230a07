"""Process-wide switches persisted in ``core_config.json`` (under the memory root, or where
the ``core_config_path`` setting says: the chat server's own config folder).

``powerful_memory_enabled`` and ``recent_memory_auto_review`` are re-read from disk on
every use, as the reference does, so an operator's edit takes effect without a restart.
Every use costs one ``stat``: the decoded content is kept with the file's identity (inode,
size, mtime in ns) and the file is read again whenever that identity changes (an edit in
place or a replacing rename both change it). A missing key means the configured default;
an unreadable file is reported, not guessed.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

from nekomem.stores.atomic import atomic_write_json, file_identity, read_json

log = logging.getLogger("nekomem.switches")

POWERFUL = "powerful_memory_enabled"
REVIEW = "recent_memory_auto_review"


class SwitchError(Exception):
    """core_config.json cannot be read or holds a non-boolean value."""


def core_config_file(setting: str, memory_root: Path) -> Path:
    """The core_config.json the ``core_config_path`` setting names: empty means the memory
    root's, a folder (existing, or written with a trailing separator) means the file in it."""
    if not setting.strip():
        return memory_root / "core_config.json"
    path = Path(setting).expanduser()
    if path.is_dir() or setting.endswith(("/", "\\")):
        return path / "core_config.json"
    return path


class Switches:
    def __init__(self, memory_root: Path, *, powerful_default: bool, review_default: bool, path: Path | None = None) -> None:
        self.path = path if path is not None else memory_root / "core_config.json"
        self.defaults = {POWERFUL: powerful_default, REVIEW: review_default}
        self._write_lock = threading.Lock()  # serialises read-modify-write of one file
        # (identity of the file when read, its decoded object): replaced whole, never mutated
        self._cache: tuple[tuple[int, int, int] | None, dict[str, Any]] | None = None

    def _load(self) -> dict[str, Any]:
        """The file's object, read again when its identity changed since the last read.
        Raises SwitchError when it is not a JSON object (an unreadable file reads as empty)."""
        identity = file_identity(self.path)
        cached = self._cache
        if cached is not None and identity is not None and cached[0] == identity:
            return cached[1]
        value, status = read_json(self.path, default={})
        if not isinstance(value, dict):
            raise SwitchError("core_config.json is not a JSON object")
        # Only a file that read as ok is kept: a missing or corrupt one is read again.
        self._cache = (identity, value) if status == "ok" else None
        return value

    def get(self, key: str) -> bool:
        """The current value; raises SwitchError when the stored value is not a boolean."""
        data = self._load()
        if key not in data:
            return self.defaults[key]
        value = data[key]
        if not isinstance(value, bool):
            raise SwitchError(f"{key} in core_config.json is not a boolean")
        return value

    def safe_get(self, key: str) -> bool:
        try:
            return self.get(key)
        except SwitchError:
            log.warning("core_config.json unreadable; using the default of %s", key)
            return self.defaults[key]

    def powerful_memory(self) -> bool:
        return self.safe_get(POWERFUL)

    def review_enabled(self) -> bool:
        return self.safe_get(REVIEW)

    def set(self, key: str, value: bool) -> None:
        with self._write_lock:
            try:
                data = self._load()
            except SwitchError:
                data = {}
            data = {**data, key: bool(value)}  # the cached object is never mutated
            atomic_write_json(self.path, data)
            self._cache = None
