"""The process runtime: services, dispatcher, timers, character registry and start-up recovery."""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from nekomem.config import Settings
from nekomem.config.server import url_of
from nekomem.domain.layers import disk_counts
from nekomem.domain.speaker_identity import POOL_FILENAME
from nekomem.domain.tokens import get_counter
from nekomem.importer import neko_folder
from nekomem.models.llm_rerank import LlmReranker
from nekomem.models.rerank import Reranker
from nekomem.runtime import fdlimit
from nekomem.runtime.clock import Clock, SystemClock, iso
from nekomem.runtime.collector import FullCollections
from nekomem.runtime.dispatch import Dispatcher
from nekomem.runtime.importing import ImportService
from nekomem.runtime.knowledge import KnowledgeService
from nekomem.runtime.pool import ModelPool
from nekomem.runtime.registry import ActorLayer, CharacterRegistry
from nekomem.runtime.release_claims import ReleaseClaims
from nekomem.runtime.services import Services
from nekomem.runtime.switches import Switches, core_config_file
from nekomem.runtime.timers import Timers
from nekomem.stores import rootlock
from nekomem.stores.character_summary import journal_totals, recovery_stamp, settled_stamp, summary_of
from nekomem.stores.knowledge import KnowledgeFiles
from nekomem.stores.layout import CharacterPaths, list_characters
from nekomem.stores.namefold import CharacterSpellings, probe_case_insensitive
from nekomem.stores.neko_cards import CharacterCards
from nekomem.stores.rootlock import LockMode, RootLock
from nekomem.stores.shard_layout import character_root, shards_root
from nekomem.stores.speaker_trust import SpeakerTrustPool

if TYPE_CHECKING:
    from nekomem.models.embeddings import EmbeddingService
    from nekomem.models.llm import LLMClient

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
            from nekomem.models.llm import LLMClient

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
            llm_reranker=(
                LlmReranker(llm, settings.recall, settings.longterm, get_counter(settings.recent.recent_tokenizer_encoding))
                if llm is not None and settings.recall.recall_llm_rerank and not settings.recall.recall_rerank_base_url.strip()
                else None
            ),
            switches=self.switches,
            cards=CharacterCards(Path(settings.server.character_cards_path).expanduser()) if settings.server.character_cards_path else None,
        )
        if settings.cluster.cluster_etcd_url:  # cluster mode: <root>/shards/<NNNN>/<name>
            self.services.character_root = functools.partial(character_root, root, shards=settings.cluster.cluster_shards)
        self.actors = actors
        self.collector = FullCollections(self.timers, rt.gc_full_collection_seconds) if rt.gc_full_collection_seconds > 0 else None
        self.registry = CharacterRegistry(self.services, actors, on_stopped=self.collector.characters_stopped if self.collector else None)
        self.importing = ImportService(settings, self.registry, root)
        # The process-wide identity and trust pool (the reference's speaker_trust.json).
        self.speaker_trust = SpeakerTrustPool(root / POOL_FILENAME, lambda: iso(self.clock.now()))
        # The process-wide public knowledge packs (the reference's /internal/knowledge/*).
        self.knowledge = KnowledgeService(KnowledgeFiles(root), lambda: iso(self.clock.now()), recall=settings.recall, embedder=embeddings)
        self.release_claims = ReleaseClaims()  # /release_character holds (see the module)
        self.registry.released = self.release_claims.held
        if self.services.character_root is None:
            # The character list's summary compares again the rows this process may have
            # written (a cluster node, sharing the root, compares every row instead).
            self.registry.on_released = summary_of(root).touch
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
        # Who this runtime is in the root's lock file: "serve" unless the command says
        # otherwise (`nekomem neko`); a cluster node's role names the node.
        self.lock_role = "serve"

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

    @property
    def root_lock_mode(self) -> LockMode:
        """Exclusive: one single-node server per root. Cluster nodes share the root, each
        writing only the shards it owns (the fence)."""
        return "shared" if self.settings.cluster.cluster_etcd_url else "exclusive"

    def lock_root(self) -> RootLock:
        """Take the memory root's lock for this server now (before the port is bound and
        the banner printed), unless already held. Raises RootLocked naming the holder."""
        if self._root_lock is None:
            server = self.settings.server
            role = self.lock_role
            if self.settings.cluster.cluster_etcd_url:
                role = f"{rootlock.CLUSTER_ROLE} {self.settings.cluster.cluster_node_id or '?'}".strip()
            url = url_of(server.host, server.port) if server.port else ""
            self._root_lock = rootlock.acquire(self.memory_root, self.root_lock_mode, role, port=server.port or None, url=url)
        return self._root_lock

    def release_root(self) -> None:
        """Drop the memory root's lock (idempotent); :meth:`stop` does it too."""
        if self._root_lock is not None:
            self._root_lock.release()
            self._root_lock = None

    def start(self, *, background: bool = True) -> None:
        """Start serving; raises RootLocked while another server or an offline tool holds
        the memory root (the lock is taken first, so nothing has started then)."""
        self.lock_root()
        self.memory_root.mkdir(parents=True, exist_ok=True, mode=0o700)
        choice = self.settings.server.case_insensitive_root
        insensitive = probe_case_insensitive(self.memory_root) if choice == "auto" else choice == "yes"
        self.names = CharacterSpellings(self.memory_root, insensitive)
        if insensitive:
            log.info("the memory root folds case: every spelling of a character name is one character")
        self.timers.start()
        if self.collector is not None:
            self.collector.start()
        # No row of the character list's summary is trusted until the check that follows
        # the start-up recovery (files may have changed while no server ran).
        summary_of(self.memory_root).recheck()
        if neko_folder.serves_neko_folder(self.settings):
            # N.E.K.O.'s own memory folder: characters not adopted yet (or changed by the
            # reference's server since) are imported first, under the server's own
            # exclusive hold of the root (taken above, before anything started).
            adoption = neko_folder.adopt(self.memory_root, self.settings)
            log.info(
                "serving N.E.K.O.'s memory folder in place: %d characters adopted, %d imported again, %d problems",
                len(adoption.adopted),
                len(adoption.refreshed),
                len(adoption.problems),
            )
        if self.embeddings is not None and hasattr(self.embeddings, "start"):
            self.embeddings.start()
        self.knowledge.start()
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
        # A single node's look at a character is skipped when the files it reads kept their
        # identity since a start found nothing to finish (the summary's recovery marks): a
        # start opens the journals of the characters written since, not of all of them.
        summary = summary_of(self.memory_root) if self.services.character_root is None else None
        kept = summary.recovery_marks() if summary is not None else {}
        marks: dict[str, list[int]] = {}
        looked_ns = time.time_ns()
        for name in names:
            # One character that cannot recover must not keep every other one in
            # limited mode: it is reported and retried at its next activation.
            try:
                paths = CharacterPaths(self.memory_root, name)
                stamp = [*recovery_stamp(paths), int(mine_backlog)] if summary is not None else []
                if stamp and kept.get(name) == stamp:
                    marks[name] = stamp
                    continue
                with contextlib.ExitStack() as held:
                    if not self.actors.has_unfinished(paths, mine_backlog=mine_backlog, hold=held):
                        if stamp and settled_stamp(stamp[:-1], looked_ns):
                            marks[name] = stamp
                        continue
                    # Activation reconciles the journal and replays the outbox; the barrier
                    # returns once every child has loaded (the look's journal connection is
                    # held until then: the activation finds the WAL indexed).
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
        if summary is not None:
            summary.set_recovery_marks(marks)
        self._check_summary()
        self.limited_reason = None

    def _check_summary(self) -> None:
        """Compare every row of the character list's summary with its files now, before
        serving (a few ``stat`` calls per character, like the recovery's look above), so
        the first page sorted by last conversation reads nothing per character. A cluster
        node compares at every listing instead. Failures are logged (a listing checks
        again)."""
        if self.services.character_root is not None:
            return
        summary = summary_of(self.memory_root)
        started = time.perf_counter()
        try:
            names = summary.names(self.settings.server.name_max_length)
            summary.check(names, self.character_paths, journal_totals, disk_counts)
        except Exception:  # a listing checks again; the server serves
            log.warning("the character list's summary could not be checked at start-up", exc_info=True)
            return
        log.info("character list summary checked: %d characters in %.2f s", len(names), time.perf_counter() - started)

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
        self.knowledge.stop()
        self.registry.stop_all()
        if self.collector is not None:
            self.collector.stop()
        self.timers.stop()
        self.services.deadlines.stop()
        self.release_root()
        self.pool.shutdown(wait=False)
        self.dispatcher.shutdown()
        if self.llm is not None and hasattr(self.llm, "close"):
            self.llm.close()
        if self.services.reranker is not None:
            self.services.reranker.close()
