"""The facts' recall segment on disk: when it is trusted, how it is read, when it is written.

A character's facts (``facts.json`` and ``facts_archive.json``) are most of its recall
index, and re-tokenising them is most of a long memory's wake. RecallActor writes the fact
rows of its index to ``recall_segment.bin`` (:mod:`nekomem.recall.segment`: token hashes,
no text) when it stops, and loads it at the next wake instead of waiting for the facts'
feed; the offline import writes one for what it imported.

Trusted only when everything it describes is as it was: the segment's header names the
identity (inode, size, mtime) of ``facts.json``, ``facts_archive.json``, ``events.ndjson``
and ``events_applied.json`` when it was written, and a fingerprint of everything that
shapes the index (the recall settings, the stop names, the display time zone, the opaque
bounds, the nekomem version). Any difference, a damaged file, or a segment of another
version: ignored (logged at INFO) and rebuilt from the views as before; so a lost, stale or
torn segment only costs a rebuild. The journal's identity is part of it because a change
journaled but not yet in the views (a crash, a power loss) would otherwise be invisible.

A row's entry is read from its view by byte range only when a query returns it (the first
queries of a wake); when the facts' feed arrives and its views are the same files, the
feed's entries are taken as they are (:meth:`RecallIndex.adopt`) and the view files are
closed. The segment is written only when the facts owner has no event its views lack, so
its rows are exactly the indexable records of those views.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import tzinfo
from pathlib import Path

import msgspec
import numpy as np

from nekomem import __version__
from nekomem.config.settings import Settings
from nekomem.domain import vector_codec
from nekomem.domain.index_entry import IndexEntry
from nekomem.domain.layers import FACTS, tier_family
from nekomem.domain.records import Fact
from nekomem.layers.facts.state import clipped_fact, fact_index_entry
from nekomem.recall.index import RecallIndex, StoredVectors
from nekomem.recall.query_text import LexicalAnalyzer, stop_names_for
from nekomem.recall.segment import (
    LexicalArrays,
    LoadedBase,
    SegmentError,
    decode_ids,
    encode_ids,
    encode_segment,
    read_header,
    read_segment,
)
from nekomem.stores.atomic import atomic_write_bytes, file_identity
from nekomem.stores.layout import CharacterPaths

log = logging.getLogger(__name__)

FACT_TIERS: tuple[str, ...] = tier_family("fact")
Identity = list[int] | None


class _Id(msgspec.Struct):
    id: str


class _Cached(msgspec.Struct):
    """What a fact record says of its cached vector (the rest of the record is skipped)."""

    id: str
    text: str = ""
    embedding: object = None
    embedding_model_id: str | None = None
    embedding_text_sha256: str | None = None


_IDS = msgspec.json.Decoder(list[_Id])
_CACHED = msgspec.json.Decoder(list[_Cached])
_RAWS = msgspec.json.Decoder(list[msgspec.Raw])
_FACT = msgspec.json.Decoder(Fact, strict=False)


def analyzer_for(settings: Settings, name: str) -> LexicalAnalyzer:
    """The lexical analyzer of character ``name``'s recall index (its stop names: the
    master's, the character's and recall_extra_stop_names)."""
    s = settings.recall
    return LexicalAnalyzer(s, stop_names_for([settings.recent.master_name, name, *s.recall_extra_stop_names]))


def fingerprint(settings: Settings, analyzer: LexicalAnalyzer) -> str:
    """A digest of everything that shapes a character's recall index rows."""
    server = settings.server
    shape = {
        "nekomem": __version__,
        "stop_names": list(analyzer.stop_names),
        "recall": msgspec.to_builtins(settings.recall),
        "display_timezone": server.display_timezone,
        "opaque": [server.opaque_max_depth, server.opaque_max_bytes],
    }
    return hashlib.sha256(json.dumps(shape, sort_keys=True, default=str).encode()).hexdigest()


def _sources(paths: CharacterPaths) -> tuple[Path, Path]:
    return paths.facts, paths.facts_archive


def views_stamp(paths: CharacterPaths) -> list[Identity]:
    """The identities of the facts' views (what FactActor's feed says it holds)."""
    return [_identity(p) for p in _sources(paths)]


def _identity(path: Path) -> Identity:
    found = file_identity(path)
    return None if found is None else list(found)


def tied_stamp(paths: CharacterPaths) -> list[Identity]:
    """The identities a segment is tied to: the facts' views and the journal."""
    return views_stamp(paths) + [_identity(paths.events), _identity(paths.events_applied)]


class FactRows:
    """The facts' view files a segment's rows point into, opened when the segment was
    found current (so a later rewrite of a view does not move the bytes under a row)."""

    def __init__(self, paths: CharacterPaths, stamp: Sequence[Identity], settings: Settings) -> None:
        self._fds: list[int | None] = []
        self._server = settings.server
        try:
            for path, identity in zip(_sources(paths), stamp, strict=True):
                if identity is None:
                    self._fds.append(None)
                    continue
                fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
                self._fds.append(fd)
                st = os.fstat(fd)
                if [st.st_ino, st.st_size, st.st_mtime_ns] != identity:
                    raise SegmentError(f"{path.name} changed while the segment was read")
        except BaseException:
            self.close()
            raise

    def entry(self, source: int, start: int, end: int, tier: str) -> IndexEntry:
        """The index entry of the record at ``[start, end)`` of view ``source``. Raises
        OSError, msgspec errors or SegmentError when it cannot be read."""
        fd = self._fds[source] if 0 <= source < len(self._fds) else None
        if fd is None:
            raise SegmentError("the row's view is closed or missing")
        fact = clipped_fact(_FACT.decode(os.pread(fd, end - start, start)), self._server.opaque_max_depth, self._server.opaque_max_bytes)
        return fact_index_entry(fact, tier)

    def close(self) -> None:
        """Close the view files (a row not decoded by then cannot be any more)."""
        for fd in self._fds:
            if fd is not None:
                os.close(fd)
        self._fds = [None] * len(self._fds)


@dataclass
class Loaded:
    """A segment found current: its base for the index, its open views, its header."""

    base: LoadedBase
    rows: FactRows
    stamp: list[Identity]
    payload_fingerprint: str


def looks_current(paths: CharacterPaths, settings: Settings, analyzer: LexicalAnalyzer) -> bool:
    """Whether the facts' segment of ``paths`` is, by its header alone, current (made with
    these settings, tied to the files as they are): a glance at wake, a few hundred bytes
    and four ``stat`` calls, so that recall asks the facts owner for its feed at once when
    the segment will not serve. :func:`load` still checks the whole file; nothing raises."""
    try:
        header = read_header(paths.recall_segment)
    except (OSError, SegmentError):
        return False
    return header.get("fingerprint") == fingerprint(settings, analyzer) and header.get("tied") == tied_stamp(paths)


def load(paths: CharacterPaths, settings: Settings, analyzer: LexicalAnalyzer) -> Loaded | None:
    """The facts' segment of ``paths`` when it is current (see the module), else None (the
    reason logged at INFO; nothing raises)."""
    path = paths.recall_segment
    try:
        header, arrays = read_segment(path)
    except FileNotFoundError:
        return None
    except (OSError, SegmentError) as exc:
        log.info("recall segment ignored (%s); the index is rebuilt from the views", exc)
        return None
    if header.get("fingerprint") != fingerprint(settings, analyzer):
        log.info("recall segment ignored (made with other settings or another version); the index is rebuilt")
        return None
    stamp = tied_stamp(paths)
    if header.get("tied") != stamp:
        log.info("recall segment ignored (the views or the journal changed since it was written); the index is rebuilt")
        return None
    try:
        base, rows = _base(paths, settings, header, arrays, stamp)
    except (OSError, SegmentError, KeyError, TypeError, ValueError) as exc:
        log.info("recall segment ignored (%s); the index is rebuilt from the views", exc)
        return None
    return Loaded(base=base, rows=rows, stamp=stamp, payload_fingerprint=str(header.get("fingerprint")))


def _base(
    paths: CharacterPaths, settings: Settings, header: dict[str, object], arrays: dict[str, np.ndarray], stamp: list[Identity]
) -> tuple[LoadedBase, FactRows]:
    count = header["rows"]
    tiers = header["tiers"]
    if not isinstance(count, int) or not isinstance(tiers, list) or not all(t in FACT_TIERS for t in tiers):
        raise SegmentError("bad header")
    for name in ("tier", "start", "end", "private", "source", "rec_start", "rec_end", "dl"):
        if arrays[name].shape[0] != count:
            raise SegmentError(f"array {name} does not match the rows")
    if arrays["tier"].shape[0] and int(arrays["tier"].max()) >= len(tiers):
        raise SegmentError("bad tier codes")
    ids = decode_ids(arrays["ids"], count)
    lexical = LexicalArrays(
        term_hash=arrays["term_hash"], term_ptr=arrays["term_ptr"], rows=arrays["rows"], tfs=arrays["tfs"], dl=arrays["dl"]
    )
    if lexical.term_ptr.shape[0] != lexical.term_hash.shape[0] + 1 or (lexical.rows.shape[0] and int(lexical.rows.max()) >= count):
        raise SegmentError("bad postings")
    rows = FactRows(paths, stamp[:2], settings)
    tier, source, rec_start, rec_end = arrays["tier"], arrays["source"], arrays["rec_start"], arrays["rec_end"]
    names = [str(t) for t in tiers]

    def decode(row: int) -> IndexEntry:
        return rows.entry(int(source[row]), int(rec_start[row]), int(rec_end[row]), names[int(tier[row])])

    base = LoadedBase(
        ids=ids,
        tiers=names,
        tier=tier,
        start=arrays["start"],
        end=arrays["end"],
        private=arrays["private"],
        lexical=lexical,
        decode=decode,
    )
    return base, rows


def _record_ranges(path: Path) -> dict[str, tuple[int, int]] | None:
    """id -> byte range of each record of the JSON list view ``path`` (empty when it is
    missing); None when it does not decode as a list of records with ids."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return {}
    try:
        raws = _RAWS.decode(data)
        ids = _IDS.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    parts = [bytes(raw) for raw in raws]
    ranges = _compact_ranges(data, ids, parts)
    if ranges is not None:
        return ranges
    # Another layout (an edit by hand, say): a Raw decoded from bytes is a view into them,
    # so its address gives its place. Checked byte for byte, so a msgspec that copied would
    # only cost the segment, never a wrong row.
    origin = np.frombuffer(data, dtype=np.uint8).ctypes.data
    ranges = {}
    for record, raw, part in zip(ids, raws, parts, strict=True):
        start = np.frombuffer(memoryview(raw), dtype=np.uint8).ctypes.data - origin if part else -1
        end = start + len(part)
        if start < 0 or end > len(data) or data[start:end] != part:
            return None
        ranges[record.id] = (start, end)
    return ranges


def _compact_ranges(data: bytes, ids: list[_Id], parts: list[bytes]) -> dict[str, tuple[int, int]] | None:
    """The records' byte ranges when the file is laid out as the server writes its views
    (``[`` then the records joined by ``,``, no space between), each checked byte for byte;
    None at the first record found elsewhere. A stop writes the segment of a long memory
    after every change of its facts: this walk costs a slice per record, where asking each
    record's address costs an array and a ctypes object."""
    ranges: dict[str, tuple[int, int]] = {}
    start = 1
    if not data.startswith(b"["):
        return None
    for record, part in zip(ids, parts, strict=True):
        end = start + len(part)
        if data[start:end] != part:
            return None
        ranges[record.id] = (start, end)
        start = end + 1  # the comma (or the closing bracket after the last)
    return ranges


def encode_fact_segment(paths: CharacterPaths, settings: Settings, analyzer: LexicalAnalyzer, index: RecallIndex) -> bytes | None:
    """The segment of ``index``'s fact rows, tied to the files as they are now; None when
    the views do not hold every row (the reason logged at INFO). Raises OSError."""
    stamp = tied_stamp(paths)
    located: list[dict[str, tuple[int, int]]] = []
    for path in _sources(paths):
        ranges = _record_ranges(path)
        if ranges is None:
            log.info("recall segment not written: %s is not a list of records", path.name)
            return None
        located.append(ranges)
    ids, docs = index.family_rows(FACT_TIERS)
    count = len(ids)
    source = np.zeros(count, dtype=np.uint8)
    rec_start = np.zeros(count, dtype=np.int64)
    rec_end = np.zeros(count, dtype=np.int64)
    for row, (doc_id, doc) in enumerate(zip(ids, docs, strict=True)):
        src = FACT_TIERS.index(doc.tier)
        where = located[src].get(doc_id)
        if where is None:
            log.info("recall segment not written: an indexed fact is not in %s", _sources(paths)[src].name)
            return None
        source[row], (rec_start[row], rec_end[row]) = src, where
    tiers = list(FACT_TIERS)
    lexical = index.lexical.export(ids)
    arrays = {
        "ids": encode_ids(ids),
        "tier": np.array([tiers.index(d.tier) for d in docs], dtype=np.uint8),
        "start": np.array([np.nan if d.start is None else d.start for d in docs], dtype=np.float64),
        "end": np.array([np.nan if d.end is None else d.end for d in docs], dtype=np.float64),
        "private": np.array([index.subjects.is_private_id(i) for i in ids], dtype=np.uint8),
        "source": source,
        "rec_start": rec_start,
        "rec_end": rec_end,
        "dl": lexical.dl,
        "term_hash": lexical.term_hash,
        "term_ptr": lexical.term_ptr,
        "rows": lexical.rows,
        "tfs": lexical.tfs,
    }
    if tied_stamp(paths) != stamp:
        log.info("recall segment not written: the views changed while it was made")
        return None
    header = {"rows": count, "tiers": tiers, "tied": stamp, "fingerprint": fingerprint(settings, analyzer), "owner": FACTS}
    return encode_segment(header, arrays)


# -- the facts' cached vectors (recall_vectors.bin) -----------------------------------
# With embeddings on, a wake needed every fact's cached vector: the facts' feed (a decode of
# facts.json) and a base64 decode per vector, seconds for a long memory. The vectors the
# views cache for the model in use are kept beside the segment as one float16 block (the
# bytes the base64 holds), tied to the same files: a wake whose segment and block are both
# current takes the vectors from the block and never waits for the feed.
VECTORS_KIND = "fact-vectors"


def encode_vectors(paths: CharacterPaths, model: str, dim: int) -> bytes | None:
    """The vector block of the facts' views for ``model`` (``dim`` wide): every record whose
    cached vector is of that model and of its text as it is, in view order; tied to the
    files as they are now. None when a view is not a list of records or the views changed
    while it was made (logged at INFO). Raises OSError."""
    stamp = tied_stamp(paths)
    width = dim * 2
    ids: list[str] = []
    chunks: list[bytes] = []
    for path in _sources(paths):
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            continue
        try:
            records = _CACHED.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError):
            log.info("recall vectors not written: %s is not a list of records", path.name)
            return None
        for record in records:
            vector = record.embedding
            if record.embedding_model_id != model or not isinstance(vector, str) or not vector:
                continue
            try:
                sha = hashlib.sha256(record.text.encode("utf-8")).hexdigest()
            except UnicodeEncodeError:
                continue  # no vector is cached for a text that does not encode
            if record.embedding_text_sha256 != sha:
                continue
            raw = vector_codec.wire_bytes(vector)
            if raw is not None and len(raw) == width:
                ids.append(record.id)
                chunks.append(raw)
    if tied_stamp(paths) != stamp:
        log.info("recall vectors not written: the views changed while they were read")
        return None
    header = {"kind": VECTORS_KIND, "rows": len(ids), "dim": dim, "model": model, "tied": stamp, "owner": FACTS}
    return encode_segment(header, {"ids": encode_ids(ids), "wire": np.frombuffer(b"".join(chunks), dtype=np.uint8)})


def vectors_current(paths: CharacterPaths, model: str | None) -> bool:
    """Whether the vector block's header says it is tied to the files as they are (and, when
    ``model`` is given, of that model): a glance, nothing raises."""
    try:
        header = read_header(paths.recall_vectors)
    except (OSError, SegmentError):
        return False
    return (
        header.get("kind") == VECTORS_KIND and header.get("tied") == tied_stamp(paths) and (model is None or header.get("model") == model)
    )


def load_vectors(paths: CharacterPaths) -> StoredVectors | None:
    """The vector block when it is whole and tied to the files as they are, else None (the
    reason logged at INFO; nothing raises)."""
    try:
        header, arrays = read_segment(paths.recall_vectors)
    except FileNotFoundError:
        return None
    except (OSError, SegmentError) as exc:
        log.info("recall vectors ignored (%s); the facts' feed brings them", exc)
        return None
    try:
        rows, dim, model = header["rows"], header["dim"], header["model"]
        if header.get("kind") != VECTORS_KIND or not isinstance(rows, int) or not isinstance(dim, int) or not isinstance(model, str):
            raise SegmentError("bad header")
        if header.get("tied") != tied_stamp(paths):
            log.info("recall vectors ignored (the views or the journal changed since they were written)")
            return None
        wire = arrays["wire"]
        if dim <= 0 or wire.shape[0] != rows * dim * 2:
            raise SegmentError("the block does not match its rows")
        ids = decode_ids(arrays["ids"], rows)
    except (KeyError, SegmentError) as exc:
        log.info("recall vectors ignored (%s); the facts' feed brings them", exc)
        return None
    return StoredVectors(model=model, ids=ids, wire=wire.view(vector_codec.WIRE_DTYPE).reshape(rows, dim))


def write_vectors(paths: CharacterPaths, data: bytes) -> None:
    """Write a vector block's bytes (atomically and durably). Raises OSError."""
    atomic_write_bytes(paths.recall_vectors, data)


def discard_vectors(paths: CharacterPaths) -> None:
    """Remove the vector block, if any: the facts changed (a forgotten fact's vector must
    not outlive it on disk), or it could no longer be current."""
    try:
        paths.recall_vectors.unlink()
    except FileNotFoundError:
        pass


def write(paths: CharacterPaths, data: bytes) -> None:
    """Write a segment's bytes (atomically and durably). Raises OSError."""
    atomic_write_bytes(paths.recall_segment, data)


def discard(paths: CharacterPaths) -> None:
    """Remove the segment file, if any (it would no longer be current)."""
    try:
        paths.recall_segment.unlink()
    except FileNotFoundError:
        pass


def build_offline(paths: CharacterPaths, settings: Settings, name: str, tz: tzinfo) -> bool:
    """Index a quiet character's facts from its views and write its segment (the offline
    import does, so the first wake after it loads the segment). True when one was
    written. Raises OSError."""
    analyzer = analyzer_for(settings, name)
    index = RecallIndex(settings.recall, tz, analyzer)
    entries: list[IndexEntry] = []
    for path, tier in zip(_sources(paths), FACT_TIERS, strict=True):
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            continue
        try:
            facts = msgspec.json.decode(data, type=list[Fact], strict=False)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return False  # the server reads such a view record by record; it will index it
        server = settings.server
        entries += [fact_index_entry(clipped_fact(f, server.opaque_max_depth, server.opaque_max_bytes), tier) for f in facts]
    index.upsert(entries, replace_tier="fact")
    data_out = encode_fact_segment(paths, settings, analyzer, index)
    if data_out is None:
        return False
    write(paths, data_out)
    return True
