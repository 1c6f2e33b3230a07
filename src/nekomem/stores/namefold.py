"""Character names on case-insensitive file systems (Windows' NTFS and macOS' APFS by
default, where most N.E.K.O. users are).

There ``Neko``, ``neko`` and ``NEKO`` are one folder; served as three names they would be
three live actor sets writing one set of files. :func:`probe_case_insensitive` tells at
start-up whether the memory root folds case (it creates a probe file and looks for it under
another case), and :class:`CharacterSpellings` then gives every spelling of a name the one
spelling the server uses for it: the folder's own on disk, else the first one asked for.
On a case-sensitive root every name is its own.

Which names are "the same" follows those file systems, not Unicode's full case folding:
:func:`fold` maps each character to its simple uppercase form (one character for one, as
NTFS's upcase table does; ``ß`` and ``ﬁ`` stay as they are) after NFC (APFS also ignores
the NFC/NFD difference). Fullwidth letters are letters of their own there: ``ｌａｎ`` and
``ＬＡＮ`` are one name, ``ｌａｎ`` and ``Lan`` are two folders, and two characters, as they
are for the reference (N.E.K.O.), which keeps names as given (no NFKC) and writes
``memory_dir/<name>/``. Name *validation* is not this module's concern (stores.layout).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import unicodedata
import uuid
from collections import OrderedDict
from pathlib import Path

log = logging.getLogger("nekomem.stores.namefold")

# Spellings remembered (least recently used dropped first): a name with a folder is found
# again on disk, so only two spellings of one new name asked for across an eviction split.
_REMEMBERED = 10_000


def fold(name: str) -> str:
    """The key under which a case-insensitive disk compares ``name``: NFC, then each
    character's simple uppercase (a character whose uppercase is longer is kept)."""
    text = unicodedata.normalize("NFC", name)
    out = []
    for ch in text:
        upper = ch.upper()
        out.append(upper if len(upper) == 1 else ch)
    return "".join(out)


def _platform_guess() -> bool:
    """The usual behaviour of this platform's disks (Windows and macOS fold case)."""
    return sys.platform.startswith(("win", "darwin"))


def probe_case_insensitive(root: Path) -> bool:
    """Whether the file system of the folder ``root`` folds case: a probe file is created
    in lower case and looked for in upper case, then removed. When no probe can be
    written (a read-only root), the platform's usual behaviour is assumed."""
    probe = Path(root) / f".nekomem-case-probe-{uuid.uuid4().hex}"
    try:
        probe.touch(exist_ok=False)
    except OSError as exc:
        guess = _platform_guess()
        log.warning("could not probe the memory root for case folding (%s); assuming %s", type(exc).__name__, guess)
        return guess
    try:
        return probe.with_name(probe.name.upper()).exists()
    finally:
        try:
            probe.unlink()
        except OSError:
            log.warning("could not remove the case probe file %s", probe.name)


class CharacterSpellings:
    """The spelling the server uses for a character name (thread-safe)."""

    def __init__(self, root: Path, insensitive: bool) -> None:
        self.root = Path(root)
        self.insensitive = insensitive
        self._lock = threading.Lock()
        self._known: OrderedDict[str, str] = OrderedDict()

    def canonical(self, name: str) -> str:
        """``name`` on a case-sensitive root; on a case-insensitive one, the spelling of
        its folder when one exists under another case, else the first spelling asked for."""
        if not self.insensitive:
            return name
        key = fold(name)
        with self._lock:
            found = self._known.get(key)
            if found is not None:
                self._known.move_to_end(key)
                return found
        spelling = self._on_disk(key) or name
        with self._lock:
            found = self._known.setdefault(key, spelling)
            self._known.move_to_end(key)
            while len(self._known) > _REMEMBERED:
                self._known.popitem(last=False)
        return found

    def forget(self, name: str) -> None:
        """Drop the remembered spelling of ``name`` (its folder was deleted: the next
        spelling asked for makes the new folder)."""
        with self._lock:
            self._known.pop(fold(name), None)

    def _on_disk(self, key: str) -> str | None:
        """The name of the folder under the root whose name folds to ``key``, if any."""
        try:
            with os.scandir(self.root) as entries:
                for entry in entries:
                    name = unicodedata.normalize("NFC", entry.name)
                    if fold(name) == key and entry.is_dir():
                        return name
        except OSError:
            return None
        return None
