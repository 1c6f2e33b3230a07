"""``nekomem import-neko``: an offline import into the memory root of the settings."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TextIO

import msgspec

from nekomem.config import Settings
from nekomem.importer import progress as bars
from nekomem.importer.neko import count_records, plan, run_import
from nekomem.importer.neko_source import SourceError
from nekomem.stores import rootlock
from nekomem.stores.rootlock import RootLocked

log = logging.getLogger(__name__)


def import_neko(
    settings: Settings,
    source_dir: str,
    characters: list[str] | None,
    *,
    show_progress: bool,
    out: TextIO,
    err: TextIO,
) -> int:
    """Import ``source_dir`` while holding the memory root exclusively; print the report
    (JSON) to ``out`` and a summary to ``err``. Returns the exit code: 0 imported (the
    report lists what could not be read), 1 refused (a server holds the root, or the
    source cannot be imported)."""
    root = Path(settings.server.memory_root).expanduser()
    try:
        report, sources = plan(Path(source_dir), root, settings, characters)
        with rootlock.acquire(root, "exclusive", "import-neko"):
            total = count_records(sources) if show_progress or err.isatty() else 0
            bar = (
                bars.ProgressBar(total, err, "import-neko")
                if bars.wanted(show_progress, err, total, settings.importer.import_progress_min_records)
                else None
            )
            if bar is None:
                run_import(report, sources, settings, progress=lambda n: None)
            else:
                with bar.above_logs():  # a log line during the import never lands inside the bar
                    run_import(report, sources, settings, progress=bar)
                bar.finish(report.read)
    except (RootLocked, SourceError) as exc:
        print(f"nekomem import-neko: {exc}", file=err)
        return 1
    out.write(msgspec.json.format(msgspec.json.encode(report.to_builtins())).decode("utf-8") + "\n")
    names = ", ".join(f"{c.name} (+{c.added})" for c in report.characters) or "nothing"
    print(
        f"nekomem import-neko: {report.read} records read, {report.added} added: {names}; "
        f"{len(report.problems)} problems (see 'problems' in the report)",
        file=err,
    )
    return 0
