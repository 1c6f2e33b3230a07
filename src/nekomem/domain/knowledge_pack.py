"""Public knowledge packs (schema v1, as the reference's ``knowledge/models.py`` reads
them): validation, the normalized form and its canonical bytes.

A pack file is one JSON object with exactly ``schema_version`` (1), ``pack_id``,
``material_type`` (``knowledge`` or ``corpus``), ``source`` (``name``, optional
``homepage`` and ``license``) and ``entries`` (1..5,000). An entry has ``title`` and
``content`` (required), optional ``summary``, ``tags`` and ``terms`` (``alias`` and
``recognition`` lists). Anything else is refused with a stable reason code, the
reference's (``unexpected_pack_field``, ``invalid_pack_id``, ``duplicate_title``, ...).
Packs carry raw text only: vectors are computed locally. Nothing here touches a file.
"""

from __future__ import annotations

import hashlib
import json
import re
import unicodedata
from typing import Any

import msgspec

SCHEMA_VERSION = 1
MATERIAL_TYPES = ("knowledge", "corpus")
TERM_ROLES = ("alias", "recognition")

# The reference's limits (knowledge/models.py): part of the pack format, not tunables.
MAX_PACK_BYTES = 10 * 1024 * 1024
MAX_ENTRIES_PER_PACK = 5_000
MAX_TOTAL_ENTRIES = 20_000
MAX_TITLE_CHARS = 500
MAX_SUMMARY_CHARS = 4_000
MAX_CONTENT_CHARS = 80_000
MAX_TERM_CHARS = 300
MAX_TERMS_PER_ROLE = 64
MAX_TAG_CHARS = 100
MAX_TAGS_PER_ENTRY = 32
MAX_SOURCE_FIELD_CHARS = 500

_PACK_ID_RE = re.compile(r"[a-z0-9][a-z0-9._-]{1,63}")
_PACK_KEYS = frozenset({"schema_version", "pack_id", "material_type", "source", "entries"})
_ENTRY_KEYS = frozenset({"title", "terms", "tags", "summary", "content"})
_SOURCE_KEYS = frozenset({"name", "homepage", "license"})
# Control characters other than tab and newline never enter a card.
_CONTROL_RE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


class PackError(ValueError):
    """A pack was refused; ``reason`` is the reference's machine-readable code."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(detail or reason)
        self.reason = reason


class PackSource(msgspec.Struct, frozen=True):
    name: str
    homepage: str = ""
    license: str = ""


class PackTerms(msgspec.Struct, frozen=True):
    alias: tuple[str, ...] = ()
    recognition: tuple[str, ...] = ()


class PackEntry(msgspec.Struct, frozen=True):
    """One card of a pack (never a user's or a character's memory)."""

    title: str
    content: str
    summary: str = ""
    terms: PackTerms = PackTerms()
    tags: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        return title_key(self.title)

    def search_text(self) -> str:
        """What the lexical index reads: title, terms, tags, summary and content."""
        parts = [self.title, *self.terms.alias, *self.terms.recognition, *self.tags, self.summary, self.content]
        return "\n".join(part for part in parts if part)


class Pack(msgspec.Struct, frozen=True):
    pack_id: str
    material_type: str
    source: PackSource
    entries: tuple[PackEntry, ...]


def title_key(title: str) -> str:
    """The identity of an entry inside its pack: NFKC, case-folded, spaces collapsed."""
    return " ".join(unicodedata.normalize("NFKC", title).casefold().split())


def pack_id_valid(value: object) -> bool:
    return isinstance(value, str) and _PACK_ID_RE.fullmatch(value) is not None


def _clean(value: object, max_chars: int) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise PackError("invalid_entry")
    return _CONTROL_RE.sub("", unicodedata.normalize("NFC", value)).strip()[:max_chars]


def _line(value: object, max_chars: int) -> str:
    return " ".join(_clean(value, max_chars).split())[:max_chars]


def _mapping(value: object, reason: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise PackError(reason)
    return value


def _strings(values: object, max_items: int, max_chars: int) -> tuple[str, ...]:
    if values is None:
        return ()
    if not isinstance(values, list) or len(values) > max_items:
        raise PackError("invalid_entry")
    out: list[str] = []
    for value in values:
        if not isinstance(value, str):
            raise PackError("invalid_entry")
        text = _line(value, max_chars)
        if text and text not in out:
            out.append(text)
    return tuple(out)


def _entry(raw: object) -> PackEntry:
    entry = _mapping(raw, "invalid_entry")
    if not set(entry) <= _ENTRY_KEYS:
        raise PackError("unexpected_entry_field")
    title = _line(entry.get("title"), MAX_TITLE_CHARS)
    content = _clean(entry.get("content"), MAX_CONTENT_CHARS)
    if not title or not content:
        raise PackError("invalid_entry", "title and content are required")
    terms = _mapping({} if entry.get("terms") is None else entry.get("terms"), "invalid_entry")
    if not set(terms) <= set(TERM_ROLES):
        raise PackError("unexpected_entry_field")
    return PackEntry(
        title=title,
        content=content,
        summary=_clean(entry.get("summary"), MAX_SUMMARY_CHARS),
        terms=PackTerms(
            alias=_strings(terms.get("alias"), MAX_TERMS_PER_ROLE, MAX_TERM_CHARS),
            recognition=_strings(terms.get("recognition"), MAX_TERMS_PER_ROLE, MAX_TERM_CHARS),
        ),
        tags=_strings(entry.get("tags"), MAX_TAGS_PER_ENTRY, MAX_TAG_CHARS),
    )


def parse_pack(payload: object) -> Pack:
    """Validate a decoded schema-v1 pack and return its normalized form; raises PackError."""
    pack = _mapping(payload, "invalid_pack")
    if set(pack) != _PACK_KEYS:
        raise PackError("unexpected_pack_field")
    version = pack.get("schema_version")
    if isinstance(version, bool) or version != SCHEMA_VERSION:
        raise PackError("unsupported_schema_version")
    if not pack_id_valid(pack.get("pack_id")):
        raise PackError("invalid_pack_id")
    if pack.get("material_type") not in MATERIAL_TYPES:
        raise PackError("invalid_material_type")
    source = _mapping(pack.get("source"), "invalid_source")
    if not set(source) <= _SOURCE_KEYS or any(not isinstance(v, str) for v in source.values()):
        raise PackError("invalid_source")
    src = PackSource(
        name=_line(source.get("name"), 200),
        homepage=_line(source.get("homepage"), MAX_SOURCE_FIELD_CHARS),
        license=_line(source.get("license"), MAX_SOURCE_FIELD_CHARS),
    )
    if not src.name:
        raise PackError("invalid_source")
    raw_entries = pack.get("entries")
    if not isinstance(raw_entries, list) or not raw_entries:
        raise PackError("invalid_entries")
    if len(raw_entries) > MAX_ENTRIES_PER_PACK:
        raise PackError("too_many_entries")
    entries: list[PackEntry] = []
    seen: set[str] = set()
    for raw in raw_entries:
        entry = _entry(raw)
        if entry.key in seen:
            raise PackError("duplicate_title")
        seen.add(entry.key)
        entries.append(entry)
    return Pack(pack_id=str(pack["pack_id"]), material_type=str(pack["material_type"]), source=src, entries=tuple(entries))


def decode_pack(raw: bytes) -> Pack:
    """Decode UTF-8 JSON pack bytes (at most MAX_PACK_BYTES) and validate; raises PackError."""
    if len(raw) > MAX_PACK_BYTES:
        raise PackError("pack_too_large")
    try:
        payload = json.loads(raw.decode("utf-8-sig"))
    except (UnicodeDecodeError, ValueError):
        raise PackError("invalid_json") from None
    return parse_pack(payload)


def canonical_bytes(pack: Pack) -> bytes:
    """The normalized pack as stored under the knowledge folder (sorted keys, compact)."""
    payload = {
        "schema_version": SCHEMA_VERSION,
        "pack_id": pack.pack_id,
        "material_type": pack.material_type,
        "source": msgspec.to_builtins(pack.source),
        "entries": [
            {
                "title": e.title,
                "terms": {"alias": list(e.terms.alias), "recognition": list(e.terms.recognition)},
                "tags": list(e.tags),
                "summary": e.summary,
                "content": e.content,
            }
            for e in pack.entries
        ],
    }
    return json.dumps(payload, ensure_ascii=False, sort_keys=True, separators=(",", ":")).encode("utf-8")


def sha256_hex(raw: bytes) -> str:
    return hashlib.sha256(raw).hexdigest()
