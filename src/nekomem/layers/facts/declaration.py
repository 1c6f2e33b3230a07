"""The fact layer's declaration: its files, its journal events (typed), its recall tiers,
and its place in the erasure relay, the browser, the scoped routes, the CLI and the
importer's report (see :mod:`nekomem.domain.layers`)."""

from __future__ import annotations

from typing import ClassVar

from nekomem.domain.layers import FACTS, CharacterFolder, Count, ForgetFlag, JournalEvent, LayerSpec, Scoped
from nekomem.domain.records import Fact
from nekomem.stores.layout import FACTS_ARCHIVE_FILE, FACTS_FILE, SELF_DISCLOSURE_FILE
from nekomem.stores.view_counts import list_length


class FactAdded(JournalEvent, frozen=True, kw_only=True):
    """A new fact (ignored when the archive already holds its id: replay after the move)."""

    type: ClassVar[str] = "fact.added"
    fact: Fact


class FactUpdated(JournalEvent, frozen=True, kw_only=True):
    """A stored fact replaced whole (an upgrade, an edit)."""

    type: ClassVar[str] = "fact.updated"
    fact: Fact


class FactAbsorbed(JournalEvent, frozen=True, kw_only=True):
    """Facts a reflection was synthesised from."""

    type: ClassVar[str] = "fact.absorbed"
    ids: list[str] = []


class FactArchived(JournalEvent, frozen=True, kw_only=True):
    """Facts moved to the archive."""

    type: ClassVar[str] = "fact.archived"
    ids: list[str] = []


class FactDeleted(JournalEvent, frozen=True, kw_only=True):
    """A forgotten fact's tombstone: its id only."""

    type: ClassVar[str] = "fact.deleted"
    id: str = ""


def disk_counts(paths: CharacterFolder) -> dict[str, Count]:
    """Active and archived facts, from their views."""
    return {"facts": list_length(paths.folder / FACTS_FILE), "facts_archived": list_length(paths.folder / FACTS_ARCHIVE_FILE)}


DECLARATION = LayerSpec(
    FACTS,
    "nekomem.layers.facts.actor:FactActor",
    files=(FACTS_FILE, FACTS_ARCHIVE_FILE, SELF_DISCLOSURE_FILE),
    events=(FactAdded, FactAbsorbed, FactArchived, FactUpdated, FactDeleted),
    tiers=("fact", "fact_archive"),
    vector_tiers=("fact",),
    listing="facts",
    outbox_ops=("extract_facts",),
    scrubs=("turns",),  # the extraction batch waiting for the model holds turns
    counts=("facts", "facts_archived"),
    disk_counts=disk_counts,
    scoped=Scoped("all", counts=(("facts", "active"), ("facts_archived", "archived"))),
    forget=ForgetFlag("fact", "fact"),
    import_counts=("facts", "facts_archive"),
)
