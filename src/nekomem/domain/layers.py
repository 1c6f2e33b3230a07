"""The one declaration of a character's layers.

Each child of a character's supervisor is declared here once, in start order: its address
(what siblings send to), the actor class that hosts it, the journal events it applies, the
recall tiers it owns and feeds, its listing under ``/api/characters/{name}/{layer}``, and
the outbox operations it runs. The supervisor, the journal, the recall index, the outbox
and the OpenAPI document all read this table (at use, not at import), so a new layer is
one :class:`LayerSpec` here plus its actor and layer object. :func:`register_layer` adds
one at run time (tests use it for a throw-away layer).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NewType

Address = NewType("Address", str)
"""The name a character's child is reached by (``ports.send(FACTS, message)``)."""

RECALL = Address("recall")
RECENT = Address("recent")
FACTS = Address("facts")
REFLECTIONS = Address("reflections")
PERSONA = Address("persona")
OUTBOX = Address("outbox")


@dataclass(frozen=True)
class LayerSpec:
    """One child of a character: see the module."""

    address: Address
    actor: str  # "package.module:Class" of its ChildActor, imported when a character starts
    events: tuple[str, ...] = ()  # the journal event types it applies (events.ndjson)
    tiers: tuple[str, ...] = ()  # the recall tiers it owns (BM25 over all of them)
    vector_tiers: tuple[str, ...] = ()  # those of its tiers that also get vectors
    listing: str | None = None  # its key in /api/characters/{name}/{layer}, if it has one
    outbox_ops: tuple[str, ...] = ()  # the outbox operation types it runs


_LAYERS: list[LayerSpec] = [
    # Start order matters: recall first so the owners can feed it while loading; outbox
    # last so that replayed work finds every handler alive.
    LayerSpec(RECALL, "nekomem.layers.recall.layer:RecallActor"),
    LayerSpec(RECENT, "nekomem.layers.recent.actor:RecentActor"),
    LayerSpec(
        FACTS,
        "nekomem.layers.facts.actor:FactActor",
        events=("fact.added", "fact.absorbed", "fact.archived", "fact.updated", "fact.deleted"),
        tiers=("fact", "fact_archive"),
        vector_tiers=("fact",),
        listing="facts",
        outbox_ops=("extract_facts",),
    ),
    LayerSpec(
        REFLECTIONS,
        "nekomem.layers.reflections.actor:ReflectionActor",
        events=(
            "reflection.synthesized",
            "reflection.state_changed",
            "reflection.surfaced",
            "reflection.rebutted",
            "reflection.evidence_updated",
            "reflection.updated",
            "reflection.deleted",
        ),
        tiers=("reflection",),
        vector_tiers=("reflection",),
        listing="reflections",
    ),
    LayerSpec(
        PERSONA,
        "nekomem.layers.persona.layer:PersonaActor",
        events=(
            "persona.fact_added",
            "persona.fact_mentioned",
            "persona.suppressed",
            "persona.evidence_updated",
            "persona.entry_updated",
            "persona.entry_deleted",
            "correction.queued",
            "correction.resolved",
        ),
        listing="persona",
    ),
    LayerSpec(OUTBOX, "nekomem.layers.outbox.layer:OutboxActor"),
]


@dataclass(frozen=True)
class _Derived:
    """What the readers of the table look up on hot paths, rebuilt when the table changes."""

    layers: tuple[LayerSpec, ...]
    event_owners: dict[str, Address]
    tier_owners: dict[str, Address]
    recall_tiers: tuple[str, ...]
    vector_tiers: tuple[str, ...]
    tier_families: dict[str, tuple[str, ...]]
    outbox_handlers: dict[str, Address]
    listings: dict[str, Address]


def _derive() -> _Derived:
    return _Derived(
        layers=tuple(_LAYERS),
        event_owners={event: spec.address for spec in _LAYERS for event in spec.events},
        tier_owners={tier: spec.address for spec in _LAYERS for tier in spec.tiers},
        recall_tiers=tuple(tier for spec in _LAYERS for tier in spec.tiers),
        vector_tiers=tuple(tier for spec in _LAYERS for tier in spec.vector_tiers),
        tier_families={tier: spec.tiers for spec in _LAYERS for tier in spec.tiers},
        outbox_handlers={op: spec.address for spec in _LAYERS for op in spec.outbox_ops},
        listings={spec.listing: spec.address for spec in _LAYERS if spec.listing is not None},
    )


_derived = _derive()


def layers() -> tuple[LayerSpec, ...]:
    """Every declared layer, in start order."""
    return _derived.layers


def register_layer(spec: LayerSpec) -> Callable[[], None]:
    """Declare ``spec`` (started just before the outbox). Returns the function that takes it
    back. Raises ValueError when its address, an event, a tier or its listing is taken."""
    global _derived
    for other in _LAYERS:
        if other.address == spec.address:
            raise ValueError(f"layer {spec.address} is already declared")
        for kind, mine, theirs in (
            ("event", spec.events, other.events),
            ("tier", spec.tiers, other.tiers),
            ("outbox operation", spec.outbox_ops, other.outbox_ops),
        ):
            taken = set(mine) & set(theirs)
            if taken:
                raise ValueError(f"{kind} {sorted(taken)[0]} already belongs to {other.address}")
        if spec.listing is not None and spec.listing == other.listing:
            raise ValueError(f"listing {spec.listing} already belongs to {other.address}")
    _LAYERS.insert(len(_LAYERS) - 1, spec)
    _derived = _derive()

    def unregister() -> None:
        global _derived
        if spec in _LAYERS:
            _LAYERS.remove(spec)
            _derived = _derive()

    return unregister


def event_owners() -> dict[str, Address]:
    """Journal event type -> the address of the layer that applies it (do not mutate)."""
    return _derived.event_owners


def tier_owners() -> dict[str, Address]:
    """Recall tier -> the address of the layer that owns its entries (do not mutate)."""
    return _derived.tier_owners


def recall_tiers() -> tuple[str, ...]:
    """Every recall tier, in declaration order."""
    return _derived.recall_tiers


def vector_tiers() -> tuple[str, ...]:
    """The recall tiers that get vectors, in declaration order."""
    return _derived.vector_tiers


def tier_family(tier: str) -> tuple[str, ...]:
    """The tiers of the layer that owns ``tier`` (an owner replaces all of them at once:
    the active facts and their archive); ``(tier,)`` for a tier nobody declares."""
    return _derived.tier_families.get(tier, (tier,))


def outbox_handlers() -> dict[str, Address]:
    """Outbox operation type -> the address of the layer that runs it (do not mutate)."""
    return _derived.outbox_handlers


def listings() -> dict[str, Address]:
    """Listing key of /api/characters/{name}/{layer} -> the layer's address (do not mutate)."""
    return _derived.listings
