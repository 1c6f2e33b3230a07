"""The identity and trust routes of the reference's memory server, which its QQ bridge
(``plugin/plugins/qq_auto_reply/memory_bridge.py``) and the trusted-users page
(``dashboard_service.py``, ``settings_service.py``) call. None names a character: trust
belongs to the person, and the pool is the process-wide ``speaker_trust.json``
(:mod:`nekomem.stores.speaker_trust`). docs/NEKO-ROUTES.md lists every field.

- ``POST /internal/identity/scope`` ``{platform, channel, actor_scope, conversation_scope,
  asserted_by}`` -> the stored declaration + ``persisted``, ``platform``;
- ``POST /internal/identity/accounts/ensure`` ``{account_id}`` -> ``{account_id, entity_id,
  persisted}``;
- ``POST /internal/identity/accounts/bind`` ``{account_id, entity_id, bound_by?,
  require_unbound?}`` -> ``{entity_id, changed, merged?, bound_by?, persisted, account_id}``;
- ``POST /internal/identity/accounts/unbind`` ``{account_id, require_provenance?}`` ->
  ``{entity_id, previous_entity_id?, changed, reason?, ledger_delta?, effective_delta?,
  persisted, account_id, stranded_rows}``;
- ``POST /internal/identity/entities/merge`` ``{entity_id, other_entity_id}`` ->
  ``{entity_id, persisted}``;
- ``POST /internal/identity/entities/forget`` ``{entity_id}`` -> ``{entity_id, changed,
  accounts, persisted, facts_erased}``: the entity's ledgers leave the pool and every fact
  row its accounts said (``speaker_id``) or that carries its ``speaker_entity_id`` is erased
  from every character, through the same erasure as a DELETE;
- ``GET /internal/trust/profile?account_id=`` -> the read-only profile of one account;
- ``POST /internal/trust/import_legacy_profiles`` ``{platform, source, profiles (<= 500),
  chunk_index?, final?}`` -> ``{imported, skipped, barrier, persisted}``;
- ``POST /internal/trust/waive_legacy_barrier`` ``{platform}`` -> ``{platform, barrier,
  persisted}``;
- ``POST /internal/trust/reconcile_from_facts`` ``{character_names?}`` -> ``{scanned,
  applied, gated, persisted}``.

Refusals are the project's error shape: 422 for a bad field, 404 for an unknown entity,
409 for a bind that would merge two people or overfill an entity (the reference answers
these as FastAPI ``{"detail"}`` bodies with the same status codes).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, TypeVar

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from nekomem.actors.messages import DeleteEntry, ListEntries
from nekomem.domain import speaker_identity as ident
from nekomem.domain.layers import FACTS
from nekomem.http.bodies import convert_body, read_json_object
from nekomem.http.errors import ApiError
from nekomem.http.operations import Operation, Parameter
from nekomem.http.runtime_access import ask, runtime_of
from nekomem.runtime.reply import Reply
from nekomem.stores.layout import InvalidName, validate_name
from nekomem.stores.speaker_trust import IdentityError, SpeakerTrustPool
from nekomem.wire.answers import DeleteAnswer, PageAnswer, PublicEntry

T = TypeVar("T")


class ScopeBody(msgspec.Struct, kw_only=True):
    platform: str
    channel: str
    actor_scope: str
    conversation_scope: str
    asserted_by: str


class AccountBody(msgspec.Struct, kw_only=True):
    account_id: str


class BindBody(msgspec.Struct, kw_only=True):
    account_id: str
    entity_id: str
    bound_by: str | None = None
    require_unbound: bool = False


class UnbindBody(msgspec.Struct, kw_only=True):
    account_id: str
    require_provenance: bool = False


class MergeBody(msgspec.Struct, kw_only=True):
    entity_id: str
    other_entity_id: str


class EntityBody(msgspec.Struct, kw_only=True):
    entity_id: str


class LegacyImportBody(msgspec.Struct, kw_only=True):
    source: str
    platform: str
    chunk_index: int = 0
    final: bool = False
    # Profiles stay loose: one dirty profile is skipped, it never fails the chunk (a 422
    # would wedge the plugin's migration, which retries the same chunk forever).
    profiles: dict[str, Any] = msgspec.field(default_factory=dict)


class WaiveBody(msgspec.Struct, kw_only=True):
    platform: str


class ReconcileBody(msgspec.Struct, kw_only=True):
    character_names: list[str] | None = None


def _pool(request: Request) -> SpeakerTrustPool:
    return runtime_of(request).speaker_trust


async def _run(call: Callable[[], T]) -> T:
    """Run a blocking pool call off the event loop; IdentityError becomes the error answer."""
    try:
        return await asyncio.to_thread(call)
    except IdentityError as exc:
        raise ApiError(exc.status, exc.code, exc.message) from None


async def _body(request: Request, cls: type[T]) -> T:
    return convert_body(await read_json_object(request), cls)


def _platform(raw: str) -> str:
    platform = ident.valid_platform(raw)
    if platform is None:
        raise ApiError(422, "bad_platform", "invalid platform")
    return platform


async def declare_scope(request: Request) -> Response:
    body = await _body(request, ScopeBody)
    pool = _pool(request)
    return JSONResponse(
        await _run(lambda: pool.declare_scope(body.platform, body.channel, body.actor_scope, body.conversation_scope, body.asserted_by))
    )


async def ensure_account(request: Request) -> Response:
    body = await _body(request, AccountBody)
    pool = _pool(request)
    return JSONResponse(await _run(lambda: pool.ensure_account(body.account_id)))


async def bind_account(request: Request) -> Response:
    body = await _body(request, BindBody)
    pool = _pool(request)
    return JSONResponse(await _run(lambda: pool.bind(body.account_id, body.entity_id, body.bound_by, body.require_unbound)))


async def unbind_account(request: Request) -> Response:
    body = await _body(request, UnbindBody)
    pool = _pool(request)
    result = await _run(lambda: pool.unbind(body.account_id, body.require_provenance))
    # nekomem never routes an account's writes into another account's subject, so an
    # unbind strands no rows (the reference counts the ones its canonical routing left).
    return JSONResponse({**result, "stranded_rows": 0})


async def merge_entities(request: Request) -> Response:
    body = await _body(request, MergeBody)
    pool = _pool(request)
    return JSONResponse(await _run(lambda: pool.merge(body.entity_id, body.other_entity_id)))


def _delete(entry_id: str) -> Callable[[Reply], DeleteEntry]:
    return lambda reply: DeleteEntry(id=entry_id, reply=reply)


async def _fact_rows(request: Request, name: str) -> list[PublicEntry]:
    rt = runtime_of(request)
    page = await ask(rt, name, FACTS, lambda reply: ListEntries(status="all", offset=0, limit=10**9, reply=reply), PageAnswer)
    return page.items


async def _erase_spoken(request: Request, accounts: set[str], entities: set[str]) -> int:
    """Erase every fact row said by ``accounts`` / stamped with ``entities``, in every
    character; returns how many."""
    rt = runtime_of(request)
    erased = 0
    for name in await asyncio.to_thread(rt.known_characters):
        for row in await _fact_rows(request, name):
            if ident.spoken_by(row, accounts, entities):
                await ask(rt, name, FACTS, _delete(str(row["id"])), DeleteAnswer)
                erased += 1
    return erased


async def forget_entity(request: Request) -> Response:
    body = await _body(request, EntityBody)
    pool = _pool(request)
    accounts, entities = await asyncio.to_thread(pool.person_of, body.entity_id)
    # The facts first: a failure leaves the entity in the pool, so a retry finds the same
    # accounts again (after the pool forgets them, nothing would lead back to their rows).
    erased = await _erase_spoken(request, accounts, entities) if accounts or entities else 0
    result = await _run(lambda: pool.forget(body.entity_id))
    return JSONResponse({**result, "facts_erased": erased})


async def trust_profile(request: Request) -> Response:
    account_id = request.query_params.get("account_id")
    if account_id is None:
        raise ApiError(422, "missing_account_id", "the account_id query parameter is required")
    pool = _pool(request)
    return JSONResponse(await _run(lambda: pool.profile(account_id)))


async def import_legacy_profiles(request: Request) -> Response:
    body = await _body(request, LegacyImportBody)
    platform = _platform(body.platform)
    if not body.source.strip():
        raise ApiError(422, "bad_source", "source is required")
    if body.chunk_index < 0:
        raise ApiError(422, "bad_chunk_index", "chunk_index must be >= 0")
    if len(body.profiles) > ident.LEGACY_IMPORT_CHUNK_MAX:
        raise ApiError(422, "too_many_profiles", f"profiles must contain at most {ident.LEGACY_IMPORT_CHUNK_MAX} items")
    pool = _pool(request)
    return JSONResponse(await _run(lambda: pool.import_legacy(platform, body.source, body.profiles, body.final)))


async def waive_legacy_barrier(request: Request) -> Response:
    body = await _body(request, WaiveBody)
    platform = _platform(body.platform)
    pool = _pool(request)
    return JSONResponse(await _run(lambda: pool.waive_barrier(platform)))


async def reconcile_from_facts(request: Request) -> Response:
    body = await _body(request, ReconcileBody)
    rt = runtime_of(request)
    server = rt.settings.server
    known = await asyncio.to_thread(rt.known_characters)
    events: list[dict[str, Any]] = []
    for raw_name in body.character_names or known:
        try:
            name = validate_name(raw_name, max_length=server.name_max_length, max_units=server.name_max_units)
        except InvalidName as exc:
            raise ApiError(400, "invalid_name", str(exc)) from None
        if name in known:
            for row in await _fact_rows(request, name):
                events.extend(ident.signal_events(row))
    pool = _pool(request)
    return JSONResponse(await _run(lambda: pool.reconcile(events)))


ACCOUNT_QUERY: Parameter = {"name": "account_id", "in": "query", "required": True, "schema": {"type": "string", "minLength": 1}}


def operations() -> list[Operation]:
    i, t = "/internal/identity", "/internal/trust"
    return [
        Operation(f"{i}/scope", "POST", declare_scope, "Declare what a platform's identifiers mean", body=ScopeBody),
        Operation(f"{i}/accounts/ensure", "POST", ensure_account, "Give an account an entity", body=AccountBody),
        Operation(f"{i}/accounts/bind", "POST", bind_account, "Link an account to an entity (human-triggered)", body=BindBody),
        Operation(f"{i}/accounts/unbind", "POST", unbind_account, "Move an account out into its own entity", body=UnbindBody),
        Operation(f"{i}/entities/merge", "POST", merge_entities, "Merge two entities (human-triggered)", body=MergeBody),
        Operation(f"{i}/entities/forget", "POST", forget_entity, "Erase an entity, its ledgers and its facts", body=EntityBody),
        Operation(f"{t}/profile", "GET", trust_profile, "Read-only trust profile of an account", [ACCOUNT_QUERY]),
        Operation(
            f"{t}/import_legacy_profiles",
            "POST",
            import_legacy_profiles,
            "Import a chunk of a legacy trust ledger",
            body=LegacyImportBody,
        ),
        Operation(f"{t}/waive_legacy_barrier", "POST", waive_legacy_barrier, "Open a platform's legacy barrier", body=WaiveBody),
        Operation(f"{t}/reconcile_from_facts", "POST", reconcile_from_facts, "Rebuild signal folds from fact rows", body=ReconcileBody),
    ]
