"""Writing checked character documents into a memory root, all of them or none.

:func:`write_characters` takes documents :func:`nekomem.stores.snapshot_check.check_character`
passed and puts each in place in three steps, so a failure at any point leaves every
existing character as it was:

1. *build*: each character is written whole into a temporary folder beside its target
   (``.nkatmp-restore-*``, in the same parent, so the later rename stays within one file
   system: a cluster shard may be a volume of its own), journal included; a failure (a
   full disk, SQLite) removes every temporary folder and changes nothing;
2. *swap*: for each character, an existing folder (only with ``replace``) is renamed aside
   (``.nkatmp-replaced-*``) and the new one renamed into its place; when a rename fails,
   the swaps made so far are undone in reverse order;
3. *clean up*: the folders set aside are removed, only once every new folder is in place.

A process killed between the two renames of one character leaves its old folder under
``.nkatmp-replaced-*`` beside the target (nothing is lost; docs/OPERATIONS.md says how to
put it back). The temporary-file sweep of the server removes only files, never these.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from nekomem.stores.atomic import atomic_write_bytes, fsync_dir
from nekomem.stores.layout import RECENT_FILE, STATE_DIR, TIME_INDEX_FILE, is_neko_folder
from nekomem.stores.snapshot_check import CheckedCharacter, SnapshotError
from nekomem.stores.timeindex import TimeIndex

STAGING_PREFIX = ".nkatmp-restore-"
ASIDE_PREFIX = ".nkatmp-replaced-"


def occupied(target: Path) -> bool:
    """True when ``target`` holds something a write must not silently replace (an empty
    folder, say one an interrupted older nekomem left, does not count)."""
    if not os.path.lexists(target):
        return False
    if target.is_dir() and not target.is_symlink():
        return any(True for _ in os.scandir(target))
    return True


@dataclass
class _Staged:
    name: str
    staging: Path
    target: Path
    aside: Path | None = None
    swapped: bool = False


def _build(character: CheckedCharacter, staging: Path, neko_folder: bool) -> None:
    # In a N.E.K.O. memory folder nekomem's files go to <name>/.nekomem/ and recent.json to
    # <name>/; the reference's files are written by the next adoption (start or /reload).
    folder = staging / STATE_DIR if neko_folder else staging
    for rel, data in character.files.items():
        atomic_write_bytes(staging / rel if rel == RECENT_FILE else folder / rel, data)
    for rel, data in character.logs.items():
        atomic_write_bytes(folder / rel, data)
    with TimeIndex(folder / TIME_INDEX_FILE) as db:
        db.restore_rows(character.rows, character.cursors, character.sequence)
    if folder != staging:
        fsync_dir(folder)
    fsync_dir(staging)


def write_characters(characters: list[CheckedCharacter], parent_of: Callable[[str], Path], *, replace: bool) -> list[Path]:
    """Put every character of ``characters`` in place under ``parent_of(name)`` (see the
    module) and return their folders. Raises SnapshotError, before anything is written,
    when a name comes twice or a target is occupied without ``replace``; OSError or
    sqlite3.Error when a write fails (nothing changed then)."""
    seen: set[str] = set()
    for character in characters:
        if character.name.casefold() in seen:
            raise SnapshotError(f"the character {character.name} comes twice (names may differ only in case on some systems)")
        seen.add(character.name.casefold())
    if not replace:
        taken = [c.name for c in characters if occupied(parent_of(c.name) / c.name)]
        if taken:
            raise SnapshotError(f"already there: {', '.join(taken)}")
    staged: list[_Staged] = []
    try:
        for character in characters:
            parent = parent_of(character.name)
            parent.mkdir(parents=True, exist_ok=True)
            entry = _Staged(character.name, Path(tempfile.mkdtemp(prefix=STAGING_PREFIX, dir=parent)), parent / character.name)
            staged.append(entry)
            _build(character, entry.staging, is_neko_folder(parent))
        try:
            for entry in staged:
                if os.path.lexists(entry.target):
                    entry.aside = Path(tempfile.mkdtemp(prefix=ASIDE_PREFIX, dir=entry.target.parent))
                    os.rename(entry.target, entry.aside / entry.name)
                os.rename(entry.staging, entry.target)
                entry.swapped = True
            for parent in {e.target.parent for e in staged}:
                fsync_dir(parent)
        except BaseException:
            _undo(staged)
            raise
    finally:
        for entry in staged:
            if not entry.swapped:
                shutil.rmtree(entry.staging, ignore_errors=True)
    for entry in staged:
        if entry.aside is not None:
            shutil.rmtree(entry.aside, ignore_errors=True)
    return [e.target for e in staged]


def _undo(staged: list[_Staged]) -> None:
    """Put back what the swap changed: each new folder out, each old folder in."""
    for entry in reversed(staged):
        if entry.swapped:
            os.rename(entry.target, entry.staging)
            entry.swapped = False
        if entry.aside is not None and os.path.lexists(entry.aside / entry.name):
            os.rename(entry.aside / entry.name, entry.target)
        if entry.aside is not None:
            shutil.rmtree(entry.aside, ignore_errors=True)
            entry.aside = None
