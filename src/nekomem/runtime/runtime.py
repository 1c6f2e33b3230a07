"""The process runtime: services, dispatcher, timers, character registry and start-up recovery."""

from __future__ import annotations

import functools
import logging
import os
import threading
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from nekomem.config import Settings
from nekomem.domain.tokens import get_counter
from nekomem.recall.rerank import Reranker
from nekomem.runtime import fdlimit
from nekomem.runtime.clock import Clock, SystemClock
from nekomem.runtime.collector import FullCollections
from nekomem.runtime.dispatch import Dispatcher
from nekomem.runtime.importing import ImportService
from nekomem.runtime.pool import ModelPool
from nekomem.runtime.registry import ActorLayer, CharacterRegistry
from nekomem.runtime.services import Services
from nekomem.runtime.switches import Switches, core_config_file
from nekomem.runtime.timers import Timers
from nekomem.stores import rootlock
from nekomem.stores.layout import CharacterPaths, list_characters
from nekomem.stores.namefold import CharacterSpellings, probe_case_insensitive
from nekomem.stores.neko_cards import CharacterCards
from nekomem.stores.rootlock import RootLock
from nekomem.stores.shard_layout import character_root, shards_root

if TYPE_CHECKING:
    from nekomem.providers.llm import LLMClient
    from nekomem.recall.embeddings import EmbeddingService

log = logging.getLogger("nekomem.runtime")


class Runtime:
    """Everything one nekomem process hosts.

    ``start()`` creates the memory root, starts the timer and runs start-up recovery in
    the background; until recovery ends ``limited_reason`` is set and the HTTP front end
    answers 409 on every route but /health. Threads: ``actor_workers`` run every actor of
    every character, ``model_workers`` run model calls, one runs timers, one (briefly)
    recovery; none is per character.
    """

    def __init__(
        self,
        settings: Settings,
        clock: Clock | None = None,
        *,
        actors: ActorLayer,
        llm: LLMClient | None = None,
        embeddings: EmbeddingService | None = None,
    ) -> None:
        self.settings = settings
        self.clock = clock or SystemClock()
        root = Path(settings.server.memory_root).expanduser().resolve()
        rt = settings.runtime
        self.pool = ModelPool(rt.model_workers, rt.model_queue_max, rt.model_jobs_per_character)
        self.dispatcher = Dispatcher(rt.actor_workers, rt.actor_batch)
        self.timers = Timers(self.clock)
        if llm is None:
            from nekomem.providers.llm import LLMClient

            llm = LLMClient(settings.llm)
        self.llm = llm
        self.embeddings = embeddings
        self.switches = Switches(
            root,
            powerful_default=settings.longterm.powerful_memory_default,
            review_default=settings.recent.review_enabled,
            path=core_config_file(settings.server.core_config_path, root),
        )
        self.instance_id = settings.server.instance_id or os.environ.get("NEKO_INSTANCE_ID", "") or uuid.uuid4().hex
        self.files = fdlimit.plan(settings)
        self.services = Services(
            settings=settings,
            max_active=self.files.max_active,
            clock=self.clock,
            pool=self.pool,
            memory_root=root,
            dispatcher=self.dispatcher,
            timers=self.timers,
            llm=llm,
            embeddings=embeddings,
            reranker=Reranker(settings.recall) if settings.recall.recall_rerank_base_url.strip() else None,
            switches=self.switches,
            cards=CharacterCards(Path(settings.server.character_cards_path).expanduser()) if settings.server.character_cards_path else None,
        )
        if settings.cluster.cluster_etcd_url:  # cluster mode: <root>/shards/<NNNN>/<name>
            self.services.character_root = functools.partial(character_root, root, shards=settings.cluster.cluster_shards)
        self.actors = actors
        self.collector = FullCollections(self.timers, rt.gc_full_collection_seconds) if rt.gc_full_collection_seconds > 0 else None
        self.registry = CharacterRegistry(self.services, actors, on_stopped=self.collector.characters_stopped if self.collector else None)
        self.importing = ImportService(settings, self.registry, root)
        self.limited_reason: str | None = "runtime_initializing"
        # Set by POST /internal/storage/startup/block (the chat server could not finish
        # its own start-up): limited mode again, until /continue. None: not blocked.
        self.startup_block: str | None = None
        self.startup_generation = 0  # counts /block calls: a /continue that waited past one loses
        # Replaced at start, once the memory root exists and is probed.
        self.names = CharacterSpellings(root, False)
        self.recovery_error: str | None = None
        self._recovery: threading.Thread | None = None
        self._root_lock: RootLock | None = None

    @property
    def memory_root(self) -> Path:
        return self.services.memory_root

    def character_paths(self, name: str) -> CharacterPaths:
        """The paths of character ``name`` (in cluster mode, inside its shard's folder);
        raises InvalidName."""
        server = self.settings.server
        return CharacterPaths(self.services.root_for(name), name, max_length=server.name_max_length, max_units=server.name_max_units)

    def known_characters(self) -> list[str]:
        """Every character with a folder (in cluster mode: in every shard folder this
        node can see), sorted. Raises OSError."""
        if self.services.character_root is None:
            return list_characters(self.memory_root)
        names: set[str] = set()
        for folder in sorted(shards_root(self.memory_root).glob("[0-9]*")):
            names.update(list_characters(folder))
        return sorted(names)

    def start(self, *, background: bool = True) -> None:
        """Start serving; raises RootLocked while an offline import holds the memory root."""
        self.memory_root.mkdir(parents=True, exist_ok=True)
        choice = self.settings.server.case_insensitive_root
        insensitive = probe_case_insensitive(self.memory_root) if choice == "auto" else choice == "yes"
        self.names = CharacterSpellings(self.memory_root, insensitive)
        if insensitive:
            log.info("the memory root folds case: every spelling of a character name is one character")
        self.timers.start()
        if self.collector is not None:
            self.collector.start()
        # Shared: several servers may share a root as before; an offline import (which
        # takes it exclusive) is refused while any of them runs, and blocks their start.
        self._root_lock = rootlock.acquire(self.memory_root, "shared", "serve")
        if self.embeddings is not None and hasattr(self.embeddings, "start"):
            self.embeddings.start()
        if background:
            self._recovery = threading.Thread(target=self._recover, name="nekomem-recovery", daemon=True)
            self._recovery.start()
        else:
            self._recover()

    def _recover(self) -> None:
        """Activate every character with unfinished work, so that its actors reconcile the
        journal and replay the outbox before normal service starts."""
        # The token counter's vocabulary takes seconds to load: load it here, before
        # service starts, not inside the first activation while a request waits.
        get_counter(self.settings.recent.recent_tokenizer_encoding)
        try:
            names = list_characters(self.memory_root)
        except OSError as exc:
            log.exception("the memory root cannot be listed")
            self.recovery_error = repr(exc)
            self.limited_reason = "storage_recovery_failed"
            return
        recovered = failed = 0
        # Turns stored before a model could extract facts are mined once one can.
        llm = self.llm
        mine_backlog = self.settings.longterm.fact_backlog_enabled and llm is not None and llm.available(llm.tier_for("extract_facts"))
        for name in names:
            # One character that cannot recover must not keep every other one in
            # limited mode: it is reported and retried at its next activation.
            try:
                if not self.actors.has_unfinished(CharacterPaths(self.memory_root, name), mine_backlog=mine_backlog):
                    continue
                # Activation reconciles the journal and replays the outbox; the barrier
                # returns once every child has loaded.
                self.registry.activate(name)
                self.registry.flush(name)
                described = self.registry.describe(name)
                if described is not None and described["failed"]:
                    raise RuntimeError(f"layers failed at recovery: {sorted(described['failed'])}")
                recovered += 1
            except Exception as exc:  # noqa: BLE001
                failed += 1
                self.recovery_error = repr(exc)
                log.warning("start-up recovery of a character failed: %s", type(exc).__name__)
        if recovered or failed:
            log.info("start-up recovery: %d characters activated, %d failed", recovered, failed)
        self.limited_reason = None

    def blocking_reason(self) -> str | None:
        """Why requests are refused with 409 now (start-up recovery, its failure, or a
        /block), or None when the server serves."""
        if self.limited_reason is not None:
            return self.limited_reason
        return None if self.startup_block is None else "storage_startup_blocked_after_init"

    def wait_ready(self, timeout: float = 30.0) -> bool:
        if self._recovery is not None:
            self._recovery.join(timeout)
        return self.limited_reason is None

    def stop(self) -> None:
        self.registry.stop_all()
        if self.collector is not None:
            self.collector.stop()
        self.timers.stop()
        if self._root_lock is not None:
            self._root_lock.release()
            self._root_lock = None
        self.pool.shutdown(wait=False)
        self.dispatcher.shutdown()
        if self.llm is not None and hasattr(self.llm, "close"):
            self.llm.close()
        if self.services.reranker is not None:
            self.services.reranker.close()
