"""Compact text encoding of the embedding vectors cached on memory entries.

A vector is stored as standard base64 of its little-endian float16 bytes (row-major, no
header): 512 dimensions take 1,368 characters. The encoding is lossy only by float16
rounding, which keeps the cosine to the original above 0.9999 for normalised vectors.
Decoding re-normalises, so the dot product of two decoded vectors is their cosine.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence

import numpy as np

_WIRE_DTYPE = np.dtype("<f2")
# The element type of a cached vector's bytes (what the base64 wraps).
WIRE_DTYPE = _WIRE_DTYPE


class VectorCodecError(ValueError):
    """A cached vector cannot be encoded or decoded (wrong shape, size, or content)."""


def encode(vec: np.ndarray) -> str:
    """Encode a 1-D finite vector as base64 of little-endian float16.

    Raises VectorCodecError when the vector is not 1-D, is empty, or holds non-finite values
    (also after the float16 conversion, i.e. magnitudes beyond float16's range).
    """
    arr = np.asarray(vec)
    if arr.ndim != 1 or arr.size == 0:
        raise VectorCodecError(f"expected a non-empty 1-D vector, got shape {arr.shape}")
    with np.errstate(over="ignore", invalid="ignore"):
        wire = arr.astype(_WIRE_DTYPE)
    if not np.isfinite(wire).all():
        raise VectorCodecError("vector has values that are not finite in float16")
    return base64.b64encode(wire.tobytes()).decode("ascii")


def decode(s: str | list[float], dim: int) -> np.ndarray:
    """Decode a cached vector into an L2-normalised float32 array of length dim.

    Accepts the base64 float16 string written by encode, or a legacy list of floats.
    Raises VectorCodecError when the base64 is malformed, the length does not match dim,
    or a value is not finite.
    """
    if isinstance(s, str):
        try:
            raw = base64.b64decode(s.encode("ascii"), validate=True)
        except (binascii.Error, UnicodeEncodeError) as exc:
            raise VectorCodecError(f"not valid base64: {exc}") from None
        if len(raw) != dim * _WIRE_DTYPE.itemsize:
            raise VectorCodecError(f"expected {dim * _WIRE_DTYPE.itemsize} bytes for {dim} dimensions, got {len(raw)}")
        vec = np.frombuffer(raw, dtype=_WIRE_DTYPE).astype(np.float32)
    elif isinstance(s, list):
        try:
            vec = np.asarray(s, dtype=np.float32)
        except (TypeError, ValueError) as exc:
            raise VectorCodecError(f"not a list of numbers: {exc}") from None
        if vec.shape != (dim,):
            raise VectorCodecError(f"expected {dim} numbers, got shape {vec.shape}")
    else:
        raise VectorCodecError(f"expected a base64 string or a list of floats, got {type(s).__name__}")
    if not np.isfinite(vec).all():
        raise VectorCodecError("vector has non-finite values")
    norm = float(np.linalg.norm(vec))
    return vec / norm if norm > 0.0 else vec


def try_decode(s: object, dim: int) -> np.ndarray | None:
    """Like decode, but returns None for anything invalid (a corrupt cache degrades quietly)."""
    if not isinstance(s, (str, list)) or not s:
        return None
    try:
        return decode(s, dim)
    except VectorCodecError:
        return None


def wire_bytes(s: str) -> bytes | None:
    """The float16 bytes a cached vector's base64 ``s`` holds; None when it is not valid
    base64 (the length is the caller's to check)."""
    try:
        return binascii.a2b_base64(s.encode("ascii"), strict_mode=True)
    except (binascii.Error, UnicodeEncodeError):
        return None


def try_decode_many(items: Sequence[object], dim: int) -> tuple[np.ndarray, np.ndarray]:
    """:func:`try_decode` of every item at once (a wake adopts thousands of cached
    vectors): (the decoded rows, float32 ``(k, dim)``, of the items that decode, in order;
    a boolean mask over ``items`` of those). The rows are the bits :func:`try_decode` gives:
    each norm is the row's dot product with itself, batched as a matrix product (the same
    kernel), and the division is done in float32 as there."""
    width = dim * _WIRE_DTYPE.itemsize
    ok = np.zeros(len(items), dtype=bool)
    chunks: list[bytes] = []
    legacy: dict[int, np.ndarray] = {}  # position among the decoded rows -> a list-of-floats vector
    for i, item in enumerate(items):
        if isinstance(item, str) and item:
            raw = wire_bytes(item)
            if raw is not None and len(raw) == width:
                chunks.append(raw)
                ok[i] = True
        elif isinstance(item, list):
            vec = try_decode(item, dim)
            if vec is not None:
                legacy[len(chunks)] = vec
                chunks.append(bytes(width))  # a placeholder row, replaced below
                ok[i] = True
    rows, finite = decode_wire_rows(np.frombuffer(b"".join(chunks), dtype=_WIRE_DTYPE).reshape(len(chunks), dim))
    for at, vec in legacy.items():
        rows[at] = vec
        finite[at] = True
    if not finite.all():
        ok[np.flatnonzero(ok)[~finite]] = False
        rows = rows[finite]
    return rows, ok


def decode_wire_rows(wire: np.ndarray, out: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Rows of little-endian float16 (the bytes :func:`encode` wraps in base64), ``(k,
    dim)``, decoded as :func:`decode` decodes one: (float32 rows, L2-normalised, a zero row
    kept as it is; a boolean mask of the rows whose values are all finite: the others hold
    garbage and are the caller's to drop). Each norm is the row's dot product with itself,
    batched as a matrix product (the kernel of the one-row norm, so the same bits), and the
    division is done in float32 as there. ``out``: a float32 array of at least as many rows
    to decode into (reused across slices, so a long block does not fault in fresh memory
    for every one); the rows returned are then a view into it."""
    if out is None:
        rows = wire.astype(np.float32)
    else:
        rows = out[: wire.shape[0]]
        np.copyto(rows, wire)
    # float16 values square and sum far inside float32's range, so a row's norm is finite
    # exactly when every value of the row is.
    norms = np.sqrt((rows[:, None, :] @ rows[:, :, None])[:, 0, 0])
    finite = np.isfinite(norms)
    with np.errstate(invalid="ignore"):  # rows not finite: the caller drops them
        np.divide(rows, np.where(norms > 0.0, norms, np.float32(1.0))[:, None], out=rows)
    return rows, finite
