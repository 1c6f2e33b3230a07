"""What the runtime gives every character: process-wide services and a per-character context.

``Services`` is built once per process by :class:`~nekomem.runtime.runtime.Runtime`;
``CharacterContext`` once per activation by the character's supervisor. Both are plain
data with the real types of what they hold.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import pykka

from nekomem.config import Settings
from nekomem.domain.layers import Address
from nekomem.recall.pending import PendingCounter
from nekomem.runtime.clock import Clock
from nekomem.runtime.deadlines import Deadlines
from nekomem.runtime.dispatch import ActorRef, DispatchedActor, Dispatcher
from nekomem.runtime.pool import ModelPool
from nekomem.runtime.protocol import Deliver, fail_message
from nekomem.runtime.reply import ActorFailure
from nekomem.runtime.switches import Switches
from nekomem.runtime.timers import Timers
from nekomem.stores.applied import SharedJournal
from nekomem.stores.fact_backlog import BacklogTally
from nekomem.stores.faults import StorageHealth
from nekomem.stores.layout import CharacterPaths
from nekomem.stores.neko_cards import CharacterCards

if TYPE_CHECKING:
    from nekomem.models.embeddings import EmbeddingService
    from nekomem.models.llm import LLMClient
    from nekomem.models.llm_rerank import LlmReranker
    from nekomem.models.rerank import Reranker


class Counters:
    """Process-wide counters for /health (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[str, int] = {}

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            self._values[name] = self._values.get(name, 0) + n

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._values)


class OutboxTally:
    """Outbox records pending in the active characters and records dead-lettered since
    the process started (thread-safe; read at a /metrics scrape)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pending: dict[str, int] = {}
        self._dead = 0

    def set_pending(self, character: str, count: int) -> None:
        """Character ``character`` holds ``count`` pending records (0 when it stops)."""
        with self._lock:
            if count > 0:
                self._pending[character] = count
            else:
                self._pending.pop(character, None)

    def dead_lettered(self) -> None:
        with self._lock:
            self._dead += 1

    def snapshot(self) -> tuple[int, int]:
        """(pending records over the active characters, dead letters since start)."""
        with self._lock:
            return sum(self._pending.values()), self._dead


@dataclass
class Services:
    """Process-wide services shared by every character."""

    settings: Settings
    clock: Clock
    pool: ModelPool
    memory_root: Path
    dispatcher: Dispatcher
    timers: Timers
    llm: LLMClient | None = None
    embeddings: EmbeddingService | None = None
    reranker: Reranker | None = None  # the user's own /rerank endpoint (recall_rerank_base_url)
    llm_reranker: LlmReranker | None = None  # the chat model re-ranking explicit recalls (recall_llm_rerank)
    switches: Switches | None = None
    cards: CharacterCards | None = None  # the chat server's characters.json (card sync)
    # Entries waiting for a vector (owners count what they send, recall what it indexes)
    # and the fact backlog of the loaded characters (their recent actors publish it).
    pending: PendingCounter = field(default_factory=PendingCounter)
    backlog: BacklogTally = field(default_factory=BacklogTally)
    counters: Counters = field(default_factory=Counters)
    storage: StorageHealth | None = None
    outbox: OutboxTally = field(default_factory=OutboxTally)
    # Real-time deadlines of every character's waits on a model (a query's embedding, the
    # re-ranker, the owners' first index): one thread, started on first use.
    deadlines: Deadlines = field(default_factory=lambda: Deadlines("nekomem-recall-deadlines"))
    # The active-set bound after the open-file limit (runtime.fdlimit); 0: the setting's.
    max_active: int = 0
    # Cluster mode: the root under which a character's folder lives (its shard's folder).
    # None: every character directly under memory_root (single node).
    character_root: Callable[[str], Path] | None = None

    def __post_init__(self) -> None:
        if self.storage is None:
            self.storage = StorageHealth(self.memory_root)

    def root_for(self, name: str) -> Path:
        """The folder that holds character ``name``'s folder."""
        return self.memory_root if self.character_root is None else self.character_root(name)


class LoadCount:
    """How many times each child layer of one activation has loaded (the context outlives
    a crash or a renewal of a child: a second load is a restart)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._loads: dict[str, int] = {}

    def count(self, child: str) -> int:
        """Count one more load of ``child``; returns how many there have been, this one included."""
        with self._lock:
            loads = self._loads.get(child, 0) + 1
            self._loads[child] = loads
            return loads


class Teller(Protocol):
    """Anything a message can be posted to without waiting (an ActorRef)."""

    def tell(self, message: object) -> None: ...


class Routes:
    """A character's live child refs, kept by its supervisor and read by senders.

    Senders tell a live child directly (one hop); a child that is dead, restarting or not
    started yet is reached through the supervisor, which restarts it or fails the message.
    Entries are replaced whole, so readers need no lock.
    """

    def __init__(self) -> None:
        self.children: dict[Address, ActorRef[DispatchedActor]] = {}

    def live(self, child: Address) -> ActorRef[DispatchedActor] | None:
        ref = self.children.get(child)
        return ref if ref is not None and ref.is_alive() else None


@dataclass
class CharacterContext:
    """What a child actor knows about its character and the world."""

    name: str
    paths: CharacterPaths
    services: Services
    journal: SharedJournal
    supervisor: Teller  # the supervisor: a child's crash report and messages for a dead child go there
    routes: Routes = field(default_factory=Routes)
    loads: LoadCount = field(default_factory=LoadCount)

    @property
    def settings(self) -> Settings:
        return self.services.settings

    @property
    def clock(self) -> Clock:
        return self.services.clock

    def send(self, child: Address, message: object) -> None:
        """Deliver ``message`` to sibling ``child`` (never blocks): directly when it is
        alive, else through the supervisor. A stopped character fails the message 503."""
        ref = self.routes.live(child)
        if ref is not None:
            try:
                ref.tell(message)
                return
            except pykka.ActorDeadError:
                pass
        try:
            self.supervisor.tell(Deliver(child=child, message=message))
        except pykka.ActorDeadError:
            fail_message(message, ActorFailure("character_stopped", "the character was stopped", 503))
