"""Record shapes of long-term memory and their ids.

Field names are those of the reference files (facts.json, reflections.json, surfaced.json,
persona.json, persona_corrections.json, facts_pending_dedup.json), so existing files load.
Records are frozen msgspec Structs: every change is ``msgspec.structs.replace`` and returns a
new record. Times are ISO 8601 strings; :func:`parse_time` reads them back.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping
from datetime import date, datetime
from typing import Any, Literal

import msgspec

IMPORTANCE_MIN = 1
IMPORTANCE_MAX = 10
SCHEMA_VERSION_CURRENT = 2
BUILTIN_ENTITIES: tuple[str, ...] = ("master", "neko", "relationship")

FactSource = Literal["user_observation", "ai_disclosure"]
ReflectionStatus = Literal["pending", "confirmed", "promoted", "merged", "denied", "archived", "promote_blocked"]
TERMINAL_STATUSES: frozenset[str] = frozenset({"promoted", "denied", "archived", "merged", "promote_blocked"})
TimeScope = Literal["pattern", "state", "episode"]
Feedback = Literal["confirmed", "denied", "ignored"]


# --- time helpers --------------------------------------------------------------------


def to_iso(moment: datetime) -> str:
    """The stored form of a time (ISO 8601, with offset when ``moment`` has one)."""
    return moment.isoformat()


def parse_time(value: Any, like: datetime) -> datetime | None:
    """Parse a stored ISO time so that it compares with ``like``; None if absent or invalid.

    A naive stored value takes ``like``'s zone; an aware value is converted to it (or made
    naive when ``like`` is naive).
    """
    from nekomem.domain.turns import parse_iso

    parsed = parse_iso(value, naive_tz=None)
    if parsed is None:
        return None
    if like.tzinfo is None:
        return parsed if parsed.tzinfo is None else parsed.astimezone(None).replace(tzinfo=None)
    if parsed.tzinfo is None:
        return parsed.replace(tzinfo=like.tzinfo)
    return parsed.astimezone(like.tzinfo)


def age_days(value: Any, now: datetime) -> float | None:
    """Days from a stored time to ``now`` (negative for the future); None if absent/invalid."""
    moment = parse_time(value, now)
    if moment is None:
        return None
    return (now - moment).total_seconds() / 86400.0


# --- evidence fields shared by reflections and persona entries -------------------------


class EvidenceFields(msgspec.Struct, kw_only=True, frozen=True):
    """Evidence of a reflection or persona entry; values are stored undecayed (see evidence.py)."""

    reinforcement: float = 0.0
    disputation: float = 0.0
    rein_last_signal_at: str | None = None
    disp_last_signal_at: str | None = None
    sub_zero_days: int = 0
    sub_zero_last_increment_date: str | None = None
    user_fact_reinforce_count: int = 0


class TrackedFields(EvidenceFields, kw_only=True, frozen=True):
    """Evidence plus mention suppression state ("mentioned more than N times in the window")."""

    recent_mentions: list[str] = msgspec.field(default_factory=list)
    suppress: bool = False
    suppressed_at: str | None = None


# --- facts ---------------------------------------------------------------------------


class Fact(msgspec.Struct, kw_only=True, frozen=True, gc=False):
    """One atomic statement extracted from the conversation (facts.json item)."""

    id: str
    text: str
    importance: int = 5
    entity: str = "master"
    source: FactSource = "user_observation"
    tags: list[str] = msgspec.field(default_factory=list)
    hash: str = ""
    created_at: str = ""
    event_when_raw: Any = None
    event_start_at: str | None = None
    event_end_at: str | None = None
    schema_version: int = SCHEMA_VERSION_CURRENT
    absorbed: bool = False
    # A missing key reads as True: only facts written by path A start unprocessed.
    signal_processed: bool = True
    embedding: Any = None
    embedding_text_sha256: str | None = None
    embedding_model_id: str | None = None
    merged_from_ids: list[str] = msgspec.field(default_factory=list)
    recheck_attempts: int = 0
    last_recheck_attempt_at: str | None = None
    # Where an imported fact came from (e.g. a benchmark's dialogue ids); opaque JSON.
    source_ref: Any = None
    # Subject scoping (group chats): all three set, or none (the owner's private corpus).
    subject_kind: str | None = None
    subject_id: str | None = None
    scope: str | None = None


class DedupPair(msgspec.Struct, kw_only=True, frozen=True):
    """A paraphrase candidate pair waiting for judge_duplicates (facts_pending_dedup.json)."""

    candidate_id: str
    existing_id: str
    candidate_text: str
    existing_text: str
    entity: str
    cosine: float
    queued_at: str
    resolve_attempts: int = 0


# --- reflections ---------------------------------------------------------------------


class Reflection(TrackedFields, kw_only=True, frozen=True):
    """A higher-level insight synthesized from facts (reflections.json item)."""

    id: str
    text: str
    entity: str = "relationship"
    status: ReflectionStatus = "pending"
    source_fact_ids: list[str] = msgspec.field(default_factory=list)
    created_at: str = ""
    feedback: Any = None
    next_eligible_at: str | None = None
    absorbed_into: str | None = None
    last_promote_attempt_at: str | None = None
    promote_attempt_count: int = 0
    promote_blocked_reason: str | None = None
    relation_type: str | None = None
    subject: str | None = None
    temporal_scope: str | None = None
    event_when_raw: Any = None
    event_start_at: str | None = None
    event_end_at: str | None = None
    schema_version: int = 1
    embedding: Any = None
    embedding_text_sha256: str | None = None
    embedding_model_id: str | None = None
    last_refine_cluster_hash: str | None = None
    last_refine_at: str | None = None
    confirmed_at: str | None = None
    promoted_at: str | None = None
    denied_at: str | None = None
    merged_at: str | None = None
    promote_blocked_at: str | None = None
    auto_confirmed: bool = False
    denied_reason: str | None = None
    reject_reason: str | None = None
    archived_at: str | None = None
    archive_shard_path: str | None = None
    recheck_attempts: int = 0
    refine_attempts: int = 0
    modification_history: list[dict[str, Any]] = msgspec.field(default_factory=list)
    # Subject scoping (group chats): all three set, or none (the owner's private corpus).
    subject_kind: str | None = None
    subject_id: str | None = None
    scope: str | None = None


class SurfacedEntry(msgspec.Struct, kw_only=True, frozen=True):
    """A reflection the character brought up in a proactive message (surfaced.json item)."""

    reflection_id: str
    text: str
    surfaced_at: str
    feedback: str | None = None  # None | "confirmed" | "denied" | "ignored" | "auto_confirmed"
    feedback_at: str | None = None


# --- persona -------------------------------------------------------------------------


class VersionRecord(msgspec.Struct, kw_only=True, frozen=True):
    """An earlier text of a persona entry."""

    text: str
    replaced_at: str
    reason: str
    source_fact_id: str | None = None
    correction_id: str | None = None


class PersonaEntry(TrackedFields, kw_only=True, frozen=True):
    """One piece of persistent knowledge about an entity (persona.json section item).

    ``source`` is ``character_card`` (protected), ``reflection``, ``reflection_time_driven``,
    ``correction``, ``manual``, ``settings`` or ``external_import``.
    """

    id: str
    text: str
    source: str = "manual"
    source_id: str | None = None
    protected: bool = False
    created_at: str | None = None
    merged_from_ids: list[str] = msgspec.field(default_factory=list)
    token_count: int | None = None
    token_count_text_sha256: str | None = None
    token_count_tokenizer: str | None = None
    version_history: list[VersionRecord] = msgspec.field(default_factory=list)
    embedding: Any = None
    embedding_text_sha256: str | None = None
    embedding_model_id: str | None = None
    last_refine_cluster_hash: str | None = None
    last_refine_at: str | None = None
    refine_attempts: int = 0
    archived_at: str | None = None
    archive_shard_path: str | None = None
    # Subject scoping (group chats): all three set, or none (the owner's private corpus).
    subject_kind: str | None = None
    subject_id: str | None = None
    scope: str | None = None


class PersonaSection(msgspec.Struct, kw_only=True, frozen=True):
    """The on-disk shape of one persona.json section: ``{"facts": [entry, ...]}``."""

    facts: list[PersonaEntry] = msgspec.field(default_factory=list)


#: In memory the persona is ``entity -> entries`` (file key order kept).
Persona = dict[str, list[PersonaEntry]]


class Correction(msgspec.Struct, kw_only=True, frozen=True):
    """A contradiction waiting for resolve_correction (persona_corrections.json item).

    ``created_at`` is the item's identity. ``old_entry_id`` and ``source_id`` (the reflection
    that proposed ``new_text``) are nekomem additions that make resolution exact.
    """

    old_text: str
    new_text: str
    entity: str
    created_at: str
    resolve_attempts: int = 0
    old_entry_id: str | None = None
    source_id: str | None = None


class Observation(msgspec.Struct, kw_only=True, frozen=True):
    """A reflection or persona entry offered to map_evidence / check_disputation."""

    id: str
    kind: Literal["reflection", "persona"]
    entity: str
    text: str
    score: float


# --- persona.json encoding -----------------------------------------------------------

_V1_SECTION_KEYS = {"user": "master", "ai": "neko"}


def persona_from_disk(raw: Any, rejected: list[Any] | None = None) -> Persona:
    """Read a decoded persona.json object (v1 ``user``/``ai``/``dynamics`` is migrated).

    Sections whose key starts with ``__`` (markers) are skipped. What cannot be read (a
    non-object root, a section that is not an object, an entry that fails validation) is
    left out and, when ``rejected`` is given, appended to it as found (entries as
    ``{"entity", "entry"}``) so the caller can keep it. Raises nothing.
    """
    persona: Persona = {}
    sink: list[Any] = rejected if rejected is not None else []
    if not isinstance(raw, Mapping):
        if raw is not None:
            sink.append(raw)
        return persona
    for key, section in raw.items():
        if not isinstance(key, str) or key.startswith("__"):
            continue
        if not isinstance(section, Mapping):
            sink.append({"entity": key, "section": section})
            continue
        entity = _V1_SECTION_KEYS.get(key, key)
        items = section.get("facts", section.get("dynamics", []))
        entries = persona.setdefault(entity, [])
        if not isinstance(items, list):
            sink.append({"entity": key, "section": section})
            continue
        # Entries of a scoped section ("@subject/<kind>:<id>") inherit its descriptor, so
        # that none of them can be read as the owner's private memory.
        inherited = _section_subject(key, section)
        for item in items:
            try:
                entry = msgspec.convert(item, PersonaEntry, strict=False)
            except (msgspec.ValidationError, TypeError):
                sink.append({"entity": entity, "entry": item})
                continue
            if inherited and entry.subject_kind is None and entry.subject_id is None and entry.scope is None:
                entry = msgspec.structs.replace(entry, **inherited)
            entries.append(entry)
    return persona


def _section_subject(key: str, section: Mapping[str, Any]) -> dict[str, str]:
    """The subject fields a scoped section hands its entries ({} for a private section).

    A scoped section without a usable descriptor marks its entries ``scope="malformed"``
    with no kind: served to no read at all (fail closed)."""
    if not key.startswith("@subject/"):
        return {}
    fields = {f: section.get(f) for f in ("subject_kind", "subject_id", "scope")}
    if all(isinstance(v, str) and v for v in fields.values()):
        return {k: str(v) for k, v in fields.items()}
    return {"scope": "malformed"}


def persona_to_disk(persona: Mapping[str, Iterable[PersonaEntry]]) -> dict[str, Any]:
    """The persona.json object (``{entity: {"facts": [...]}}``) as builtins; a scoped
    section also carries its subject descriptor, as the reference writes it."""
    out: dict[str, Any] = {}
    for entity, entries in persona.items():
        items = list(entries)
        section: dict[str, Any] = {"facts": msgspec.to_builtins(items)}
        if entity.startswith("@subject/") and items and items[0].subject_kind is not None:
            section.update(subject_kind=items[0].subject_kind, subject_id=items[0].subject_id, scope=items[0].scope)
        out[entity] = section
    return out


# --- ids -----------------------------------------------------------------------------


def _sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def dedup_key(text: str, prefix: str = "") -> str:
    """The exact-dedup key of a fact: ``prefix`` + the stripped text (no other normalisation)."""
    return prefix + text.strip()


def fact_hash(text: str, prefix: str = "") -> str:
    """First 16 hex of SHA-256 of :func:`dedup_key`."""
    return _sha256_hex(dedup_key(text, prefix))[:16]


def fact_id(created_at: datetime, text: str) -> str:
    """``fact_<YYYYmmddHHMMSS>_<first 8 hex of the content hash>``."""
    return f"fact_{created_at:%Y%m%d%H%M%S}_{fact_hash(text)[:8]}"


def reflection_id(source_fact_ids: Iterable[str]) -> str:
    """``ref_`` + 16 hex of SHA-256 over the SORTED ids, each followed by a NUL byte.

    The order of ``source_fact_ids`` does not matter, so a retried batch gets the same id.
    """
    digest = hashlib.sha256()
    for fid in sorted(source_fact_ids):
        digest.update(fid.encode("utf-8"))
        digest.update(b"\x00")
    return "ref_" + digest.hexdigest()[:16]


def card_entry_id(entity: str, field: str) -> str:
    """Id of a protected character-card entry: ``card_<sha256("entity:field")[:8]>``."""
    return "card_" + _sha256_hex(f"{entity}:{field}")[:8]


def external_entry_id(entity: str, text: str) -> str:
    """Id of a persona entry imported from outside memory (OpenClaw / Hermes Markdown):
    ``ext_<sha256("entity:text")[:16]>``, so importing the same text twice adds it once."""
    return "ext_" + _sha256_hex(f"{entity}:{text}")[:16]


def promoted_entry_id(source_reflection_id: str) -> str:
    """Id of a persona entry promoted from a reflection: ``prom_<reflection id>``."""
    return "prom_" + source_reflection_id


def manual_entry_id(text: str, now: datetime, salt: str = "") -> str:
    """``manual_<YYYYmmddHHMMSS>_<sha256(salt + text)[:8]>``."""
    return f"manual_{now:%Y%m%d%H%M%S}_{_sha256_hex(salt + text)[:8]}"


def correction_entry_id(text: str, now: datetime) -> str:
    """Id of an entry created by a contradiction resolution: ``corr_<ts>_<digest>``."""
    return f"corr_{now:%Y%m%d%H%M%S}_{_sha256_hex(text)[:8]}"


def legacy_entry_id(text: str) -> str:
    """Id of an entry imported from the old settings text: ``legacy_<sha256(text)[:8]>``."""
    return "legacy_" + _sha256_hex(text)[:8]


def text_sha256(text: str) -> str:
    """Full SHA-256 hex of a text (embedding / token-count cache keys, event payloads)."""
    return _sha256_hex(text)


# --- archive shards ------------------------------------------------------------------


def shard_name(day: date, suffix: str) -> str:
    """``<YYYY-MM-DD>_<suffix>.json`` (suffix: 8 hex characters of a uuid)."""
    return f"{day.isoformat()}_{suffix}.json"


def new_shard_suffix() -> str:
    """A fresh shard suffix: 8 hex characters of a uuid4."""
    import uuid

    return uuid.uuid4().hex[:8]


def assign_shards(
    existing: Mapping[str, int],
    count: int,
    day: date,
    new_suffix: Callable[[], str],
    max_entries: int,
) -> list[str]:
    """Choose the shard file of each of ``count`` new archive entries, in order.

    ``existing`` maps shard file names of the folder to their entry counts. An entry goes
    into the first of ``day``'s shards (in name order) that still has room; when none has,
    a new shard ``shard_name(day, new_suffix())`` is opened. Raises ValueError if
    ``max_entries`` < 1 or ``new_suffix`` repeats an existing name.
    """
    if max_entries < 1:
        raise ValueError("max_entries must be at least 1")
    prefix = f"{day.isoformat()}_"
    fill = {name: n for name, n in existing.items() if name.startswith(prefix) and name.endswith(".json")}
    result: list[str] = []
    for _ in range(count):
        target = next((name for name in sorted(fill) if fill[name] < max_entries), None)
        if target is None:
            target = shard_name(day, new_suffix())
            if target in fill or target in existing:
                raise ValueError(f"shard {target} already exists")
            fill[target] = 0
        fill[target] += 1
        result.append(target)
    return result


def record_get(obj: Any, key: str, default: Any = None) -> Any:
    """Read ``key`` from a decoded JSON object or a Struct (validated LLM outputs come as either)."""
    if isinstance(obj, Mapping):
        return obj.get(key, default)
    return getattr(obj, key, default)
