"""Speaker identity and trust arithmetic of the reference's ``speaker_trust.json`` (pool v2).

Pure functions, no I/O: the pool file is :mod:`nekomem.stores.speaker_trust`'s. Two layers:
an *entity* is a person, an *account* (``platform:actor``, e.g. ``qq:12345``) is one
credential of that person. Trust a person earned lives per account (so an unbind can move
exactly one account's ledger away) and is summed over the entity when read.

The numbers are the reference's (``config/memory_settings.py``, read at commit
``16eb1812df5d5a797b9336dadebf46e467ff8aba``; ``memory/identity.py`` at
``0021e9d113a3caec8df4061052a5630d70a0d19d``). They are part of the file's meaning, not
tunables: a pool written with other deltas would mean something else to the reference's
memory server reading the same file, so they are constants here.
"""

from __future__ import annotations

import hashlib
import math
import re
from typing import Any

from nekomem.domain.neko_fields import kept

ENTITY_ID_PREFIX = "ent_"
POOL_VERSION = 2
POOL_FILENAME = "speaker_trust.json"

TRUST_BY_TIER: dict[str, float] = {"admin": 1.0, "trusted": 0.8, "normal": 0.5, "none": 0.3}
ACTIVITY_WEIGHT = 0.001
ACTIVITY_MAX_BONUS = 0.02
CONFIRMATION_DELTA = 0.04
CORRECTION_DELTA = 0.08
ADJUSTMENT_LIMIT = 0.30
MAX_REPORTED_BASE = 0.8
ACTIVITY_EVENT_HISTORY_LIMIT = 256
LEGACY_IMPORT_CHUNK_MAX = 500
MAX_ACCOUNTS_PER_ENTITY_PER_PLATFORM = 8
# Platforms whose trust abstains until their legacy ledger was imported (or waived).
LEGACY_BARRIERS: dict[str, str] = {"qq": "qq_auto_reply.business_config.speaker_trust_profiles.v1"}
SCOPE_VALUES = frozenset({"global", "per_conversation", "unknown"})

_PLATFORM_RE = re.compile(r"[A-Za-z0-9_.-]+")
_ACTOR_RE = re.compile(r"[A-Za-z0-9_.:@-]+")
_CHANNEL_RE = re.compile(r"[a-z0-9_]{1,16}")
_EVENT_ID_MAX = 96


def normalize_account_id(value: object) -> str | None:
    """``platform:actor`` with the platform lower-cased, or None when ``value`` is not one
    (empty, over 96 characters, whitespace or unprintable characters, a bad platform or
    actor). Byte-for-byte the reference's ``stable_speaker_id``: the account id is baked
    into event ids, so it is never folded further."""
    text = str(value or "").strip() if not isinstance(value, str) else value.strip()
    if not text or len(text) > 96 or any(ch.isspace() or not ch.isprintable() for ch in text):
        return None
    platform, sep, actor = text.partition(":")
    if not sep or not platform or not actor:
        return None
    if not _PLATFORM_RE.fullmatch(platform) or not _ACTOR_RE.fullmatch(actor):
        return None
    return f"{platform.lower()}:{actor}"


def platform_of(account_id: str) -> str:
    """The platform part of a normalised account id."""
    return account_id.partition(":")[0]


def valid_platform(value: object) -> str | None:
    """A platform token, lower-cased, or None."""
    text = str(value or "").strip().lower()
    return text if _PLATFORM_RE.fullmatch(text) else None


def derive_entity_id(account_id: str, generation: int = 0) -> str:
    """The seed entity id of an account: deterministic, so two first sightings of one
    account agree without an allocator (the reference's derivation, kept byte-equal so a
    pool written by either server names the same entities)."""
    raw = f"neko.entity.v1|{account_id}|{int(generation)}"
    return ENTITY_ID_PREFIX + hashlib.sha256(raw.encode("utf-8")).hexdigest()[:24]


def forgotten_account_token(account_id: str) -> str:
    """What the forgotten list keeps of an erased account: a one-way hash, never the id.

    The list exists so a later legacy re-import does not bring the account back; a hash is
    enough to recognise it and does not keep who it was.
    """
    return "sha256:" + hashlib.sha256(account_id.encode("utf-8")).hexdigest()


def normalize_channel(value: object) -> str | None:
    """An observed channel token (``onebot``, ``open``), or None. ``napcat`` is the old name
    of ``onebot``."""
    text = str(value or "").strip().lower()
    if not _CHANNEL_RE.fullmatch(text):
        return None
    return "onebot" if text == "napcat" else text


def activity_cap() -> int:
    """The message count beyond which activity adds nothing (20)."""
    return max(0, math.ceil(ACTIVITY_MAX_BONUS / ACTIVITY_WEIGHT - 1e-9))


def effective_trust(base: float, adjustment_sum: float, activity_sum: int) -> float:
    """``clamp01(base + clamp(Σadj, ±0.30) + min(0.02, min(cap, Σcount) · 0.001))``: the one
    place both clamps are applied (summing then clamping keeps merges lossless)."""
    adjustment = max(-ADJUSTMENT_LIMIT, min(ADJUSTMENT_LIMIT, float(adjustment_sum or 0.0)))
    counted = min(activity_cap(), max(0, int(activity_sum or 0)))
    activity = min(ACTIVITY_MAX_BONUS, counted * ACTIVITY_WEIGHT)
    return max(0.0, min(1.0, float(base) + adjustment + activity))


def _float(value: object) -> float:
    if not isinstance(value, (int, float, str)):
        return 0.0
    try:
        number = float(value)
    except (ValueError, OverflowError):
        return 0.0
    return number if math.isfinite(number) else 0.0


def as_count(value: object) -> int:
    """A non-negative count read tolerantly (anything unreadable is 0)."""
    if not isinstance(value, (int, float, str)):
        return 0
    try:
        return max(0, int(value))
    except (ValueError, OverflowError):
        return 0


def clean_event_ids(raw: object, *, keep_last: int | None = None) -> list[str]:
    """One event ring: stripped ids of at most 96 characters, duplicates dropped in order."""
    if not isinstance(raw, list):
        return []
    seen: dict[str, None] = {}
    for item in raw:
        text = str(item or "").strip()[:_EVENT_ID_MAX]
        if text:
            seen.setdefault(text, None)
    events = list(seen)
    return events if keep_last is None else events[-keep_last:]


def _channels_seen(raw: object) -> dict[str, dict[str, Any]]:
    result: dict[str, dict[str, Any]] = {}
    if not isinstance(raw, dict):
        return result
    for key, stats in raw.items():
        channel = normalize_channel(key)
        if channel is None or not isinstance(stats, dict):
            continue
        result[channel] = {
            "first": str(stats.get("first") or "") or None,
            "last": str(stats.get("last") or "") or None,
            "count": as_count(stats.get("count")),
        }
    return result


def account_record(account_id: str, raw: object = None) -> dict[str, Any]:
    """One account's ledger, every field read tolerantly (a bad field becomes its default)."""
    data = raw if isinstance(raw, dict) else {}
    record: dict[str, Any] = {
        "account_id": account_id,
        "generation": as_count(data.get("generation")),
        "bound_at": str(data.get("bound_at") or "") or None,
        "bound_by": str(data.get("bound_by") or "") or None,
        "adjustment": _float(data.get("adjustment")),
        "message_count": min(activity_cap(), as_count(data.get("message_count"))),
        "processed_activity_events": clean_event_ids(data.get("processed_activity_events"), keep_last=ACTIVITY_EVENT_HISTORY_LIMIT),
        "processed_signal_events": clean_event_ids(data.get("processed_signal_events")),
        "channels_seen": _channels_seen(data.get("channels_seen")),
    }
    legacy = data.get("legacy_import")
    if isinstance(legacy, dict):
        record["legacy_import"] = {"source": str(legacy.get("source") or ""), "at": str(legacy.get("at") or "")}
    return record


def legacy_profile(raw: object) -> dict[str, Any]:
    """One profile of a plugin's legacy ledger (adjustment, message_count, the two rings)."""
    data = raw if isinstance(raw, dict) else {}
    return {
        "adjustment": _float(data.get("adjustment")),
        "message_count": as_count(data.get("message_count")),
        "processed_activity_events": clean_event_ids(data.get("processed_activity_events")),
        "processed_signal_events": clean_event_ids(data.get("processed_signal_events")),
    }


def entity_record(entity_id: str, raw: object = None) -> dict[str, Any]:
    """One entity with its accounts; canonical pointers naming a non-member are dropped."""
    data = raw if isinstance(raw, dict) else {}
    status = str(data.get("status") or "active").strip().lower()
    status = status if status in {"active", "merged"} else "active"
    record: dict[str, Any] = {
        "entity_id": entity_id,
        "status": status,
        "created_at": str(data.get("created_at") or "") or None,
        "updated_at": str(data.get("updated_at") or "") or None,
        "accounts": {},
    }
    if status == "merged":
        record["merged_into"] = str(data.get("merged_into") or "") or None
        record["merged_at"] = str(data.get("merged_at") or "") or None
        moved = data.get("merged_accounts")
        if isinstance(moved, list):
            record["merged_accounts"] = [a for a in (normalize_account_id(m) for m in moved) if a is not None]
    accounts = data.get("accounts")
    if isinstance(accounts, dict):
        for key, value in accounts.items():
            account_id = normalize_account_id(key)
            if account_id is not None:
                record["accounts"][account_id] = account_record(account_id, value)
    canonical = data.get("canonical_accounts")
    if isinstance(canonical, dict):
        kept: dict[str, dict[str, Any]] = {}
        for platform, entry in canonical.items():
            if not isinstance(entry, dict):
                continue
            account_id = normalize_account_id(entry.get("account_id"))
            key = str(platform or "").strip().lower()
            if account_id is None or not key or account_id not in record["accounts"]:
                continue
            kept[key] = {"account_id": account_id, "sealed_at": str(entry.get("sealed_at") or "") or None}
        if kept:
            record["canonical_accounts"] = kept
    superseded = data.get("superseded_canonicals")
    if isinstance(superseded, list):
        items = [item for item in superseded if isinstance(item, dict)]
        if items:
            record["superseded_canonicals"] = items
    return record


def apply_signal_event(record: dict[str, Any], event: object) -> bool:
    """Apply one owner confirmation (+0.04) or correction (-0.08) once per event id;
    returns whether the ledger changed. The sum is kept unclamped (see effective_trust)."""
    if not isinstance(event, dict):
        return False
    event_id = str(event.get("event_id") or "").strip()[:_EVENT_ID_MAX]
    kind = event.get("kind")
    if not event_id or kind not in {"confirmation", "correction"}:
        return False
    processed: list[str] = record["processed_signal_events"]
    if event_id in processed:
        return False
    processed.append(event_id)
    delta = CONFIRMATION_DELTA if kind == "confirmation" else -CORRECTION_DELTA
    record["adjustment"] = _float(record.get("adjustment")) + delta
    return True


def merge_order(entity: dict[str, Any]) -> tuple[str, str]:
    """The merge survivor is the smaller ``(created_at, entity_id)``: merging is then
    idempotent, commutative and associative."""
    return (str(entity.get("created_at") or ""), str(entity.get("entity_id") or ""))


def row_field(row: dict[str, Any], key: str) -> Any:
    """A reference field of a fact row: top level, or kept under ``source_ref.neko`` by the
    importer (fields nekomem's record type lacks travel there)."""
    return kept(row, row.get("source_ref"), key)


def spoken_by(row: dict[str, Any], accounts: set[str], entities: set[str]) -> bool:
    """Whether a fact row was said by one of ``accounts`` (its ``speaker_id``) or stamped
    with one of ``entities`` (its ``speaker_entity_id``)."""
    speaker = normalize_account_id(row_field(row, "speaker_id"))
    entity = row_field(row, "speaker_entity_id")
    return (speaker is not None and speaker in accounts) or (isinstance(entity, str) and entity in entities)


def signal_events(row: dict[str, Any]) -> list[dict[str, Any]]:
    """The owner trust signals a fact row carries (``_speaker_trust_signal_events``)."""
    events = row_field(row, "_speaker_trust_signal_events")
    return [e for e in events if isinstance(e, dict)] if isinstance(events, list) else []
