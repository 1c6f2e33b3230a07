"""File modes of the memory root: files 0600, folders 0700.

Every file of a character holds conversation text (the journal ``time_indexed.db`` and its
``-wal``/``-shm`` hold every turn), so no other user of the machine may read them. The
JSON views and logs are opened with 0600 where they are written; this module gives the
same to folders and to SQLite databases, which SQLite would create with the process's
umask (0644 under the usual one). SQLite creates a database's ``-wal`` and ``-shm`` with
the database file's own mode, so a database created 0600 keeps them 0600 too. On Windows
the modes are ignored (files inherit the folder's access list).
"""

from __future__ import annotations

import os
from pathlib import Path

FILE_MODE = 0o600
FOLDER_MODE = 0o700
SQLITE_SIDES = ("-wal", "-shm", "-journal")


def private_folder(path: Path) -> None:
    """Create ``path`` (and missing parents) as a folder only its owner can enter; an
    existing folder is left as it is. Raises OSError."""
    Path(path).mkdir(parents=True, exist_ok=True, mode=FOLDER_MODE)


def private_database(path: Path) -> None:
    """Before SQLite opens ``path``: create it empty with mode 0600 when missing (SQLite
    takes an empty file for a new database), and take group and other access away from an
    existing one and its side files (written 0644 by an older version). Raises OSError
    when the file cannot be created."""
    path = Path(path)
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), FILE_MODE))
        return
    except FileExistsError:
        pass
    for candidate in (path, *(Path(f"{path}{side}") for side in SQLITE_SIDES)):
        try:
            if os.stat(candidate).st_mode & 0o077:
                os.chmod(candidate, FILE_MODE)
        except OSError:
            continue  # absent, or not ours to change: SQLite reports what matters
