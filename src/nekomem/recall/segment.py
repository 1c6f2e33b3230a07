"""The persisted recall segment: one file of numpy arrays that a wake loads instead of
re-tokenising every memory.

A segment holds rows (one per indexed entry of the owner it belongs to) and, per row, no
memory text: the entry's id, its tier, its event interval, whether it is private, where its
record sits in the owner's view file (byte range), its length in tokens, and its postings in
a CSR keyed by 64-bit term hashes (blake2b of the term, :func:`term_hash`). The file is

    magic ``NKRSEG1\\n`` · header length (uint64 LE) · header (JSON) · zero padding to 8 ·
    the arrays, each at the offset the header names, 8-aligned

and the header carries the format version, the analyzer fingerprint, the identities of the
files the segment describes (``tied``), the array table and a CRC-32 of everything after
the header. :func:`read_segment` refuses a file whose magic, header, version, table or CRC
is wrong (a torn or damaged file is ignored and rebuilt, never trusted); the caller checks
the fingerprint and the tied files. Written whole through
:func:`nekomem.stores.atomic.atomic_write_bytes`. A term hash collision (two terms of one
character with equal 64-bit hashes) would merge their postings; at 2^-64 per pair it is
not guarded against.
"""

from __future__ import annotations

import hashlib
import json
import struct
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import msgspec
import numpy as np

from nekomem.domain.index_entry import IndexEntry

MAGIC = b"NKRSEG1\n"
VERSION = 1
_LEN = struct.Struct("<Q")
# dtype of every array a segment may hold (others are refused when read).
_DTYPES = {"uint8": np.uint8, "int32": np.int32, "int64": np.int64, "uint64": np.uint64, "float64": np.float64}


class SegmentError(ValueError):
    """A segment file that cannot be used (damaged, another version, wrong shapes)."""


class LexicalArrays(msgspec.Struct, frozen=True):
    """BM25 postings of a segment's rows as a CSR: the postings of the term whose hash is
    ``term_hash[i]`` (sorted) are ``rows[term_ptr[i]:term_ptr[i+1]]`` with their term
    frequencies in ``tfs``; ``dl[row]`` is the row's length in tokens."""

    term_hash: np.ndarray
    term_ptr: np.ndarray
    rows: np.ndarray
    tfs: np.ndarray
    dl: np.ndarray


@dataclass(frozen=True)
class LoadedBase:
    """A segment's rows as :meth:`nekomem.recall.index.RecallIndex.load_base` takes them:
    ``ids[row]``, ``tiers[tier[row]]``, the event interval (NaN: none), ``private[row]``
    (1: none of the subject fields set), the postings, and ``decode(row)``, which reads the
    row's entry from the owner's view file."""

    ids: list[str]
    tiers: list[str]
    tier: np.ndarray
    start: np.ndarray
    end: np.ndarray
    private: np.ndarray
    lexical: LexicalArrays
    decode: Callable[[int], IndexEntry]


def term_hash(term: str) -> int:
    """The 64-bit hash a segment keys ``term`` by (stable across processes)."""
    return int.from_bytes(hashlib.blake2b(term.encode("utf-8", "surrogatepass"), digest_size=8).digest(), "little")


def term_hashes(terms: Sequence[str]) -> np.ndarray:
    """:func:`term_hash` of each of ``terms`` as a uint64 array."""
    return np.fromiter((term_hash(t) for t in terms), dtype=np.uint64, count=len(terms))


def encode_segment(header: Mapping[str, object], arrays: Mapping[str, np.ndarray]) -> bytes:
    """The bytes of a segment file with ``header`` (JSON values) and ``arrays``. Raises
    SegmentError for an array of a dtype segments do not hold."""
    table: dict[str, list[object]] = {}
    chunks: list[bytes] = []
    offset = 0
    for name, array in arrays.items():
        dtype = str(array.dtype)
        if dtype not in _DTYPES or array.ndim != 1:
            raise SegmentError(f"array {name}: {dtype} of {array.ndim} dimensions is not held in a segment")
        data = np.ascontiguousarray(array).astype(array.dtype.newbyteorder("<"), copy=False).tobytes()
        table[name] = [dtype, int(array.shape[0]), offset]
        pad = -len(data) % 8
        chunks.append(data + b"\0" * pad)
        offset += len(data) + pad
    payload = b"".join(chunks)
    head = json.dumps({**header, "version": VERSION, "arrays": table, "crc32": zlib.crc32(payload)}, sort_keys=True).encode()
    head += b" " * (-(len(MAGIC) + _LEN.size + len(head)) % 8)
    return MAGIC + _LEN.pack(len(head)) + head + payload


def _decode_header(data: bytes) -> tuple[dict[str, object], int]:
    """The header of a segment's bytes (at least its head) and where its payload starts.
    Raises SegmentError when ``data`` does not hold a header of this version."""
    if not data.startswith(MAGIC) or len(data) < len(MAGIC) + _LEN.size:
        raise SegmentError("not a recall segment")
    (head_len,) = _LEN.unpack_from(data, len(MAGIC))
    start = len(MAGIC) + _LEN.size + head_len
    if start > len(data):
        raise SegmentError("truncated header")
    try:
        header = json.loads(data[len(MAGIC) + _LEN.size : start])
    except (UnicodeDecodeError, ValueError):
        raise SegmentError("unreadable header") from None
    if not isinstance(header, dict) or header.get("version") != VERSION:
        raise SegmentError("another segment version")
    return header, start


def read_header(path: Path, limit: int = 1 << 20) -> dict[str, object]:
    """Only the header of the segment file ``path`` (its payload is neither read nor
    checked: a glance at what it is tied to). Raises OSError (FileNotFoundError when
    there is none) and SegmentError (also for a header longer than ``limit`` bytes)."""
    with path.open("rb") as file:
        head = file.read(len(MAGIC) + _LEN.size)
        if not head.startswith(MAGIC) or len(head) < len(MAGIC) + _LEN.size:
            raise SegmentError("not a recall segment")
        (head_len,) = _LEN.unpack_from(head, len(MAGIC))
        if head_len > limit:
            raise SegmentError("header too long")
        header, _start = _decode_header(head + file.read(head_len))
    return header


def decode_segment(data: bytes) -> tuple[dict[str, object], dict[str, np.ndarray]]:
    """The header and the arrays (read-only views into ``data``) of a segment file's bytes.
    Raises SegmentError when the file is not a whole, undamaged segment of this version."""
    header, start = _decode_header(data)
    payload = memoryview(data)[start:]
    if zlib.crc32(payload) != header.get("crc32"):
        raise SegmentError("checksum mismatch")
    table = header.get("arrays")
    if not isinstance(table, dict):
        raise SegmentError("no array table")
    arrays: dict[str, np.ndarray] = {}
    for name, spec in table.items():
        try:
            dtype_name, count, offset = spec
            dtype = np.dtype(_DTYPES[dtype_name]).newbyteorder("<")
            end = offset + count * dtype.itemsize
            if offset < 0 or count < 0 or end > len(payload):
                raise SegmentError(f"array {name} out of bounds")
            arrays[name] = np.frombuffer(payload, dtype=dtype, count=count, offset=offset)
        except (KeyError, TypeError, ValueError) as exc:
            raise SegmentError(f"array {name}: bad table entry") from exc
    return header, arrays


def read_segment(path: Path) -> tuple[dict[str, object], dict[str, np.ndarray]]:
    """:func:`decode_segment` of the file ``path``. Raises OSError (FileNotFoundError when
    there is none) and SegmentError."""
    return decode_segment(path.read_bytes())


def encode_ids(ids: Sequence[str]) -> np.ndarray:
    """Entry ids as one uint8 array (UTF-8, NUL-separated). Raises SegmentError for an id
    holding a NUL."""
    if any("\0" in i for i in ids):
        raise SegmentError("an id holds a NUL character")
    return np.frombuffer("\0".join(ids).encode("utf-8", "surrogatepass"), dtype=np.uint8)


def decode_ids(blob: np.ndarray, count: int) -> list[str]:
    """The ``count`` ids of :func:`encode_ids`. Raises SegmentError when they do not number
    ``count``."""
    if count == 0:
        return []
    try:
        ids = blob.tobytes().decode("utf-8", "surrogatepass").split("\0")
    except UnicodeDecodeError:
        raise SegmentError("unreadable ids") from None
    if len(ids) != count:
        raise SegmentError("ids do not match the rows")
    return ids
