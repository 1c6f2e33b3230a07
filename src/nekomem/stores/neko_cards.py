"""The reference chat server's character cards: its ``config/characters.json``.

The file holds ``"主人"`` (the master's profile, a JSON object) and ``"猫娘"`` (each
character's card by name). :meth:`CharacterCards.parts` answers the card parts of one
character, as :func:`nekomem.domain.persona.sync_card` takes them. The file belongs to the
chat server and is only read; its decoded content is kept with the file's identity (inode,
size, mtime in ns) and read again when that changes.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nekomem.stores.atomic import file_identity

log = logging.getLogger("nekomem.cards")

MASTER_KEY = "主人"
CHARACTERS_KEY = "猫娘"


class CharacterCards:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._cache: tuple[tuple[int, int, int], dict[str, Any]] | None = None

    def _load(self) -> dict[str, Any] | None:
        """The file's object; None when it is missing or not a JSON object (logged)."""
        identity = file_identity(self.path)
        if identity is None:
            return None
        with self._lock:
            cached = self._cache
            if cached is not None and cached[0] == identity:
                return cached[1]
        # Not stores.atomic.read_json: that one moves a corrupt file aside, and this file is
        # the chat server's. A bad one is only reported.
        try:
            value = json.loads(self.path.read_bytes())
        except (OSError, ValueError) as exc:
            log.warning("the character cards file cannot be read (%s); cards are not synced", type(exc).__name__)
            return None
        if not isinstance(value, dict):
            log.warning("the character cards file is not a JSON object; cards are not synced")
            return None
        with self._lock:
            self._cache = (identity, value)
        return value

    def parts(self, name: str) -> dict[str, Mapping[str, Any]] | None:
        """``{"neko": card, "master": profile}`` for character ``name`` (each part only when
        the file has it), or None when the file cannot be read: then nothing is synced, so
        an unreadable file never drops card entries."""
        data = self._load()
        if data is None:
            return None
        found: dict[str, Mapping[str, Any]] = {}
        characters = data.get(CHARACTERS_KEY)
        if isinstance(characters, dict) and isinstance(characters.get(name), dict):
            found["neko"] = characters[name]
        master = data.get(MASTER_KEY)
        if isinstance(master, dict):
            found["master"] = master
        return found
