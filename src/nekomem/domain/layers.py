"""The one declaration of a character's layers.

Each child of a character's supervisor is declared once, in its own folder
(``nekomem/layers/<name>/declaration.py``: one :class:`LayerSpec`), and this module keeps
the table of them in start order. A declaration lists everything the rest of the system
needs from its layer: its address (what siblings send to) and the actor class that hosts
it, the files of the character folder it owns, its journal events (typed payloads, one
:class:`JournalEvent` Struct each), the recall tiers it owns and feeds, its listing under
``/api/characters/{name}/{layer}``, its outbox operations, the erasures whose text it
scrubs from its copies, its counts in the memory browser, its place in the scoped routes,
its ``nekomem delete`` flag, its rows in the importer's report, its own settings section
and its block of the working context. The supervisor, the journal, the layout, the
erasure relay, recall, the outbox, the browser, the scoped routes, the CLI, the importer,
the settings loader, ``/new_dialog`` and the OpenAPI document all read this table at use (never copied at import), so a new layer is its
folder and one line in :data:`BUILTIN`; :func:`register_layer` adds one at run time
(tests use it for a throw-away layer).

This module sits below the layers, so it names each declaration by its module path (as a
declaration names its actor class) and imports them on first use. A declaration module
is plain data: it imports nothing above ``domain``/``stores`` (``tests/test_layering.py``
holds it to that), so loading the table never starts the actor stack.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Literal, NewType, Protocol

import msgspec

Address = NewType("Address", str)
"""The name a character's child is reached by (``ports.send(FACTS, message)``)."""

RECALL = Address("recall")
RECENT = Address("recent")
FACTS = Address("facts")
REFLECTIONS = Address("reflections")
PERSONA = Address("persona")
OUTBOX = Address("outbox")

# The declarations of the built-in layers, in start order. Recall first so the owners can
# feed it while loading; the outbox last so that replayed work finds every handler alive
# (and because it ends every erasure relay: it answers).
BUILTIN: tuple[str, ...] = (
    "nekomem.layers.recall.declaration:DECLARATION",
    "nekomem.layers.recent.declaration:DECLARATION",
    "nekomem.layers.facts.declaration:DECLARATION",
    "nekomem.layers.reflections.declaration:DECLARATION",
    "nekomem.layers.persona.declaration:DECLARATION",
    "nekomem.layers.outbox.declaration:DECLARATION",
)


class JournalEvent(msgspec.Struct, frozen=True, kw_only=True):
    """The payload of one journal event type; ``type`` is its name in ``events.ndjson``.
    A layer declares one subclass per event it applies and dispatches on the class."""

    type: ClassVar[str]


Erasure = Literal["turns", "entries"]
"""What an erasure forgets: stored turns (``layers/recent/erase.py``) or a long-term entry
(``JournaledViews.erase``). A layer that keeps copies of such text scrubs them when
:class:`~nekomem.actors.messages.ScrubTexts` passes through it."""
Count = int | dict[str, int]


class CharacterFolder(Protocol):
    """What a disk count reads: the character's folder (nekomem's files) and its home (the
    reference's, the same folder outside a N.E.K.O. memory folder)."""

    @property
    def folder(self) -> Path: ...

    @property
    def home(self) -> Path: ...


@dataclass(frozen=True)
class Scoped:
    """The layer's entries are filtered by subject on the scoped routes
    (``/internal/memory/{name}/scoped_*``), listed with this ``ListEntries`` status;
    ``counts``: its (key, ``ListEntries`` status) counts in a subject's row of
    ``scoped_subjects``."""

    status: str | None = None
    counts: tuple[tuple[str, str | None], ...] = ()


@dataclass(frozen=True)
class ForgetFlag:
    """``nekomem delete NAME --<flag> ID`` forgets one entry of the layer; ``what`` names
    such an entry in the command's help."""

    flag: str
    what: str


@dataclass(frozen=True)
class LayerSpec:
    """One child of a character: see the module."""

    address: Address
    actor: str  # "package.module:Class" of its ChildActor, imported when a character starts
    files: tuple[str, ...] = ()  # the entries of the character folder it owns (a folder holding one is a character)
    events: tuple[type[JournalEvent], ...] = ()  # the journal events it applies (events.ndjson)
    tiers: tuple[str, ...] = ()  # the recall tiers it owns (BM25 over all of them)
    vector_tiers: tuple[str, ...] = ()  # those of its tiers that also get vectors
    listing: str | None = None  # its key in /api/characters/{name}/{layer}, if it has one
    outbox_ops: tuple[str, ...] = ()  # the outbox operation types it runs
    scrubs: tuple[Erasure, ...] = ()  # the erasures whose texts ScrubTexts takes through it
    counts: tuple[str, ...] = ()  # its keys in the browser's character counts (it answers CountEntries)
    disk_counts: Callable[[CharacterFolder], dict[str, Count]] | None = None  # the same, from its files
    scoped: Scoped | None = None  # its entries on the scoped routes
    forget: ForgetFlag | None = None  # `nekomem delete NAME --<flag> ID` forgets one of its entries
    import_counts: tuple[str, ...] = ()  # its rows in the importer's report (importer/report.py)
    # It answers RenderBlock: its block of the working context (/new_dialog), after the
    # long-term sections (persona and reflections render theirs as one chain, RenderContext).
    render: bool = False
    # Its own settings section (a frozen Struct of documented defaults), read as [<address>]
    # in the TOML file and NEKOMEM_<FIELD>; the layer reads it with settings.section().
    # The built-in layers keep theirs in config/ (config sits below every room).
    settings: type[msgspec.Struct] | None = None

    @property
    def event_types(self) -> tuple[str, ...]:
        """The names of its journal events."""
        return tuple(event.type for event in self.events)


def load_declaration(path: str) -> LayerSpec:
    """The LayerSpec at ``"package.module:NAME"``. Raises ImportError, AttributeError, or
    TypeError when it is no LayerSpec."""
    module_name, _, attr = path.partition(":")
    spec = getattr(importlib.import_module(module_name), attr)
    if not isinstance(spec, LayerSpec):
        raise TypeError(f"{path} is not a LayerSpec")
    return spec


@dataclass(frozen=True)
class _Derived:
    """What the readers of the table look up on hot paths, rebuilt when the table changes."""

    layers: tuple[LayerSpec, ...]
    event_owners: dict[str, Address]
    event_classes: dict[str, type[JournalEvent]]
    tier_owners: dict[str, Address]
    recall_tiers: tuple[str, ...]
    vector_tiers: tuple[str, ...]
    tier_families: dict[str, tuple[str, ...]]
    outbox_handlers: dict[str, Address]
    listings: dict[str, Address]
    files: tuple[str, ...]


def _derive(table: list[LayerSpec]) -> _Derived:
    return _Derived(
        layers=tuple(table),
        event_owners={event.type: spec.address for spec in table for event in spec.events},
        event_classes={event.type: event for spec in table for event in spec.events},
        tier_owners={tier: spec.address for spec in table for tier in spec.tiers},
        recall_tiers=tuple(tier for spec in table for tier in spec.tiers),
        vector_tiers=tuple(tier for spec in table for tier in spec.vector_tiers),
        tier_families={tier: spec.tiers for spec in table for tier in spec.tiers},
        outbox_handlers={op: spec.address for spec in table for op in spec.outbox_ops},
        listings={spec.listing: spec.address for spec in table if spec.listing is not None},
        files=tuple(name for spec in table for name in spec.files),
    )


_lock = threading.Lock()
_table: list[LayerSpec] = []
_derived: _Derived | None = None


def _current() -> _Derived:
    derived = _derived
    if derived is not None:
        return derived
    return _load()


def _load() -> _Derived:
    global _derived
    with _lock:
        if _derived is None:
            # Checked one by one, as register_layer checks a new one.
            for path in BUILTIN:
                spec = load_declaration(path)
                _check(spec)
                _table.append(spec)
            _derived = _derive(_table)
        return _derived


def _check(spec: LayerSpec) -> None:
    for other in _table:
        if other.address == spec.address:
            raise ValueError(f"layer {spec.address} is already declared")
        for kind, mine, theirs in (
            ("event", spec.event_types, other.event_types),
            ("tier", spec.tiers, other.tiers),
            ("outbox operation", spec.outbox_ops, other.outbox_ops),
            ("file", spec.files, other.files),
            ("count", spec.counts, other.counts),
            ("import count", spec.import_counts, other.import_counts),
        ):
            taken = set(mine) & set(theirs)
            if taken:
                raise ValueError(f"{kind} {sorted(taken)[0]} already belongs to {other.address}")
        flags = (spec.forget and spec.forget.flag, other.forget and other.forget.flag)
        for kind, value, theirs_value in (("listing", spec.listing, other.listing), ("flag", *flags)):
            if value is not None and value == theirs_value:
                raise ValueError(f"{kind} {value} already belongs to {other.address}")


def layers() -> tuple[LayerSpec, ...]:
    """Every declared layer, in start order."""
    return _current().layers


def register_layer(spec: LayerSpec) -> Callable[[], None]:
    """Declare ``spec`` (started just before the outbox). Returns the function that takes it
    back. Raises ValueError when its address, an event, a tier, a file, a count, its
    listing or its flag is taken."""
    global _derived
    _current()
    with _lock:
        _check(spec)
        _table.insert(len(_table) - 1, spec)
        _derived = _derive(_table)

    def unregister() -> None:
        global _derived
        with _lock:
            if spec in _table:
                _table.remove(spec)
                _derived = _derive(_table)

    return unregister


def spec_of(address: str) -> LayerSpec | None:
    """The declaration of ``address``, if one is declared."""
    return next((spec for spec in layers() if spec.address == address), None)


def layer_settings() -> dict[str, type[msgspec.Struct]]:
    """Layer -> the type of its own settings section, for those that declare one (what
    ``config.load_settings(layers=...)`` reads besides the built-in sections)."""
    return {spec.address: spec.settings for spec in layers() if spec.settings is not None}


def event_owners() -> dict[str, Address]:
    """Journal event type -> the address of the layer that applies it (do not mutate)."""
    return _current().event_owners


def decode_event(type: str, payload: Mapping[str, object]) -> JournalEvent:
    """The typed payload of one journaled event (lenient, as the views are read: a missing
    field takes its default). Raises KeyError for an undeclared type and
    msgspec.ValidationError for a payload that is not its shape."""
    return msgspec.convert(payload, _current().event_classes[type], strict=False)


def tier_owners() -> dict[str, Address]:
    """Recall tier -> the address of the layer that owns its entries (do not mutate)."""
    return _current().tier_owners


def recall_tiers() -> tuple[str, ...]:
    """Every recall tier, in declaration order."""
    return _current().recall_tiers


def vector_tiers() -> tuple[str, ...]:
    """The recall tiers that get vectors, in declaration order."""
    return _current().vector_tiers


def tier_family(tier: str) -> tuple[str, ...]:
    """The tiers of the layer that owns ``tier`` (an owner replaces all of them at once:
    the active facts and their archive); ``(tier,)`` for a tier nobody declares."""
    return _current().tier_families.get(tier, (tier,))


def outbox_handlers() -> dict[str, Address]:
    """Outbox operation type -> the address of the layer that runs it (do not mutate)."""
    return _current().outbox_handlers


def listings() -> dict[str, Address]:
    """Listing key of /api/characters/{name}/{layer} -> the layer's address (do not mutate)."""
    return _current().listings


def disk_counts(paths: CharacterFolder) -> dict[str, Count]:
    """A character's counts per layer from its views on disk (for one that is not active),
    each layer's as its declaration counts them, in start order."""
    counts: dict[str, Count] = {}
    for spec in layers():
        if spec.disk_counts is not None:
            counts.update(spec.disk_counts(paths))
    return counts


def character_files() -> tuple[str, ...]:
    """The entries of a character folder the layers own, in start order
    (``stores.layout.known_entries`` adds the shared ones)."""
    return _current().files


def next_scrubber(kind: Erasure, origin: str, current: str) -> Address:
    """Where :class:`~nekomem.actors.messages.ScrubTexts` goes after ``current``: the next
    layer, in start order, that scrubs the texts of a ``kind`` erasure, skipping the layer
    the erasure began in (``origin``). The outbox scrubs every kind and comes last: it
    answers. Raises LookupError when nothing comes after ``current``."""
    chain = [spec.address for spec in layers() if kind in spec.scrubs and spec.address != origin]
    after = chain.index(Address(current)) + 1 if current in chain else 0
    if current != origin and current not in chain:
        raise LookupError(f"{current} does not scrub {kind} erasures")
    if after >= len(chain):
        raise LookupError(f"nothing scrubs {kind} erasures after {current}")
    return chain[after]
