"""The recall index's documents by id, where the rows of a persisted segment cost nothing
until they are used.

A wake that loads a segment of 50,000 facts must not make 50,000 Python objects before it
answers: :class:`DocTable` keeps the segment's rows as arrays and an id -> row dict, and
makes a row's :class:`~nekomem.recall.entry.IndexedDoc` (itself without its entry until
that is read) the first time it is asked for. Otherwise it behaves as the plain dict it
replaces: insertion order (a segment's rows first, in row order), assignment to a present
id keeps its place, removal forgets it.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping

from nekomem.recall.entry import IndexedDoc
from nekomem.recall.segment import LoadedBase


class DocTable:
    """id -> :class:`IndexedDoc` (see the module)."""

    def __init__(self) -> None:
        self._docs: dict[str, IndexedDoc] = {}
        self._base: LoadedBase | None = None
        self._base_row: dict[str, int] = {}  # live segment rows, in row order
        self._base_docs: list[IndexedDoc | None] = []  # made (or replaced) segment rows
        self._base_tiers: set[str] = set()
        # Segment rows given a document of a tier the segment holds none of: the only rows
        # a feed of another tier (the reflections') can find among the segment's.
        self._base_strays: set[str] = set()

    def load_base(self, base: LoadedBase, id_row: dict[str, int]) -> None:
        """Hold ``base``'s rows (``id_row``: id -> row, in row order; kept as given).
        Raises ValueError when the table is not empty."""
        if self._docs or self._base_row:
            raise ValueError("a base is loaded into an empty table only")
        self._base = base
        self._base_row = id_row
        self._base_docs = [None] * len(base.ids)
        self._base_tiers = {base.tiers[t] for t in set(base.tier.tolist())}
        self._base_strays = set()

    def _row_doc(self, row: int) -> IndexedDoc:
        doc = self._base_docs[row]
        if doc is None:
            base = self._base
            assert base is not None
            start, end = float(base.start[row]), float(base.end[row])
            doc = self._base_docs[row] = IndexedDoc(
                None,
                None if start != start else start,  # NaN: no event time
                None if end != end else end,
                tier=base.tiers[int(base.tier[row])],
                source=base.decode,
                row=row,
            )
        return doc

    # -- the dict it replaces ---------------------------------------------------------
    def get(self, doc_id: str, default: IndexedDoc | None = None) -> IndexedDoc | None:
        doc = self._docs.get(doc_id)
        if doc is not None:
            return doc
        row = self._base_row.get(doc_id)
        return default if row is None else self._row_doc(row)

    def __getitem__(self, doc_id: str) -> IndexedDoc:
        doc = self.get(doc_id)
        if doc is None:
            raise KeyError(doc_id)
        return doc

    def __setitem__(self, doc_id: str, doc: IndexedDoc) -> None:
        row = self._base_row.get(doc_id)
        if row is None:
            self._docs[doc_id] = doc
        else:
            self._base_docs[row] = doc
            if doc.tier in self._base_tiers:
                self._base_strays.discard(doc_id)
            else:
                self._base_strays.add(doc_id)

    def __contains__(self, doc_id: object) -> bool:
        return doc_id in self._docs or doc_id in self._base_row

    def __len__(self) -> int:
        return len(self._docs) + len(self._base_row)

    def __bool__(self) -> bool:
        return bool(self._docs) or bool(self._base_row)

    def __eq__(self, other: object) -> bool:
        """Equal to a mapping (or table) of the same ids and documents, as a dict is."""
        if isinstance(other, DocTable):
            other = dict(other.items())
        return isinstance(other, Mapping) and dict(self.items()) == dict(other)

    __hash__ = None  # type: ignore[assignment]  # mutable, as a dict

    def __iter__(self) -> Iterator[str]:
        yield from self._base_row
        yield from self._docs

    def pop(self, doc_id: str, default: IndexedDoc | None = None) -> IndexedDoc | None:
        """Remove ``doc_id`` and return its document (``default`` when absent)."""
        row = self._base_row.pop(doc_id, None)
        if row is None:
            return self._docs.pop(doc_id, default)
        self._base_strays.discard(doc_id)
        doc = self._row_doc(row)
        self._base_docs[row] = None
        return doc

    def items(self) -> Iterator[tuple[str, IndexedDoc]]:
        """Every (id, document), making the segment rows' documents (not their entries)."""
        for doc_id, row in list(self._base_row.items()):
            yield doc_id, self._row_doc(row)
        yield from list(self._docs.items())

    def values(self) -> Iterator[IndexedDoc]:
        for _, doc in self.items():
            yield doc

    # -- what a plain dict could not do cheaply ---------------------------------------
    def tier_of(self, doc_id: str) -> str | None:
        """The tier of ``doc_id``'s document (None when absent), without making a segment
        row's document to tell it."""
        doc = self._docs.get(doc_id)
        if doc is not None:
            return doc.tier
        row = self._base_row.get(doc_id)
        if row is None:
            return None
        made = self._base_docs[row]
        if made is not None:
            return made.tier
        base = self._base
        assert base is not None
        return base.tiers[int(base.tier[row])]

    def ids_in_tiers(self, tiers: Collection[str]) -> list[str]:
        """The ids whose document is in one of ``tiers`` (a segment's rows are looked at
        one by one only when its tiers are partly in ``tiers``; none of them, but the rows
        given a document of another tier, when its tiers are not in ``tiers``)."""
        ids = [i for i, d in self._docs.items() if d.tier in tiers]
        wanted = self._base_tiers & set(tiers)
        if not wanted:
            strays = sorted(self._base_strays, key=self._base_row.__getitem__)
            rows: list[str] = [i for i in strays if self._row_doc(self._base_row[i]).tier in tiers]
        elif wanted == self._base_tiers and all(d is None or d.tier in tiers for d in self._base_docs):
            rows = list(self._base_row)
        else:
            rows = [i for i, r in self._base_row.items() if self._row_doc(r).tier in tiers]
        return rows + ids

    def unresolved(self) -> list[str]:
        """Ids of segment rows whose entry was neither decoded nor handed over."""
        return [i for i, r in self._base_row.items() if not self._row_doc(r).resolved]
