"""What an import did: counts per layer and everything it could not read."""

from __future__ import annotations

import msgspec

from nekomem.domain.layers import layers

# Rows of a character's report that no layer owns: the cursors.
SHARED_ROWS: tuple[str, ...] = ("cursors",)


def report_rows() -> tuple[str, ...]:
    """The rows of a character's report: every declared layer's ``import_counts`` in start
    order, then the shared ones."""
    return tuple(row for spec in layers() for row in spec.import_counts) + SHARED_ROWS


class LayerCount(msgspec.Struct, kw_only=True):
    """``read``: valid records found in the source; ``added``: written to the target;
    ``unchanged``: already there (a repeated import); ``skipped``: valid but not taken
    (a duplicate text, or a target window that already holds another conversation)."""

    read: int = 0
    added: int = 0
    unchanged: int = 0
    skipped: int = 0


class Problem(msgspec.Struct, kw_only=True):
    """One thing of the source that was not imported, and why. ``record`` names the row or
    record (an id, a list index, a SQLite row id) when the problem is that narrow."""

    character: str
    layer: str
    file: str
    reason: str
    record: str | None = None


class CharacterReport(msgspec.Struct, kw_only=True):
    name: str
    created: bool = False
    layers: dict[str, LayerCount] = msgspec.field(default_factory=lambda: {name: LayerCount() for name in report_rows()})

    def count(self, layer: str) -> LayerCount:
        return self.layers[layer]

    @property
    def added(self) -> int:
        return sum(c.added for c in self.layers.values())

    @property
    def read(self) -> int:
        return sum(c.read for c in self.layers.values())


class ImportReport(msgspec.Struct, kw_only=True):
    """The whole answer of an import (the CLI prints it as JSON; the route returns it)."""

    source_dir: str
    memory_root: str
    characters: list[CharacterReport] = msgspec.field(default_factory=list)
    problems: list[Problem] = msgspec.field(default_factory=list)
    # Source files nekomem has no layer for (process-wide state, the source's own bookkeeping).
    ignored_files: list[str] = msgspec.field(default_factory=list)

    @property
    def added(self) -> int:
        return sum(c.added for c in self.characters)

    @property
    def read(self) -> int:
        return sum(c.read for c in self.characters)

    def to_builtins(self) -> dict[str, object]:
        out: dict[str, object] = msgspec.to_builtins(self)
        out["added_total"] = self.added
        out["problems_total"] = len(self.problems)
        return out
