"""Settings of ``nekomem import-neko`` and ``POST /api/import/neko``."""

from __future__ import annotations

from typing import Annotated

from nekomem.config.base import Section, doc


class ImportSettings(Section, frozen=True):
    import_source_timezone: Annotated[
        str,
        doc(
            "IANA time zone in which the imported reference folder wrote its naive local times (empty: this machine's local zone); imported times keep that offset."
        ),
    ] = ""
    import_progress_min_records: Annotated[
        int,
        doc(
            "A progress bar is drawn on stderr (when it is a terminal) only for folders with at least this many records; --progress forces it.",
            ge=0,
        ),
    ] = 2000
    import_character_timeout_seconds: Annotated[
        float,
        doc(
            "How long POST /api/import/neko waits for a busy character to go idle (and for another import, export or deletion of it to end) before it reports that character as not imported.",
            gt=0,
        ),
    ] = 60.0
    external_import_max_entries: Annotated[
        int, doc("Most candidates POST /internal/memory/import_external_markdown takes in one request (more: 400, as the reference).", ge=1)
    ] = 500
    external_import_max_entry_chars: Annotated[
        int, doc("Longest candidate text POST /internal/memory/import_external_markdown takes (longer: 400).", ge=1)
    ] = 4000

    restore_max_depth: Annotated[
        int,
        doc(
            "Deepest JSON nesting nekomem import and restore accept in a character's views, log lines and stored turns "
            "(nekomem's own files nest about 6 levels); a deeper document is refused before anything is written.",
            ge=8,
            le=500,
        ),
    ] = 64
    restore_read_timeout_seconds: Annotated[
        float,
        doc(
            "Longest time nekomem restore spends reading one character's time_indexed.db from the source folder; "
            "a journal that takes longer is refused (nothing is written).",
            gt=0,
        ),
    ] = 300.0

    import_root: Annotated[
        str,
        doc(
            "The only folder POST /api/import/neko reads from: its source_dir must be this folder or lie under it (symbolic links "
            "resolved); any other path is answered 403 'outside_import_root' before it is looked at, so the route reveals nothing "
            "about the server's other folders. Empty: every place N.E.K.O. keeps its data directory on this platform "
            "(NEKO_STORAGE_SELECTED_ROOT; Linux $XDG_DATA_HOME/N.E.K.O, ~/.local/share/N.E.K.O, $XDG_DOCUMENTS_DIR/N.E.K.O, "
            "~/Documents/N.E.K.O; macOS ~/Library/Application Support/N.E.K.O, ~/Documents/N.E.K.O; Windows "
            "%LOCALAPPDATA%\\N.E.K.O, ~/Documents/N.E.K.O). The nekomem import-neko command is not restricted."
        ),
    ] = ""
