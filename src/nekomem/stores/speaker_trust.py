"""The process-wide ``speaker_trust.json`` (the reference's pool version 2), at the root of
the memory folder: who is who across chat platforms, and the trust ledger of each account.

Shape (the reference's ``memory/trust_store.py``, read at commit
``16eb1812df5d5a797b9336dadebf46e467ff8aba``)::

    {"version": 2, "updated_at": iso,
     "legacy_barriers": {platform: {"source", "status": "pending"|"cleared", "seeded_at",
                                    "cleared_at", "chunks", "accounts", "skipped", "waived"?}},
     "account_index": {account_id: entity_id},
     "entities": {entity_id: {"entity_id", "status": "active"|"merged", "created_at",
                              "updated_at", "accounts": {account_id: ledger},
                              "canonical_accounts"?, "merged_into"?, "merged_accounts"?, ...}},
     "forgotten": {entity_id: {"forgotten_at", "accounts": [...]}},
     "channel_observations": {platform: {channel: {"first_seen", "last_seen", "accounts"}}},
     "channel_collisions": {account_id: {...}},
     "platform_identity_scope": {platform: {"channel", "actor_scope", "conversation_scope",
                                            "asserted_at", "asserted_by"}}}

Reading is tolerant: every container and field is rebuilt from what is there
(``account_index`` is rebuilt from the entities, never trusted), so a file the reference
wrote, or a hand-edited one, loads. nekomem never wrote a version 1 pool, so there is
nothing of its own to migrate; any older or partial file goes through the same rebuild. A
file that is not JSON at all is left exactly as found and the pool turns read-only (every
write answers ``persisted: false``) until it can be read again: overwriting it would lose
the ledgers in it.

One writer: every change is a function over a deep copy of the pool, run under one lock;
the copy is written atomically (:func:`nekomem.stores.atomic.atomic_write_json`) and only
then published, so a failed write leaves memory and disk as they were. A change that
alters nothing writes nothing (a connector declares its scope at every start).

Forgetting an entity deletes it: its accounts' ledgers, index entries, collisions and
canonical pointers go, and the ``forgotten`` tombstone keeps only one-way hashes of the
account ids (the reference keeps the ids themselves), enough to refuse a later legacy
re-import of the same account.
"""

from __future__ import annotations

import copy
import logging
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypeVar

import msgspec

from nekomem.domain import speaker_identity as ident
from nekomem.stores.atomic import atomic_write_json

log = logging.getLogger(__name__)

T = TypeVar("T")
Pool = dict[str, Any]
RESOLVE_DEPTH = 8


class IdentityError(Exception):
    """An identity or trust operation was refused; carries the HTTP status and error code."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message


def _seeded_barriers(now: str) -> dict[str, dict[str, Any]]:
    return {
        platform: {"source": source, "status": "pending", "seeded_at": now, "cleared_at": None, "chunks": 0, "accounts": 0, "skipped": 0}
        for platform, source in ident.LEGACY_BARRIERS.items()
    }


def empty_pool(now: str | None) -> Pool:
    """A pool that abstains from everything (the legacy barriers pending)."""
    return {
        "version": ident.POOL_VERSION,
        "updated_at": now,
        "legacy_barriers": _seeded_barriers(now or ""),
        "account_index": {},
        "entities": {},
        "forgotten": {},
        "channel_observations": {},
        "channel_collisions": {},
        "platform_identity_scope": {},
    }


def _forgotten_tokens(raw: object) -> list[str]:
    tokens: list[str] = []
    for item in raw if isinstance(raw, list) else []:
        text = str(item or "")
        if text.startswith("sha256:"):
            tokens.append(text)
        elif (account_id := ident.normalize_account_id(text)) is not None:
            # A reference-written tombstone names the account: keep only its hash.
            tokens.append(ident.forgotten_account_token(account_id))
    return tokens


def normalize_pool(data: object, now: str) -> Pool:
    """A trustworthy pool rebuilt from whatever JSON ``data`` holds (never raises)."""
    pool = empty_pool(data.get("updated_at") if isinstance(data, dict) and isinstance(data.get("updated_at"), str) else now)
    if not isinstance(data, dict):
        return pool
    barriers = data.get("legacy_barriers")
    for platform, entry in barriers.items() if isinstance(barriers, dict) else []:
        key = str(platform or "").strip().lower()
        if not key or not isinstance(entry, dict):
            continue
        merged = dict(pool["legacy_barriers"].get(key) or {})
        merged.update(
            {
                "source": str(entry.get("source") or merged.get("source") or ""),
                "status": "cleared" if entry.get("status") == "cleared" else "pending",
                "seeded_at": entry.get("seeded_at") or merged.get("seeded_at"),
                "cleared_at": entry.get("cleared_at"),
                "chunks": ident.as_count(entry.get("chunks")),
                "accounts": ident.as_count(entry.get("accounts")),
                "skipped": ident.as_count(entry.get("skipped")),
            }
        )
        if entry.get("waived"):
            merged["waived"] = True
        pool["legacy_barriers"][key] = merged
    entities = data.get("entities")
    for raw_id, raw_entity in entities.items() if isinstance(entities, dict) else []:
        entity_id = str(raw_id or "").strip()
        if entity_id:
            pool["entities"][entity_id] = ident.entity_record(entity_id, raw_entity)
    # The index is rebuilt from the entities; an account found under two entities keeps one
    # ledger holding both (adjustments added, rings joined) rather than losing either.
    for entity_id, entity in pool["entities"].items():
        if entity["status"] == "merged":
            continue
        for account_id, record in list(entity["accounts"].items()):
            owner = pool["account_index"].get(account_id)
            if owner is None:
                pool["account_index"][account_id] = entity_id
                continue
            keeper = pool["entities"][owner]["accounts"][account_id]
            keeper["adjustment"] += record["adjustment"]
            keeper["message_count"] = min(ident.activity_cap(), keeper["message_count"] + record["message_count"])
            keeper["processed_signal_events"] = ident.clean_event_ids(keeper["processed_signal_events"] + record["processed_signal_events"])
            keeper["processed_activity_events"] = ident.clean_event_ids(
                keeper["processed_activity_events"] + record["processed_activity_events"], keep_last=ident.ACTIVITY_EVENT_HISTORY_LIMIT
            )
            if "legacy_import" not in keeper and "legacy_import" in record:
                keeper["legacy_import"] = record["legacy_import"]
            del entity["accounts"][account_id]
            log.warning("speaker trust pool: an account was held by two entities; their ledgers were joined")
    for entity in pool["entities"].values():
        canonical = entity.get("canonical_accounts")
        if isinstance(canonical, dict):
            for platform in [p for p, e in canonical.items() if e.get("account_id") not in entity["accounts"]]:
                del canonical[platform]
    forgotten = data.get("forgotten")
    for raw_id, entry in forgotten.items() if isinstance(forgotten, dict) else []:
        if str(raw_id or "").strip() and isinstance(entry, dict):
            pool["forgotten"][str(raw_id)] = {
                "forgotten_at": entry.get("forgotten_at"),
                "accounts": _forgotten_tokens(entry.get("accounts")),
            }
    for container in ("channel_collisions", "platform_identity_scope"):
        raw = data.get(container)
        if isinstance(raw, dict):
            pool[container] = {str(k): dict(v) for k, v in raw.items() if isinstance(v, dict)}
    observations = data.get("channel_observations")
    for platform, entry in observations.items() if isinstance(observations, dict) else []:
        if isinstance(entry, dict):
            cleaned = {str(ch): dict(stats) for ch, stats in entry.items() if isinstance(stats, dict)}
            if cleaned:
                pool["channel_observations"][str(platform)] = cleaned
    return pool


def resolve(pool: Pool, entity_id: object) -> str | None:
    """The live entity behind ``entity_id`` (following ``merged_into``), or None."""
    current = str(entity_id or "")
    for _ in range(RESOLVE_DEPTH):
        record = pool["entities"].get(current)
        if not isinstance(record, dict):
            return None
        if record.get("status") != "merged":
            return current
        following = str(record.get("merged_into") or "")
        if not following or following == current:
            return None
        current = following
    return None


def entity_of(pool: Pool, account_id: str) -> str | None:
    return resolve(pool, pool["account_index"].get(account_id))


def barrier_pending(pool: Pool, platform: str) -> bool:
    entry = pool["legacy_barriers"].get(platform.lower())
    return bool(entry) and entry.get("status") != "cleared"


class SpeakerTrustPool:
    """The one writer of ``<memory root>/speaker_trust.json`` in this process.

    ``now`` gives the timestamps written into the file (aware ISO, as the reference's).
    Every method is blocking (file I/O under a lock): call it off the event loop.
    """

    def __init__(self, path: Path, now: Callable[[], str]) -> None:
        self.path = path
        self._now = now
        self._lock = threading.Lock()
        self._pool: Pool | None = None
        self._load_failed = False

    # -- loading -----------------------------------------------------------------------

    def _load_locked(self) -> Pool:
        if self._pool is not None and not self._load_failed:
            return self._pool
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            self._pool, self._load_failed = empty_pool(self._now()), False
            return self._pool
        except OSError:
            log.warning("speaker trust pool %s unreadable; identity writes are refused until it can be read", self.path, exc_info=True)
            self._pool, self._load_failed = empty_pool(None), True
            return self._pool
        try:
            data = msgspec.json.decode(raw)
        except (msgspec.DecodeError, RecursionError):
            log.warning("speaker trust pool %s is not valid JSON; left as found, identity writes are refused", self.path)
            self._pool, self._load_failed = empty_pool(None), True
            return self._pool
        self._pool, self._load_failed = normalize_pool(data, self._now()), False
        return self._pool

    def read(self, fn: Callable[[Pool, bool], T]) -> T:
        """``fn(pool, loaded)`` over the published pool (never to be changed by ``fn``)."""
        with self._lock:
            pool = self._load_locked()
            return fn(pool, not self._load_failed)

    def _write(self, change: Callable[[Pool, str], tuple[bool, T]]) -> tuple[bool, T | None]:
        """Run ``change(draft, now)`` -> ``(changed, value)`` on a copy; write and publish the
        copy when it changed. Returns ``(persisted, value)``: persisted is False when the
        pool is unreadable (nothing runs) or the write failed (nothing changed)."""
        with self._lock:
            pool = self._load_locked()
            if self._load_failed:
                return False, None
            draft = copy.deepcopy(pool)
            now = self._now()
            changed, value = change(draft, now)
            if not changed:
                return True, value
            draft["updated_at"] = now
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                atomic_write_json(self.path, draft)
            except OSError:
                log.warning("speaker trust pool %s could not be written; the change was dropped", self.path, exc_info=True)
                return False, value
            self._pool = draft
            return True, value

    # -- reads -------------------------------------------------------------------------

    def profile(self, account_id: object) -> dict[str, Any]:
        """The read-only diagnostic view of one account (never its event rings)."""
        return self.read(lambda pool, loaded: _profile(pool, loaded, account_id))

    def entity_for(self, account_id: str) -> str | None:
        """The live entity of a normalised account id, or None (unknown, or the pool is
        unreadable)."""
        return self.read(lambda pool, loaded: entity_of(pool, account_id) if loaded else None)

    def person_of(self, entity_id: object) -> tuple[set[str], set[str]]:
        """The accounts and entity ids (the live one and those merged into it) of the
        person ``entity_id`` names; empty sets for an unknown entity."""

        def look(pool: Pool, _loaded: bool) -> tuple[set[str], set[str]]:
            target = resolve(pool, str(entity_id or "").strip())
            if target is None:
                return set(), set()
            entities = {other for other in pool["entities"] if resolve(pool, other) == target}
            return set(pool["entities"][target]["accounts"]), entities

        return self.read(look)

    # -- writes ------------------------------------------------------------------------

    def declare_scope(
        self, platform: object, channel: object, actor_scope: object, conversation_scope: object, asserted_by: object
    ) -> dict[str, Any]:
        """Record what a platform's identifiers mean (declared by a connector, never inferred).
        Re-declaring the same values writes nothing. Raises IdentityError (422)."""
        key = ident.valid_platform(platform)
        if key is None:
            raise IdentityError(422, "bad_platform", "invalid platform")
        channel_key = ident.normalize_channel(channel)
        if channel_key is None:
            raise IdentityError(422, "bad_channel", "channel is required ([a-z0-9_]{1,16})")
        actor = str(actor_scope or "").strip().lower()
        conversation = str(conversation_scope or "").strip().lower()
        if actor not in ident.SCOPE_VALUES or conversation not in ident.SCOPE_VALUES:
            raise IdentityError(422, "bad_scope", f"scope must be one of {sorted(ident.SCOPE_VALUES)}")
        asserter = str(asserted_by or "").strip()
        if not asserter:
            raise IdentityError(422, "bad_asserted_by", "asserted_by is required")

        def change(pool: Pool, now: str) -> tuple[bool, dict[str, Any]]:
            current = pool["platform_identity_scope"].get(key) or {}
            entry = {"channel": channel_key, "actor_scope": actor, "conversation_scope": conversation, "asserted_by": asserter}
            if current.get("asserted_at") and all(current.get(k) == v for k, v in entry.items()):
                return False, dict(current)
            entry = {
                "channel": channel_key,
                "actor_scope": actor,
                "conversation_scope": conversation,
                "asserted_at": now,
                "asserted_by": asserter,
            }
            pool["platform_identity_scope"][key] = entry
            return True, dict(entry)

        persisted, value = self._write(change)
        return {**(value or {}), "persisted": persisted, "platform": key}

    def ensure_account(self, account_id: object) -> dict[str, Any]:
        """Register an account if unseen: ``{"account_id", "entity_id", "persisted"}``.
        Raises IdentityError (422) for an invalid id."""
        normalized = _account_or_422(account_id)

        def change(pool: Pool, now: str) -> tuple[bool, str | None]:
            existing = entity_of(pool, normalized)
            if existing is not None:
                return False, existing
            _account(pool, normalized, create=True, now=now)
            return True, entity_of(pool, normalized)

        persisted, entity_id = self._write(change)
        return {"account_id": normalized, "entity_id": entity_id if persisted else None, "persisted": persisted}

    def bind(self, account_id: object, entity_id: object, bound_by: str | None, require_unbound: bool) -> dict[str, Any]:
        """Link an account to an entity (a merge when the account already has one).
        Raises IdentityError: 422 invalid input, 404 unknown entity, 409 already bound
        (with ``require_unbound``) or too many accounts on one platform."""
        normalized = _account_or_422(account_id)
        target_id = str(entity_id or "").strip()
        if not target_id:
            raise IdentityError(422, "bad_entity_id", "entity_id is required")
        persisted, value = self._write(lambda pool, now: _bind(pool, normalized, target_id, now, bound_by or None, require_unbound))
        return {**(value or {}), "persisted": persisted, "account_id": normalized}

    def unbind(self, account_id: object, require_provenance: bool) -> dict[str, Any]:
        """Move one account out into a fresh entity (the rollback of a wrong bind)."""
        normalized = _account_or_422(account_id)
        persisted, value = self._write(lambda pool, now: _unbind(pool, normalized, now, require_provenance))
        return {**(value or {}), "persisted": persisted, "account_id": normalized}

    def merge(self, left: object, right: object) -> dict[str, Any]:
        """Merge two entities (idempotent, commutative). Raises IdentityError 422/404/409."""
        a, b = str(left or "").strip(), str(right or "").strip()
        if not a or not b:
            raise IdentityError(422, "bad_entity_id", "both entity ids are required")

        def change(pool: Pool, now: str) -> tuple[bool, dict[str, Any]]:
            before = resolve(pool, a), resolve(pool, b)
            survivor = _merge(pool, a, b, now)
            return before[0] != before[1], {"entity_id": survivor}

        persisted, value = self._write(change)
        return {**(value or {}), "persisted": persisted}

    def forget(self, entity_id: object) -> dict[str, Any]:
        """Erase one entity and every account ledger in it (see the module docstring)."""
        target_id = str(entity_id or "").strip()
        if not target_id:
            raise IdentityError(422, "bad_entity_id", "entity_id is required")
        persisted, value = self._write(lambda pool, now: _forget(pool, target_id, now))
        return {**(value or {}), "persisted": persisted}

    def import_legacy(self, platform: str, source: str, profiles: dict[str, Any], final: bool) -> dict[str, Any]:
        """Add one chunk of a plugin's legacy ledger (once per (source, account)); the
        final chunk opens the platform's barrier."""
        persisted, value = self._write(lambda pool, now: _import_legacy(pool, platform.strip().lower(), source, profiles, final, now))
        return {**(value or {}), "persisted": persisted}

    def waive_barrier(self, platform: str) -> dict[str, Any]:
        """Open a platform's barrier without importing anything (the escape hatch)."""
        key = platform.strip().lower()

        def change(pool: Pool, now: str) -> tuple[bool, dict[str, Any]]:
            barrier = pool["legacy_barriers"].setdefault(
                key, {"source": "", "status": "pending", "seeded_at": now, "cleared_at": None, "chunks": 0, "accounts": 0, "skipped": 0}
            )
            if barrier.get("status") == "cleared":
                return False, {"platform": key, "barrier": "cleared"}
            barrier.update({"status": "cleared", "cleared_at": now, "waived": True})
            return True, {"platform": key, "barrier": "cleared"}

        persisted, value = self._write(change)
        return {**(value or {}), "persisted": persisted}

    def reconcile(self, events: list[dict[str, Any]]) -> dict[str, Any]:
        """Fold owner signal events found on fact rows back into the ledgers (once per
        event id); events of a platform whose barrier is pending are counted as gated."""

        def change(pool: Pool, now: str) -> tuple[bool, dict[str, Any]]:
            applied = gated = 0
            for event in events:
                target = ident.normalize_account_id(event.get("speaker_id"))
                if target is None:
                    continue
                if barrier_pending(pool, ident.platform_of(target)):
                    gated += 1
                    continue
                record = _account(pool, target, create=True, now=now)
                if record is not None and ident.apply_signal_event(record, event):
                    applied += 1
            return applied > 0, {"scanned": len(events), "applied": applied, "gated": gated}

        persisted, value = self._write(change)
        return {**(value or {"scanned": len(events), "applied": 0, "gated": 0}), "persisted": persisted}


# -- the changes (pure over a draft pool) ------------------------------------------------


def _account_or_422(account_id: object) -> str:
    normalized = ident.normalize_account_id(account_id)
    if normalized is None:
        raise IdentityError(422, "bad_account_id", "invalid account_id (expected platform:actor)")
    return normalized


def _seed_entity_id(pool: Pool, account_id: str, generation: int = 0) -> str:
    while True:
        candidate = ident.derive_entity_id(account_id, generation)
        if candidate not in pool["entities"] and candidate not in pool["forgotten"]:
            return candidate
        generation += 1


def _new_entity(pool: Pool, entity_id: str, now: str) -> dict[str, Any]:
    record = {"entity_id": entity_id, "status": "active", "created_at": now, "updated_at": now, "accounts": {}}
    pool["entities"][entity_id] = record
    return record


def _account(pool: Pool, account_id: str, *, create: bool, now: str) -> dict[str, Any] | None:
    entity_id = entity_of(pool, account_id)
    if entity_id is not None:
        existing = pool["entities"][entity_id]["accounts"].get(account_id)
        if existing is not None:
            return existing  # type: ignore[no-any-return]
    if not create:
        return None
    entity_id = _seed_entity_id(pool, account_id)
    entity = pool["entities"].get(entity_id) or _new_entity(pool, entity_id, now)
    record = ident.account_record(account_id, {"bound_at": now})
    entity["accounts"][account_id] = record
    entity["updated_at"] = now
    pool["account_index"][account_id] = entity_id
    return record


def _limit_guard(entity: dict[str, Any], platform: str, incoming: Iterable[str]) -> None:
    accounts = {a for a in entity["accounts"] if ident.platform_of(a) == platform}
    accounts.update(a for a in incoming if ident.platform_of(a) == platform)
    if len(accounts) > ident.MAX_ACCOUNTS_PER_ENTITY_PER_PLATFORM:
        raise IdentityError(
            409,
            "too_many_accounts",
            f"this entity already holds {ident.MAX_ACCOUNTS_PER_ENTITY_PER_PLATFORM} accounts on {platform}; unbind one first",
        )


def _merge(pool: Pool, left: str, right: str, now: str) -> str:
    a, b = resolve(pool, left), resolve(pool, right)
    if a is None or b is None:
        raise IdentityError(404, "unknown_entity", "unknown entity")
    if a == b:
        return a
    first, second = pool["entities"][a], pool["entities"][b]
    survivor, absorbed = (first, second) if ident.merge_order(first) <= ident.merge_order(second) else (second, first)
    moving = list(absorbed["accounts"])
    for platform in {ident.platform_of(account) for account in moving}:
        _limit_guard(survivor, platform, moving)
    for account_id, record in absorbed["accounts"].items():
        if account_id in survivor["accounts"]:
            raise IdentityError(500, "ledger_clash", f"merge would overwrite the ledger of {account_id}")
        survivor["accounts"][account_id] = record
        pool["account_index"][account_id] = survivor["entity_id"]
    canonical = survivor.setdefault("canonical_accounts", {})
    for platform, entry in (absorbed.get("canonical_accounts") or {}).items():
        if platform not in canonical:
            canonical[platform] = dict(entry)
        else:
            survivor.setdefault("superseded_canonicals", []).append(
                {"platform": platform, "account_id": entry.get("account_id"), "at": now}
            )
    absorbed.update(
        {
            "accounts": {},
            "canonical_accounts": {},
            "status": "merged",
            "merged_into": survivor["entity_id"],
            "merged_at": now,
            "merged_accounts": moving,
        }
    )
    survivor["updated_at"] = now
    return str(survivor["entity_id"])


def _bind(
    pool: Pool, account_id: str, entity_id: str, now: str, bound_by: str | None, require_unbound: bool
) -> tuple[bool, dict[str, Any]]:
    target = resolve(pool, entity_id)
    if target is None:
        raise IdentityError(404, "unknown_entity", "unknown entity")
    current = entity_of(pool, account_id)
    if current == target:
        return False, {"entity_id": target, "changed": False}
    if current is not None:
        held = pool["entities"][current]["accounts"]
        if require_unbound and (len(held) > 1 or held.get(account_id, {}).get("bound_by")):
            raise IdentityError(409, "already_bound", "account is already bound; unbind it first")
        merged = _merge(pool, current, target, now)
        record = pool["entities"][merged]["accounts"].get(account_id)
        if record is not None and bound_by:
            record.update({"bound_by": bound_by, "bound_at": now})
        return True, {"entity_id": merged, "changed": True, "merged": True, "bound_by": bound_by}
    entity = pool["entities"][target]
    _limit_guard(entity, ident.platform_of(account_id), [account_id])
    entity["accounts"][account_id] = ident.account_record(account_id, {"bound_at": now, "bound_by": bound_by})
    entity["updated_at"] = now
    pool["account_index"][account_id] = target
    return True, {"entity_id": target, "changed": True, "bound_by": bound_by}


def _sums(entity: dict[str, Any]) -> tuple[float, int]:
    rows = entity["accounts"].values()
    return sum(float(r.get("adjustment") or 0.0) for r in rows), sum(max(0, int(r.get("message_count") or 0)) for r in rows)


def _unbind(pool: Pool, account_id: str, now: str, require_provenance: bool) -> tuple[bool, dict[str, Any]]:
    entity_id = entity_of(pool, account_id)
    if entity_id is None:
        return False, {"entity_id": None, "changed": False}
    entity = pool["entities"][entity_id]
    record = entity["accounts"].get(account_id)
    if record is None:
        return False, {"entity_id": entity_id, "changed": False}
    if require_provenance and not record.get("bound_by"):
        return False, {"entity_id": entity_id, "changed": False, "reason": "not_bound"}
    before = _sums(entity)
    del entity["accounts"][account_id]
    canonical = entity.get("canonical_accounts") or {}
    platform = ident.platform_of(account_id)
    if canonical.get(platform, {}).get("account_id") == account_id:
        del canonical[platform]
    entity["updated_at"] = now
    generation = int(record.get("generation") or 0) + 1
    while (
        ident.derive_entity_id(account_id, generation) in pool["entities"]
        or ident.derive_entity_id(account_id, generation) in pool["forgotten"]
    ):
        generation += 1
    fresh_id = ident.derive_entity_id(account_id, generation)
    record["generation"] = generation
    record["bound_at"] = now
    record.pop("bound_by", None)
    _new_entity(pool, fresh_id, now)["accounts"][account_id] = record
    pool["account_index"][account_id] = fresh_id
    after = _sums(entity)
    probe = ident.TRUST_BY_TIER["normal"]
    return True, {
        "entity_id": fresh_id,
        "previous_entity_id": entity_id,
        "changed": True,
        "ledger_delta": float(record.get("adjustment") or 0.0),
        "effective_delta": ident.effective_trust(probe, *after) - ident.effective_trust(probe, *before),
    }


def _forget(pool: Pool, entity_id: str, now: str) -> tuple[bool, dict[str, Any]]:
    target = resolve(pool, entity_id)
    if target is None:
        return False, {"entity_id": None, "changed": False, "accounts": []}
    accounts = list(pool["entities"][target]["accounts"])
    for account_id in accounts:
        pool["account_index"].pop(account_id, None)
        pool["channel_collisions"].pop(account_id, None)
    # Entities merged into this one carry the same person's account ids (merged_accounts).
    person = [other for other in pool["entities"] if other == target or resolve(pool, other) == target]
    for other_id in person:
        del pool["entities"][other_id]
        pool["forgotten"][other_id] = {"forgotten_at": now, "accounts": []}
    pool["forgotten"][target] = {"forgotten_at": now, "accounts": [ident.forgotten_account_token(a) for a in accounts]}
    return True, {"entity_id": target, "changed": True, "accounts": accounts}


def _import_legacy(pool: Pool, platform: str, source: str, profiles: dict[str, Any], final: bool, now: str) -> tuple[bool, dict[str, Any]]:
    imported: list[str] = []
    skipped: list[dict[str, str]] = []
    forgotten = {token for entry in pool["forgotten"].values() for token in entry.get("accounts") or []}
    changed = False
    for bare_key, raw in profiles.items():
        account_id = ident.normalize_account_id(f"{platform}:{str(bare_key).strip()}")
        if account_id is None or not isinstance(raw, dict):
            skipped.append({"key": str(bare_key)[:64], "reason": "invalid_account_id"})
            continue
        if ident.forgotten_account_token(account_id) in forgotten:
            skipped.append({"key": str(bare_key)[:64], "reason": "forgotten"})
            continue
        record = _account(pool, account_id, create=True, now=now)
        if record is None or (record.get("legacy_import") or {}).get("source") == source:
            continue
        legacy = ident.legacy_profile(raw)
        record["adjustment"] = float(record.get("adjustment") or 0.0) + legacy["adjustment"]
        record["message_count"] = min(ident.activity_cap(), int(record.get("message_count") or 0) + legacy["message_count"])
        record["processed_signal_events"] = ident.clean_event_ids(record["processed_signal_events"] + legacy["processed_signal_events"])
        record["processed_activity_events"] = ident.clean_event_ids(
            record["processed_activity_events"] + legacy["processed_activity_events"], keep_last=ident.ACTIVITY_EVENT_HISTORY_LIMIT
        )
        record["legacy_import"] = {"source": source, "at": now}
        imported.append(account_id)
        changed = True
    barrier = pool["legacy_barriers"].setdefault(
        platform, {"source": source, "status": "pending", "seeded_at": now, "cleared_at": None, "chunks": 0, "accounts": 0, "skipped": 0}
    )
    if final and barrier.get("status") != "cleared":
        barrier.update({"status": "cleared", "cleared_at": now})
        changed = True
    changed = changed or bool(skipped)
    if changed:
        barrier["accounts"] = int(barrier.get("accounts") or 0) + len(imported)
        barrier["skipped"] = int(barrier.get("skipped") or 0) + len(skipped)
        barrier["chunks"] = int(barrier.get("chunks") or 0) + 1
    return changed, {"imported": imported, "skipped": skipped, "barrier": barrier["status"]}


# -- the profile (read) ------------------------------------------------------------------


def _profile(pool: Pool, loaded: bool, raw_account: object) -> dict[str, Any]:
    account_id = ident.normalize_account_id(raw_account)
    if account_id is None:
        return {"account_id": None, "known": False}
    platform = ident.platform_of(account_id)
    entity_id = entity_of(pool, account_id) if loaded else None
    entity = pool["entities"].get(entity_id or "") or {}
    record = (entity.get("accounts") or {}).get(account_id) or {}
    adjustment, activity = _sums(entity) if entity else (0.0, 0)
    canonical = ((entity.get("canonical_accounts") or {}).get(platform) or {}).get("account_id") if entity_id else None
    members = sorted(entity.get("accounts") or {}, key=lambda a: (str(entity["accounts"][a].get("bound_at") or ""), a))
    if canonical in members:
        members.remove(canonical)
        members.insert(0, canonical)
    return {
        "account_id": account_id,
        "known": bool(record),
        "entity_id": entity_id,
        "platform": platform,
        "barrier_pending": barrier_pending(pool, platform),
        "entity_accounts": members if entity_id else [],
        "canonical_account": canonical,
        "adjustment_sum": adjustment,
        "activity_count_sum": activity,
        "account_adjustment": float(record.get("adjustment") or 0.0),
        "account_message_count": int(record.get("message_count") or 0),
        "signal_event_count": len(record.get("processed_signal_events") or []),
        "activity_event_count": len(record.get("processed_activity_events") or []),
        "bound_at": record.get("bound_at"),
        "bound_by": record.get("bound_by"),
        "channels_seen": sorted((record.get("channels_seen") or {}).keys()),
        "channel_collision": account_id in pool["channel_collisions"],
        "platform_identity_scope": dict(pool["platform_identity_scope"].get(platform) or {}),
        "legacy_barriers": {k: dict(v) for k, v in pool["legacy_barriers"].items()},
    }
