"""``scoped_subjects.json`` of a character: what nekomem keeps about each group-chat subject
besides its memories: ``{subject key: {"display_name", "prompt_locale", "last_write_at"}}``.

The reference keeps these in other places (the display name on the subject's persona
section, the locale in ``scoped_prompt_locales.json``); this file is nekomem's own and
sits beside them. ``display_name`` (a group name or nickname) is personal data: a
``scoped_forget`` of the subject removes its entry. An unreadable file is moved aside and
read as empty (it holds nothing that cannot be sent again with the next write).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from nekomem.stores.atomic import atomic_write_json, read_json

FILENAME = "scoped_subjects.json"


class ScopedMeta:
    """The subject records of one character folder (blocking file I/O; callers serialise)."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / FILENAME

    def read(self) -> dict[str, dict[str, Any]]:
        """Every subject's record (a missing or unreadable file is none)."""
        raw, status = read_json(self.path, default={})
        if status != "ok" or not isinstance(raw, dict):
            return {}
        return {str(k): v for k, v in raw.items() if isinstance(v, dict)}

    def update(self, key: str, now: str, *, display_name: str | None = None, prompt_locale: str | None = None) -> None:
        """Note a write to subject ``key`` at ``now``, with its display name and language
        when the write carried them. Raises OSError."""
        data = self.read()
        record = dict(data.get(key) or {})
        record["last_write_at"] = now
        if display_name:
            record["display_name"] = display_name
        if prompt_locale:
            record["prompt_locale"] = prompt_locale
        data[key] = record
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(self.path, data)

    def forget(self, key: str) -> bool:
        """Remove subject ``key``'s record; returns whether there was one. Raises OSError."""
        data = self.read()
        if data.pop(key, None) is None:
            return False
        atomic_write_json(self.path, data)
        return True
