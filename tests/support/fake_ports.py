"""Ports for a layer under test, without a runtime: a real object that records what the
layer does outside itself.

:class:`FakePorts` implements :class:`nekomem.actors.ports.LayerPorts` over a real
character folder, a real shared journal, real settings and a :class:`ManualClock`. What the
layer sends to a sibling is kept in ``sent`` (child, message); what it posts to itself (now,
on a timer or at a deadline) in ``told``, ``scheduled`` and ``deadlines``; a model job waits
in ``jobs`` until the test calls :meth:`FakePorts.run_jobs`, which runs each on the calling
thread and returns the messages that bring their outcomes home (the test hands them to
the layer's handlers, as the actor would). An ``llm`` given (a real ``LLMClient``, e.g.
against ``tests.support.fake_llm.FakeLLM``) makes ``ask_model`` run real tasks.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from nekomem.actors.messages import IndexUpsert
from nekomem.actors.ports import LayerPorts, ResultFactory, Wrap, announce_stored_turns, model_task
from nekomem.config import Settings
from nekomem.domain.index_entry import IndexEntry
from nekomem.domain.layers import RECALL, Address, event_owners
from nekomem.domain.turns import Turn
from nekomem.recall.pending import PendingCounter
from nekomem.runtime.clock import Clock, ManualClock, iso
from nekomem.runtime.protocol import Message
from nekomem.runtime.services import OutboxTally
from nekomem.runtime.timers import TimerHandle
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


@dataclass
class Job:
    """A model job the layer submitted: what runs, how its outcome comes home, its lane."""

    run: Callable[[], object]
    done: Wrap
    lane: str


class FakePorts:
    """The ports of one layer of character ``character`` under ``root`` (see the module)."""

    def __init__(
        self,
        settings: Settings,
        root: Path,
        child: str,
        *,
        character: str = "Lan",
        clock: ManualClock | None = None,
        journal: SharedJournal | None = None,
        llm: LLMClient | None = None,
        embeddings: EmbeddingService | None = None,
        reranker: Reranker | None = None,
        llm_reranker: LlmReranker | None = None,
        cards: CharacterCards | None = None,
        powerful: bool | None = None,
        pool_full: bool = False,
    ) -> None:
        self._settings = settings
        self._character = character
        self._child = child
        self._log = logging.getLogger(f"nekomem.actors.{child}")
        self._paths = CharacterPaths(root, character)
        self._paths.ensure()
        self._clock: Clock = clock or ManualClock()
        self._journal = journal or SharedJournal(self._paths.events, self._paths.events_applied, event_owners())
        self._storage = StorageHealth(root)
        self._llm = llm
        self._embeddings = embeddings
        self._reranker = reranker
        self._llm_reranker = llm_reranker
        self._cards = cards
        self._pending = PendingCounter()
        self._backlog = BacklogTally()
        self._outbox_tally = OutboxTally()
        self._powerful = settings.longterm.powerful_memory_default if powerful is None else powerful
        self.pool_full = pool_full  # True: every model job is refused, as by a full pool
        self.sent: list[tuple[str, object]] = []
        self.told: list[object] = []
        self.scheduled: list[tuple[float, object, bool]] = []
        self.deadlines: list[tuple[float, object]] = []
        self.jobs: list[Job] = []
        self.loads = 0
        self._model_seq = 0

    # -- the character's parts ---------------------------------------------------------
    @property
    def character(self) -> str:
        return self._character

    @property
    def child(self) -> str:
        return self._child

    @property
    def log(self) -> logging.Logger:
        return self._log

    @property
    def paths(self) -> CharacterPaths:
        return self._paths

    @property
    def settings(self) -> Settings:
        return self._settings

    @property
    def clock(self) -> Clock:
        return self._clock

    @property
    def journal(self) -> SharedJournal:
        return self._journal

    @property
    def storage(self) -> StorageHealth | None:
        return self._storage

    @property
    def embeddings(self) -> EmbeddingService | None:
        return self._embeddings

    @property
    def llm(self) -> LLMClient | None:
        return self._llm

    @property
    def reranker(self) -> Reranker | None:
        return self._reranker

    @property
    def llm_reranker(self) -> LlmReranker | None:
        return self._llm_reranker

    @property
    def cards(self) -> CharacterCards | None:
        return self._cards

    @property
    def pending(self) -> PendingCounter:
        return self._pending

    @property
    def backlog(self) -> BacklogTally:
        return self._backlog

    @property
    def outbox_tally(self) -> OutboxTally:
        return self._outbox_tally

    # -- messages --------------------------------------------------------------------
    def send(self, child: Address, message: object) -> None:
        self.sent.append((child, message))

    def tell_self(self, message: object) -> None:
        self.told.append(message)

    def schedule(self, delay: float, message: object, *, real: bool = False) -> TimerHandle:
        self.scheduled.append((delay, message, real))
        return TimerHandle(delay, real, lambda: None)

    def cancel(self, handle: TimerHandle) -> None:
        handle.cancel()

    def deadline(self, delay: float, message: object) -> None:
        self.deadlines.append((delay, message))

    def first_load(self) -> bool:
        self.loads += 1
        return self.loads == 1

    # -- recall feed -----------------------------------------------------------------
    def index_upsert(self, entries: list[IndexEntry], replace_tier: str | None = None, views: list[list[int] | None] | None = None) -> None:
        self.send(RECALL, IndexUpsert(entries=entries, replace_tier=replace_tier, counted=0, views=views))

    def announce_stored_turns(self, turns: list[Turn]) -> None:
        announce_stored_turns(self, turns)

    # -- model jobs ------------------------------------------------------------------
    def model_available(self, task: str) -> bool:
        llm = self._llm
        return llm is not None and llm.available(llm.tier_for(task))

    def run_job(self, job: Callable[[], object], done: Wrap, *, lane: str = "") -> bool:
        if self.pool_full:
            return False
        self.jobs.append(Job(job, done, lane))
        return True

    def ask_model(
        self, task: str, messages: Sequence[Mapping[str, object]], done: ResultFactory, *, timeout: float | None = None
    ) -> int | None:
        llm = self._llm
        if llm is None or not llm.available(llm.tier_for(task)):
            return None
        self._model_seq += 1
        job, wrap = model_task(llm, self._model_seq, task, messages, done, timeout)
        return self._model_seq if self.run_job(job, wrap) else None

    def result_sender(self, done: Wrap) -> Callable[[object, BaseException | None], None]:
        def home(result: object, error: BaseException | None) -> None:
            self.told.append(done(result, error))

        return home

    def run_jobs(self) -> list[Message]:
        """Run every waiting model job here, in order; the messages that bring their
        outcomes home (an exception is the job's error, as on the pool)."""
        jobs, self.jobs = self.jobs, []
        results: list[Message] = []
        for job in jobs:
            try:
                result, error = job.run(), None
            except Exception as exc:  # noqa: BLE001 - a failed job's error goes home, as on the pool
                result, error = None, exc
            results.append(job.done(result, error))
        return results

    # -- the character ---------------------------------------------------------------
    def now(self) -> datetime:
        return self._clock.now()

    def now_iso(self) -> str:
        return iso(self._clock.now())

    def powerful(self) -> bool:
        return self._powerful

    def review_enabled(self) -> bool:
        return self._settings.recent.review_enabled

    def names(self) -> dict[str, str]:
        return {"master_name": self._settings.recent.master_name, "ai_name": self._character}

    def stop_names(self) -> list[str]:
        return [self._settings.recent.master_name, self._character]

    # -- reading what happened -------------------------------------------------------
    def sent_to(self, child: str) -> list[object]:
        """The messages sent so far to sibling ``child``, in order."""
        return [message for to, message in self.sent if to == child]


def _check(ports: FakePorts) -> LayerPorts:
    return ports  # mypy: FakePorts is a LayerPorts
