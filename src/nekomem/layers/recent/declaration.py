"""The recent layer's declaration: the raw journal (``time_indexed.db``), the window and
its state (see :mod:`nekomem.domain.layers`)."""

from __future__ import annotations

from nekomem.domain.layers import RECENT, CharacterFolder, Count, LayerSpec
from nekomem.stores.layout import RECENT_FILE, RECENT_META_FILE, TIME_INDEX_FILE
from nekomem.stores.view_counts import list_length


def disk_counts(paths: CharacterFolder) -> dict[str, Count]:
    """The window's length, from ``recent.json`` (in a N.E.K.O. memory folder, the
    reference's own copy: the one both share)."""
    return {"recent": list_length(paths.home / RECENT_FILE)}


DECLARATION = LayerSpec(
    RECENT,
    "nekomem.layers.recent.actor:RecentActor",
    files=(RECENT_FILE, RECENT_META_FILE, TIME_INDEX_FILE),
    counts=("recent",),
    disk_counts=disk_counts,
    import_counts=("recent", "recent_meta", "journal"),
)
