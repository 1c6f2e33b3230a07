"""The persona layer's declaration: its files, its journal events (typed), and its place
in the erasure relay, the browser, the scoped routes, the CLI and the importer's report
(see :mod:`nekomem.domain.layers`)."""

from __future__ import annotations

from typing import ClassVar

from nekomem.domain.layers import PERSONA, CharacterFolder, Count, ForgetFlag, JournalEvent, LayerSpec, Scoped
from nekomem.domain.records import Correction, PersonaEntry
from nekomem.stores.layout import PERSONA_ARCHIVE_DIR, PERSONA_CORRECTIONS_FILE, PERSONA_FILE
from nekomem.stores.view_counts import list_length, section_entries


class PersonaChange(JournalEvent, frozen=True, kw_only=True):
    """An entry of ``entity`` written whole, at ``index`` of its section (appended when
    out of range), or into the archive shard ``archive_shard`` when named."""

    entity: str
    entry: PersonaEntry
    archive_shard: str | None = None
    index: int | None = None


class PersonaFactAdded(PersonaChange, frozen=True, kw_only=True):
    type: ClassVar[str] = "persona.fact_added"


class PersonaFactMentioned(PersonaChange, frozen=True, kw_only=True):
    type: ClassVar[str] = "persona.fact_mentioned"


class PersonaSuppressed(PersonaChange, frozen=True, kw_only=True):
    type: ClassVar[str] = "persona.suppressed"


class PersonaEvidenceUpdated(PersonaChange, frozen=True, kw_only=True):
    type: ClassVar[str] = "persona.evidence_updated"


class PersonaEntryUpdated(PersonaChange, frozen=True, kw_only=True):
    type: ClassVar[str] = "persona.entry_updated"


class PersonaEntryDeleted(JournalEvent, frozen=True, kw_only=True):
    """A forgotten entry's tombstone: its id only."""

    type: ClassVar[str] = "persona.entry_deleted"
    id: str


class CorrectionsChanged(JournalEvent, frozen=True, kw_only=True):
    """The contradiction queue replaced whole."""

    corrections: list[Correction]


class CorrectionQueued(CorrectionsChanged, frozen=True, kw_only=True):
    type: ClassVar[str] = "correction.queued"


class CorrectionResolved(CorrectionsChanged, frozen=True, kw_only=True):
    type: ClassVar[str] = "correction.resolved"


def disk_counts(paths: CharacterFolder) -> dict[str, Count]:
    """Persona entries and queued corrections, from their views."""
    return {
        "persona": section_entries(paths.folder / PERSONA_FILE),
        "corrections": list_length(paths.folder / PERSONA_CORRECTIONS_FILE),
    }


DECLARATION = LayerSpec(
    PERSONA,
    "nekomem.layers.persona.actor:PersonaActor",
    files=(PERSONA_FILE, PERSONA_CORRECTIONS_FILE, PERSONA_ARCHIVE_DIR),
    events=(
        PersonaFactAdded,
        PersonaFactMentioned,
        PersonaSuppressed,
        PersonaEvidenceUpdated,
        PersonaEntryUpdated,
        PersonaEntryDeleted,
        CorrectionQueued,
        CorrectionResolved,
    ),
    listing="persona",
    scrubs=("entries",),  # a queued contradiction may quote an erased reflection's text
    counts=("persona", "corrections"),
    disk_counts=disk_counts,
    scoped=Scoped(None, counts=(("persona", None),)),
    forget=ForgetFlag("persona", "persona entry"),
    import_counts=("persona", "persona_corrections"),
)
