"""The reflection layer's declaration: its files, its journal events (typed), its recall
tier and its place in the browser, the scoped routes, the CLI and the importer's report
(see :mod:`nekomem.domain.layers`)."""

from __future__ import annotations

from typing import ClassVar

from nekomem.domain.layers import REFLECTIONS, CharacterFolder, Count, ForgetFlag, JournalEvent, LayerSpec, Scoped
from nekomem.domain.records import Reflection, SurfacedEntry
from nekomem.stores.layout import REFLECTION_ARCHIVE_DIR, REFLECTIONS_FILE, SURFACED_FILE
from nekomem.stores.view_counts import archived_items, status_counts

# The statuses the browser counts a live character's reflections by.
STATUSES = ("pending", "confirmed", "promoted", "denied", "merged", "promote_blocked")


class ReflectionChange(JournalEvent, frozen=True, kw_only=True):
    """A reflection written whole (into the archive shard ``archive_shard`` when named),
    and/or the surfaced list replaced."""

    reflection: Reflection | None = None
    archive_shard: str | None = None
    surfaced: list[SurfacedEntry] | None = None


class ReflectionSynthesized(ReflectionChange, frozen=True, kw_only=True):
    """A new reflection (ignored when its id is already held: a replay)."""

    type: ClassVar[str] = "reflection.synthesized"


class ReflectionStateChanged(ReflectionChange, frozen=True, kw_only=True):
    type: ClassVar[str] = "reflection.state_changed"


class ReflectionSurfaced(ReflectionChange, frozen=True, kw_only=True):
    type: ClassVar[str] = "reflection.surfaced"


class ReflectionRebutted(ReflectionChange, frozen=True, kw_only=True):
    type: ClassVar[str] = "reflection.rebutted"


class ReflectionEvidenceUpdated(ReflectionChange, frozen=True, kw_only=True):
    type: ClassVar[str] = "reflection.evidence_updated"


class ReflectionUpdated(ReflectionChange, frozen=True, kw_only=True):
    type: ClassVar[str] = "reflection.updated"


class ReflectionDeleted(JournalEvent, frozen=True, kw_only=True):
    """A forgotten reflection's tombstone: its id only."""

    type: ClassVar[str] = "reflection.deleted"
    id: str = ""


def disk_counts(paths: CharacterFolder) -> dict[str, Count]:
    """Reflections per status from the view, the archived shards counted as ``archived``."""
    counts = status_counts(paths.folder / REFLECTIONS_FILE)
    counts["archived"] = counts.get("archived", 0) + len(archived_items(paths.folder / REFLECTION_ARCHIVE_DIR))
    return {"reflections": counts}


DECLARATION = LayerSpec(
    REFLECTIONS,
    "nekomem.layers.reflections.actor:ReflectionActor",
    files=(REFLECTIONS_FILE, SURFACED_FILE, REFLECTION_ARCHIVE_DIR),
    events=(
        ReflectionSynthesized,
        ReflectionStateChanged,
        ReflectionSurfaced,
        ReflectionRebutted,
        ReflectionEvidenceUpdated,
        ReflectionUpdated,
        ReflectionDeleted,
    ),
    tiers=("reflection",),
    vector_tiers=("reflection",),
    listing="reflections",
    counts=("reflections",),
    disk_counts=disk_counts,
    scoped=Scoped(None, counts=(("reflections", None),)),
    forget=ForgetFlag("reflection", "reflection"),
    import_counts=("reflections", "reflection_archive", "surfaced"),
)
