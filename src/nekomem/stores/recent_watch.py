"""Outside edits of recent.json (the reference's memory browser rewrites the file itself,
then calls ``/cancel_correction``).

:class:`RecentWatch` remembers the identity of the file as nekomem last wrote or read it
(inode, size, mtime in ns). :meth:`RecentWatch.changed` tells whether someone else has
replaced it since; the owner then adopts the file's content instead of overwriting it, and
:func:`journal_adoption` appends the window it replaces to ``recent_edits.ndjson``, so that
neither side's version is lost (the raw journal, time_indexed.db, keeps every message
anyway; this file also keeps the summary memo, which exists nowhere else).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

EDITS_FILE = "recent_edits.ndjson"

log = logging.getLogger("nekomem.recent_watch")

Identity = tuple[int, int, int]


def identity(path: Path) -> Identity | None:
    """(inode, size, mtime_ns) of ``path``, or None when it does not exist."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


class RecentWatch:
    """The last known identity of one recent.json."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.known: Identity | None = identity(path)

    def remember(self, written: os.stat_result | None = None) -> None:
        """Call after nekomem itself wrote (or read) the file; ``written`` is the stat of
        what it wrote, when it has one (saves a stat)."""
        if written is not None:
            self.known = (written.st_ino, written.st_size, written.st_mtime_ns)
        else:
            self.known = identity(self.path)

    def changed(self) -> bool:
        """True when the file on disk is not the one nekomem last wrote or read (replaced,
        rewritten or deleted by someone else). Raises nothing."""
        try:
            return identity(self.path) != self.known
        except OSError:
            return False


def journal_adoption(folder: Path, at: str, replaced: list[dict[str, Any]], adopted: list[dict[str, Any]], reason: str) -> None:
    """Append one adoption record (the window replaced and the one adopted) to
    ``recent_edits.ndjson`` in ``folder``, fsynced. A folder that is gone (deleted from
    outside) is logged, not raised: there is nothing left to keep it next to."""
    line = json.dumps({"at": at, "reason": reason, "replaced": replaced, "adopted": adopted}, ensure_ascii=False)
    try:
        with open(folder / EDITS_FILE, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")
            fh.flush()
            os.fsync(fh.fileno())
    except FileNotFoundError:
        log.warning("the character folder is gone; an outside edit of recent.json was not journaled")
