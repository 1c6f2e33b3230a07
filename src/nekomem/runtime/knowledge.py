"""The public knowledge packs of one process (the reference's ``knowledge/service.py``
behaviour, over nekomem's stores and recall pieces).

One :class:`KnowledgeService` per process, held by the :class:`~nekomem.runtime.runtime.Runtime`
beside the characters, never inside one. Its files are
:class:`~nekomem.stores.knowledge.KnowledgeFiles`; its index a
:class:`~nekomem.recall.knowledge_index.KnowledgeIndex` rebuilt from the pack files at
every start.

Threads: ``start`` loads the packs on a thread of its own (the service is ``starting``
until then); one worker thread runs the import jobs one at a time and, when idle,
computes the missing entry vectors in small batches. Every method is blocking and
thread-safe (one lock over the registry, the jobs and the index); the HTTP layer calls
them off the event loop.

Imports are durable jobs: the pack is staged and the job recorded in ``jobs.json`` before
the answer; the worker indexes the staged pack under a versioned key (queries keep seeing
the previous version), then commits (pack file, registry, swap) and drops the stage. A
job that was queued or building when the process ended is queued again at the next start
when its staged pack is still there, and failed with ``interrupted`` otherwise.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, Protocol

import msgspec
import numpy as np
import numpy.typing as npt

from nekomem.config.recall import RecallSettings
from nekomem.domain import knowledge_pack as kp
from nekomem.domain.knowledge_render import Card, best_excerpt, render_block
from nekomem.recall.embeddings import VectorLeg
from nekomem.recall.knowledge_index import SEP, KnowledgeIndex, entry_id
from nekomem.recall.tokenize import Tokenizer
from nekomem.stores.knowledge import Job, KnowledgeFileError, KnowledgeFiles, PackRecord, Registry

log = logging.getLogger("nekomem.knowledge")

# The reference's service limits (knowledge/service.py), part of the protocol.
DEFAULT_QUERY_BUDGET_MS = 1_500
MIN_QUERY_BUDGET_MS = 50
MAX_QUERY_BUDGET_MS = 5_000
MAX_QUERY_CHARS = 2_000
MAX_QUERY_LIMIT = 10
QUERY_CONCURRENCY = 4
MAX_PENDING_IMPORTS = 3
MAX_TRACKED_JOBS = 50
MAX_PACKS = 200
STATUS_SOURCES = 12
ACTIVE = frozenset({"queued", "building"})
TERMINAL = frozenset({"active", "failed", "cancelled"})
# Vectors are computed in small batches so that memory's own embedding calls interleave.
EMBED_BATCH = 16
# Entries indexed per hold of the lock while a job builds (lookups interleave).
BUILD_BATCH = 64
# How long the idle worker waits for a job before it looks for missing vectors again.
IDLE_SECONDS = 1.0
# The job's progress reaches jobs.json at most this often while it builds.
PROGRESS_SAVE_SECONDS = 0.5
DIAGNOSTICS_KEPT = 20


class Embedder(Protocol):
    """What the service needs of :class:`nekomem.recall.embeddings.EmbeddingService`."""

    @property
    def state(self) -> str: ...

    @property
    def model_id(self) -> str | None: ...

    @property
    def legs(self) -> tuple[VectorLeg, ...]: ...

    def embed(self, texts: Sequence[str], kind: Any = "passage") -> npt.NDArray[np.float32]: ...


class KnowledgeUnavailable(Exception):
    """A request the service refuses; ``reason`` is the reference's code."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _job_json(job: Job) -> dict[str, Any]:
    return {
        "job_id": job.job_id,
        "pack_id": job.pack_id,
        "state": job.state,
        "reason": job.reason,
        "entries_total": job.entries_total,
        "entries_indexed": job.entries_indexed,
        "chunks_total": job.chunks_total,
        "created_at": job.created_at,
        "updated_at": job.updated_at,
    }


def _version(pack_id: str, sha: str) -> str:
    """The index key of one version of a pack."""
    return f"{pack_id}@{sha[:16]}"


class _Cancelled(Exception):
    pass


class KnowledgeService:
    """Packs, import jobs and lookups of the whole process (see the module docstring)."""

    def __init__(
        self,
        files: KnowledgeFiles,
        now: Callable[[], str],
        *,
        recall: RecallSettings | None = None,
        embedder: Embedder | None = None,
    ) -> None:
        self.files = files
        self.now = now
        self.embedder = embedder
        self.index = KnowledgeIndex(recall)
        self._terms = Tokenizer(self.index.settings)
        self._lock = threading.RLock()
        self._registry = Registry()
        self._jobs: collections.OrderedDict[str, Job] = collections.OrderedDict()
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._state = "starting"
        self._error_code = ""
        self._broken: set[str] = set()
        self._vector_failed: set[str] = set()
        self._query_slots = threading.BoundedSemaphore(QUERY_CONCURRENCY)
        self._embed_pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="knowledge-query-embed")
        self._stopping = threading.Event()
        self._worker: threading.Thread | None = None
        self._queries: collections.deque[dict[str, Any]] = collections.deque(maxlen=DIAGNOSTICS_KEPT)
        self._batches: collections.deque[dict[str, Any]] = collections.deque(maxlen=DIAGNOSTICS_KEPT)

    # -- lifecycle -----------------------------------------------------------------

    def start(self) -> None:
        """Load the packs and start the worker, on a thread of its own; never raises."""
        threading.Thread(target=self._open, name="knowledge-start", daemon=True).start()

    def stop(self) -> None:
        self._stopping.set()
        self._queue.put(None)
        if self._worker is not None:
            self._worker.join(5)
        self._embed_pool.shutdown(wait=False, cancel_futures=True)

    def wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while self._state == "starting" and time.monotonic() < deadline:
            time.sleep(0.02)
        return self._state == "ready"

    def _open(self) -> None:
        try:
            with self._lock:
                registry = self.files.load_registry()
                for record in registry.packs.values():
                    self._load_pack(record)
                self._registry = registry
                jobs = self.files.load_jobs()[-MAX_TRACKED_JOBS:]
                resumed = self._recover_jobs(jobs)
                self.files.clean_leftovers({r.file_name for r in registry.packs.values()}, {j.job_id for j in jobs if j.state in ACTIVE})
                self._state = "ready"
        except (KnowledgeFileError, OSError) as exc:
            self._state, self._error_code = "unavailable", "registry_invalid" if isinstance(exc, KnowledgeFileError) else type(exc).__name__
            log.warning("public knowledge unavailable: %s", self._error_code)
            return
        log.info("public knowledge ready: %d packs, %d entries, %d jobs resumed", len(registry.packs), len(self.index), resumed)
        self._worker = threading.Thread(target=self._work, name="knowledge-worker", daemon=True)
        self._worker.start()

    def _load_pack(self, record: PackRecord) -> None:
        try:
            raw = self.files.read_pack(record)
            if kp.sha256_hex(raw) != record.pack_sha256:
                raise kp.PackError("pack_file_mismatch")
            pack = kp.decode_pack(raw)
        except (OSError, kp.PackError) as exc:
            log.warning("a knowledge pack cannot be loaded: %s", getattr(exc, "reason", type(exc).__name__))
            self._broken.add(record.pack_id)
            return
        key = _version(record.pack_id, record.pack_sha256)
        for entry in pack.entries:
            self.index.add(key, entry)

    def _recover_jobs(self, jobs: list[Job]) -> int:
        resumed = 0
        for job in jobs:
            if job.state in ACTIVE:
                if job.cancel_requested:
                    job.state, job.reason = "cancelled", ""
                elif self.files.read_staged(job.job_id) is not None:
                    job.state, job.entries_indexed, job.reason = "queued", 0, ""
                    self._queue.put(job.job_id)
                    resumed += 1
                else:
                    job.state, job.reason = "failed", "interrupted"
                job.updated_at = self.now()
            self._jobs[job.job_id] = job
        self.files.save_jobs(list(self._jobs.values()))
        return resumed

    # -- availability --------------------------------------------------------------

    def _current(self, pack_id: str) -> str | None:
        record = self._registry.packs.get(pack_id)
        if record is None or pack_id in self._broken:
            return None
        return _version(pack_id, record.pack_sha256)

    def availability(self) -> dict[str, bool]:
        """``ready``, ``enabled`` and ``tool_available`` (ready, enabled, and at least one
        loaded pack with an entry that is not disabled)."""
        registry = self._registry
        ready = self._state == "ready"
        usable = any(
            record.entries > len(record.disabled_titles) and pack_id not in self._broken for pack_id, record in registry.packs.items()
        )
        return {"ready": ready, "enabled": registry.enabled, "tool_available": ready and registry.enabled and usable}

    def _require_ready(self) -> None:
        if self._state != "ready":
            raise KnowledgeUnavailable("knowledge_starting" if self._state == "starting" else "knowledge_unavailable")

    # -- imports -------------------------------------------------------------------

    def import_pack(self, raw: bytes) -> dict[str, Any]:
        """Validate and stage a pack, record its job and queue it. A refused pack answers
        ``{"ok": False, "reason"}``; an unchanged one ``{"unchanged": True, "state": "active"}``."""
        self._require_ready()
        try:
            pack = kp.decode_pack(raw)
        except kp.PackError as exc:
            return {"ok": False, "reason": exc.reason}
        canonical = kp.canonical_bytes(pack)
        if len(canonical) > kp.MAX_PACK_BYTES:
            return {"ok": False, "reason": "pack_too_large"}
        sha = kp.sha256_hex(canonical)
        with self._lock:
            existing = self._registry.packs.get(pack.pack_id)
            if existing is not None and existing.pack_sha256 == sha and pack.pack_id not in self._broken:
                return {"ok": True, "pack_id": pack.pack_id, "unchanged": True, "state": "active"}
            pending = [job for job in self._jobs.values() if job.state in ACTIVE]
            if any(job.pack_id == pack.pack_id for job in pending):
                return {"ok": False, "reason": "job_in_progress"}
            if len(pending) >= MAX_PENDING_IMPORTS:
                return {"ok": False, "reason": "knowledge_busy"}
            others = [r for r in self._registry.packs.values() if r.pack_id != pack.pack_id]
            if len(others) + 1 > MAX_PACKS:
                return {"ok": False, "reason": "capacity_packs"}
            if sum(r.entries for r in others) + len(pack.entries) > kp.MAX_TOTAL_ENTRIES:
                return {"ok": False, "reason": "capacity_entries"}
            now = self.now()
            job = Job(
                job_id=uuid.uuid4().hex,
                pack_id=pack.pack_id,
                state="queued",
                created_at=now,
                updated_at=now,
                entries_total=len(pack.entries),
                chunks_total=len(pack.entries),
            )
            self.files.stage(job.job_id, canonical)
            self._remember(job)
            self._save_jobs()
        self._queue.put(job.job_id)
        return {"ok": True, **_job_json(job)}

    def _remember(self, job: Job) -> None:
        self._jobs[job.job_id] = job
        while len(self._jobs) > MAX_TRACKED_JOBS:
            oldest = next((jid for jid, j in self._jobs.items() if j.state in TERMINAL), None)
            if oldest is None:
                break
            del self._jobs[oldest]

    def _save_jobs(self) -> None:
        self.files.save_jobs(list(self._jobs.values()))

    def list_jobs(self) -> list[dict[str, Any]]:
        with self._lock:
            return [_job_json(job) for job in reversed(self._jobs.values())]

    def job(self, job_id: str) -> dict[str, Any] | None:
        with self._lock:
            job = self._jobs.get(job_id)
            return None if job is None else _job_json(job)

    def cancel_job(self, job_id: str) -> bool:
        """Ask a queued or building job to stop; False when it is unknown or finished."""
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None or job.state not in ACTIVE:
                return False
            job.cancel_requested = True
            if job.state == "queued":
                self._finish(job, "cancelled")
                self.files.drop_staged(job_id)
            self._save_jobs()
            return True

    def discard_job(self, job_id: str) -> bool:
        """Forget a finished job; False when it is unknown or still running."""
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None or job.state not in TERMINAL:
                return False
            del self._jobs[job_id]
            self._save_jobs()
            return True

    def _finish(self, job: Job, state: str, reason: str = "") -> None:
        job.state, job.reason, job.updated_at = state, reason, self.now()

    def _work(self) -> None:
        vectors_left = False
        while not self._stopping.is_set():
            try:
                # Jobs first; between them, and while idle, the missing vectors one batch at a time.
                job_id = self._queue.get(timeout=0.0 if vectors_left else IDLE_SECONDS)
            except queue.Empty:
                vectors_left = self._embed_missing()
                continue
            if job_id is None:
                return
            self._run_job(job_id)

    def _run_job(self, job_id: str) -> None:
        with self._lock:
            job = self._jobs.get(job_id)
            if job is None or job.state != "queued":
                self.files.drop_staged(job_id)
                return
            job.state, job.updated_at = "building", self.now()
            self._save_jobs()
        key = ""
        try:
            raw = self.files.read_staged(job_id)
            if raw is None:
                raise kp.PackError("staged_pack_missing")
            pack = kp.decode_pack(raw)
            sha = kp.sha256_hex(raw)
            key = _version(pack.pack_id, sha)
            self._build(job, pack, key)
            self._commit(job, pack, raw, sha, key)
        except _Cancelled:
            self._discard_build(key)
            with self._lock:
                self._finish(job, "cancelled")
        except kp.PackError as exc:
            self._discard_build(key)
            with self._lock:
                self._finish(job, "failed", exc.reason)
        except Exception as exc:
            log.warning("a knowledge import failed: %s", type(exc).__name__, exc_info=True)
            self._discard_build(key)
            with self._lock:
                self._finish(job, "failed", type(exc).__name__)
        finally:
            with self._lock:
                self.files.drop_staged(job_id)
                self._save_jobs()

    def _check(self, job: Job) -> None:
        if job.cancel_requested or self._stopping.is_set():
            raise _Cancelled

    def _build(self, job: Job, pack: kp.Pack, key: str) -> None:
        """Index the entries under the version key (not served until the commit). Vectors
        come afterwards, in the background: an import never waits for the model."""
        saved = time.monotonic()
        for start in range(0, len(pack.entries), BUILD_BATCH):
            self._check(job)
            with self._lock:
                for entry in pack.entries[start : start + BUILD_BATCH]:
                    self.index.add(key, entry)
                job.entries_indexed = min(start + BUILD_BATCH, len(pack.entries))
                job.updated_at = self.now()
                if time.monotonic() - saved >= PROGRESS_SAVE_SECONDS:
                    self._save_jobs()
                    saved = time.monotonic()

    def _commit(self, job: Job, pack: kp.Pack, raw: bytes, sha: str, key: str) -> None:
        with self._lock:
            self._check(job)
            previous = self._registry.packs.get(pack.pack_id)
            now = self.now()
            keys = {entry.key for entry in pack.entries}
            record = PackRecord(
                pack_id=pack.pack_id,
                pack_sha256=sha,
                source=pack.source,
                declared_material_type=pack.material_type,
                entries=len(pack.entries),
                material_type_override=previous.material_type_override if previous else None,
                auto_context=previous.auto_context if previous else False,
                local_embedding=previous.local_embedding if previous else True,
                disabled_titles=sorted(set(previous.disabled_titles) & keys) if previous else [],
                installed_at=previous.installed_at if previous else now,
                updated_at=now,
            )
            self.files.write_pack(record, raw)
            registry = msgspec.structs.replace(self._registry, packs={**self._registry.packs, pack.pack_id: record})
            try:
                self.files.save_registry(registry)
            except BaseException:
                if previous is None or previous.file_name != record.file_name:
                    self.files.delete_pack(record)
                raise
            self._registry = registry
            self._broken.discard(pack.pack_id)
            if previous is not None:
                old = _version(previous.pack_id, previous.pack_sha256)
                if old != key:
                    self.index.remove_pack(old)
                if previous.file_name != record.file_name:
                    self.files.delete_pack(previous)
            self._finish(job, "active")
            log.info("knowledge pack imported: %d entries", record.entries)

    def _discard_build(self, key: str) -> None:
        if not key:
            return
        with self._lock:
            pack_id = key.split("@", 1)[0]
            current = self._current(pack_id)
            if current != key:
                self.index.remove_pack(key)

    # -- vectors -------------------------------------------------------------------

    def _embed(self, texts: list[str], kind: str = "passage") -> npt.NDArray[np.float32] | None:
        embedder = self.embedder
        if embedder is None or embedder.state != "ready":
            return None
        try:
            return embedder.embed(texts, kind)
        except Exception as exc:  # noqa: BLE001 - no vector is a keyword-only entry, not an error
            log.warning("knowledge embedding failed: %s", type(exc).__name__)
            return None

    def _legs(self) -> tuple[VectorLeg, ...]:
        """The models inside the embedder's vectors (() unless it is ready)."""
        embedder = self.embedder
        return embedder.legs if embedder is not None and embedder.state == "ready" else ()

    def _embed_missing(self) -> bool:
        """Embed one batch of entries of vector-enabled packs that have no vector yet;
        returns whether there was one (more may be left)."""
        if self.embedder is None or self.embedder.state != "ready" or self._state != "ready":
            return False
        with self._lock:
            todo: list[str] = []
            for pack_id, record in self._registry.packs.items():
                key = self._current(pack_id)
                if key is None or not record.local_embedding or not self._registry.enabled:
                    continue
                todo += [d for d in self.index.ids_of(key) if not self.index.has_vector(d) and d not in self._vector_failed]
                if len(todo) >= EMBED_BATCH:
                    break
            todo = todo[:EMBED_BATCH]
            texts = [self.index.entries[d].search_text() for d in todo]
        if not todo:
            return False
        started = time.monotonic()
        vectors = self._embed(texts)
        with self._lock:
            for i, doc_id in enumerate(todo):
                if vectors is None:
                    self._vector_failed.add(doc_id)
                elif doc_id in self.index.entries:
                    self.index.set_vector(doc_id, vectors[i], self._legs())
        self._batches.appendleft(
            {
                "timestamp": self.now(),
                "selected": len(todo),
                "stored": 0 if vectors is None else len(todo),
                "failed": len(todo) if vectors is None else 0,
                "elapsed_ms": int((time.monotonic() - started) * 1000),
            }
        )
        return True

    # -- queries -------------------------------------------------------------------

    def _allowed(self, registry: Registry, material_type: str) -> Callable[[str], bool]:
        wanted = kp.MATERIAL_TYPES if material_type in ("", "auto", "all") else (material_type,)
        visible = {
            self._current(pack_id): record
            for pack_id, record in registry.packs.items()
            if record.effective_material_type in wanted and self._current(pack_id) is not None
        }
        disabled = {key: set(record.disabled_titles) for key, record in visible.items()}

        def allowed(doc_id: str) -> bool:
            key, _, title = doc_id.partition(SEP)
            titles = disabled.get(key)
            return titles is not None and title not in titles

        return allowed

    def _vector_allowed(self, registry: Registry) -> Callable[[str], bool]:
        keys = {self._current(p) for p, r in registry.packs.items() if r.local_embedding}
        return lambda doc_id: doc_id.partition(SEP)[0] in keys

    def query(self, *, query: str, mode: str, material_type: str, limit: int, budget_ms: int, language: str | None) -> dict[str, Any]:
        """Look entries up (``lookup``) or sample entries by tag (``sample``) within the
        budget; never raises. ``result`` is matched, miss, timeout, busy, disabled or
        unavailable; ``context`` is the fenced block (empty unless matched)."""
        started = time.monotonic()
        mode = mode if mode in ("lookup", "sample") else "lookup"
        text = query.strip()[:MAX_QUERY_CHARS]
        limit = min(max(limit, 1), MAX_QUERY_LIMIT)
        budget = min(max(budget_ms or DEFAULT_QUERY_BUDGET_MS, MIN_QUERY_BUDGET_MS), MAX_QUERY_BUDGET_MS) / 1000
        deadline = started + budget
        extra: dict[str, Any] = {}
        if self._state != "ready":
            return self._answer("unavailable", started, mode)
        if not self._registry.enabled:
            return self._answer("disabled", started, mode)
        if not text:
            return self._answer("miss", started, mode)
        if not self._query_slots.acquire(blocking=False):
            return self._answer("busy", started, mode)
        try:
            registry = self._registry
            qvec = self._query_vector(text, deadline) if mode == "lookup" else None
            if time.monotonic() > deadline:
                return self._answer("timeout", started, mode)
            with self._lock:
                allowed = self._allowed(registry, material_type)
                if mode == "sample":
                    ids = self._sample(text, allowed, limit)
                    retrieval, lex, sem = "sample", len(ids), 0
                else:
                    hits, lex, sem = self.index.search(text, limit, allowed, qvec, self._vector_allowed(registry), self._legs())
                    ids = [doc_id for doc_id, _ in hits]
                    retrieval = "hybrid" if qvec is not None else "bm25"
                extra = {"retrieval_mode": retrieval, "lexical_candidates": lex, "semantic_candidates": sem}
                if not ids:
                    return self._answer("miss", started, mode, **extra)
                hits_json, cards = self._cards(ids, registry, text if mode == "lookup" else "")
            if time.monotonic() > deadline:
                return self._answer("timeout", started, mode, **extra)
            return self._answer("matched", started, mode, hits=hits_json, context=render_block(cards, language), **extra)
        except Exception as exc:
            log.warning("knowledge query failed: %s", type(exc).__name__, exc_info=True)
            return self._answer("error", started, mode, error_type=type(exc).__name__, **extra)
        finally:
            self._query_slots.release()

    def _query_vector(self, text: str, deadline: float) -> npt.NDArray[np.float32] | None:
        """The query's vector when the embedder answers in time (a late one is dropped and
        the lookup is BM25 alone)."""
        if self.index.vectors is None or len(self.index.vectors) == 0 or self.embedder is None or self.embedder.state != "ready":
            return None
        future: Future[npt.NDArray[np.float32] | None] = self._embed_pool.submit(self._embed, [text], "query")
        try:
            rows = future.result(timeout=max(deadline - time.monotonic() - 0.05, 0.0))
        except FutureTimeout:
            return None
        return None if rows is None else rows[0]

    def _sample(self, tag: str, allowed: Callable[[str], bool], limit: int) -> list[str]:
        wanted = tag.casefold()
        found = [d for d, e in self.index.entries.items() if allowed(d) and any(t.casefold() == wanted for t in e.tags)]
        return found[:limit]

    def _cards(self, ids: list[str], registry: Registry, query: str) -> tuple[list[dict[str, str]], list[Card]]:
        hits: list[dict[str, str]] = []
        cards: list[Card] = []
        for doc_id in ids:
            entry = self.index.entries.get(doc_id)
            pack_id = doc_id.split("@", 1)[0]
            record = registry.packs.get(pack_id)
            if entry is None or record is None:
                continue
            kind = record.effective_material_type
            excerpt = best_excerpt(entry.content, lambda t: set(self._terms(t)), query)
            cards.append(Card(entry.title, kind, entry.summary, excerpt, record.source.name, record.source.license))
            hits.append({"pack_id": pack_id, "title": entry.title, "material_type": kind})
        return hits, cards

    def _answer(self, result: str, started: float, mode: str, **extra: Any) -> dict[str, Any]:
        elapsed = int((time.monotonic() - started) * 1000)
        hits = extra.get("hits") or []
        self._queries.appendleft(
            {
                "timestamp": self.now(),
                "mode": mode,
                "result": result,
                "retrieval_mode": extra.get("retrieval_mode", ""),
                "embedding_service_state": self._embedding_state(),
                "lexical_candidates": extra.get("lexical_candidates", 0),
                "semantic_candidates": extra.get("semantic_candidates", 0),
                "hits": len(hits),
                "elapsed_ms": elapsed,
                "error_type": extra.get("error_type", ""),
            }
        )
        return {
            "result": result,
            "context": extra.get("context", ""),
            "hits": hits,
            "card_ids": [f"{h['pack_id']}/{kp.title_key(h['title'])}" for h in hits],
            "retrieval_mode": extra.get("retrieval_mode", ""),
            "elapsed_ms": elapsed,
        }

    # -- management ----------------------------------------------------------------

    def _embedding_state(self) -> str:
        if self.embedder is None:
            return "unavailable"
        return "ready" if self.embedder.state == "ready" else ("disabled" if self.embedder.state == "disabled" else "loading")

    def _publish(self, registry: Registry) -> None:
        self.files.save_registry(registry)
        self._registry = registry

    def _record(self, pack_id: str) -> PackRecord:
        record = self._registry.packs.get(pack_id)
        if record is None:
            raise KnowledgeUnavailable("not_found")
        return record

    def _update(self, pack_id: str, **changes: Any) -> PackRecord:
        with self._lock:
            self._require_ready()
            record = msgspec.structs.replace(self._record(pack_id), updated_at=self.now(), **changes)
            self._publish(msgspec.structs.replace(self._registry, packs={**self._registry.packs, pack_id: record}))
            return record

    def set_enabled(self, enabled: bool) -> dict[str, Any]:
        with self._lock:
            self._require_ready()
            self._publish(msgspec.structs.replace(self._registry, enabled=enabled))
        return {"enabled": enabled}

    def set_auto_context(self, pack_id: str, enabled: bool) -> dict[str, Any]:
        record = self._update(pack_id, auto_context=enabled)
        return {"pack_id": pack_id, "auto_context": record.auto_context}

    def set_local_embedding(self, pack_id: str, enabled: bool) -> dict[str, Any]:
        """Turn a pack's local vectors on (computed in the background, failures retried)
        or off (its vectors are dropped: the pack is keyword-only)."""
        record = self._update(pack_id, local_embedding=enabled)
        with self._lock:
            key = self._current(pack_id)
            if key is not None:
                if enabled:
                    self._vector_failed -= set(self.index.ids_of(key))
                else:
                    self.index.drop_vectors(key)
        return {"pack_id": pack_id, "local_embedding": record.local_embedding}

    def set_material_type(self, pack_id: str, material_type: str | None) -> dict[str, Any]:
        if material_type is not None and material_type not in kp.MATERIAL_TYPES:
            raise KnowledgeUnavailable("invalid_request")
        record = self._update(pack_id, material_type_override=material_type)
        return {
            "pack_id": pack_id,
            "material_type_override": record.material_type_override,
            "effective_material_type": record.effective_material_type,
        }

    def set_entry_disabled(self, pack_id: str, title: str, disabled: bool) -> dict[str, Any]:
        with self._lock:
            self._require_ready()
            record = self._record(pack_id)
            key = kp.title_key(title)
            current = self._current(pack_id)
            if current is None or entry_id(current, key) not in self.index.entries:
                raise KnowledgeUnavailable("not_found")
            titles = set(record.disabled_titles)
            if disabled:
                titles.add(key)
            else:
                titles.discard(key)
            updated = msgspec.structs.replace(record, disabled_titles=sorted(titles), updated_at=self.now())
            self._publish(msgspec.structs.replace(self._registry, packs={**self._registry.packs, pack_id: updated}))
        return {"pack_id": pack_id, "disabled": disabled, "disabled_entries": len(titles)}

    def remove_pack(self, pack_id: str) -> dict[str, Any]:
        """Uninstall a pack: registry first, then its file and index entries; its queued
        imports are cancelled and a building one is told to stop."""
        with self._lock:
            self._require_ready()
            record = self._record(pack_id)
            packs = dict(self._registry.packs)
            del packs[pack_id]
            self._publish(msgspec.structs.replace(self._registry, packs=packs))
            self.index.remove_pack(_version(pack_id, record.pack_sha256))
            self.files.delete_pack(record)
            self._broken.discard(pack_id)
            for job in self._jobs.values():
                if job.pack_id == pack_id and job.state in ACTIVE:
                    job.cancel_requested = True
                    if job.state == "queued":
                        self._finish(job, "cancelled")
                        self.files.drop_staged(job.job_id)
            self._save_jobs()
        log.info("knowledge pack removed: %d entries", record.entries)
        return {"pack_id": pack_id, "removed_entries": record.entries}

    def _entry_json(self, doc_id: str, *, detail: bool) -> dict[str, Any]:
        entry = self.index.entries[doc_id]
        pack_id = doc_id.split("@", 1)[0]
        record = self._registry.packs.get(pack_id)
        preview = " ".join(entry.content.split())
        payload: dict[str, Any] = {
            "pack_id": pack_id,
            "title": entry.title,
            "terms": {"alias": list(entry.terms.alias), "recognition": list(entry.terms.recognition)},
            "tags": list(entry.tags),
            "summary": entry.summary,
            "content_preview": preview[:180] + ("..." if len(preview) > 180 else ""),
            "material_type": record.effective_material_type if record else "knowledge",
            "source": msgspec.to_builtins(record.source) if record else {"name": pack_id, "homepage": "", "license": ""},
            "disabled": record is not None and entry.key in record.disabled_titles,
        }
        if detail:
            payload["content"] = entry.content
        return payload

    def list_entries(self, *, query: str, pack_id: str, limit: int, offset: int) -> dict[str, Any]:
        """A page of entries (all of them, or those matching ``query``), disabled ones included."""
        self._require_ready()
        if pack_id and not kp.pack_id_valid(pack_id):
            raise KnowledgeUnavailable("invalid_request")
        text = query.strip()[:200]
        with self._lock:
            pack_ids = [pack_id] if pack_id else sorted(self._registry.packs)
            keys = [k for k in (self._current(p) for p in pack_ids) if k is not None]
            total: int | None
            if text:
                wanted = set(keys)
                ids = self.index.browse(text, lambda d: d.partition(SEP)[0] in wanted, offset + limit + 1)[offset:]
                has_more = len(ids) > limit
                ids, total = ids[:limit], None
            else:
                everything = self.index.ordered(keys)
                total = len(everything)
                ids = everything[offset : offset + limit]
                has_more = offset + len(ids) < total
            items = [self._entry_json(d, detail=False) for d in ids]
        return {"total": total, "offset": offset, "limit": limit, "has_more": has_more, "items": items}

    def get_entry(self, pack_id: str, title: str) -> dict[str, Any]:
        self._require_ready()
        if not kp.pack_id_valid(pack_id):
            raise KnowledgeUnavailable("invalid_request")
        with self._lock:
            key = self._current(pack_id)
            doc_id = entry_id(key, kp.title_key(title)) if key else ""
            if doc_id not in self.index.entries:
                raise KnowledgeUnavailable("not_found")
            return {"entry": self._entry_json(doc_id, detail=True)}

    def _vector_state(self, record: PackRecord, total: int, ready: int, failed: int) -> str:
        if total <= 0:
            return "none"
        if not record.local_embedding:
            return "off"
        if ready >= total:
            return "complete"
        if not self._registry.enabled:
            return "paused"
        if self._embedding_state() != "ready":
            return "waiting"
        return "partial" if ready + failed >= total else "building"

    def list_packs(self) -> list[dict[str, Any]]:
        self._require_ready()
        with self._lock:
            packs: list[dict[str, Any]] = []
            for pack_id, record in sorted(self._registry.packs.items()):
                key = self._current(pack_id)
                ids = self.index.ids_of(key) if key else []
                ready = sum(1 for d in ids if self.index.has_vector(d))
                failed = sum(1 for d in ids if d in self._vector_failed)
                packs.append(
                    {
                        "pack_id": pack_id,
                        "source": msgspec.to_builtins(record.source),
                        "declared_material_type": record.declared_material_type,
                        "material_type_override": record.material_type_override,
                        "effective_material_type": record.effective_material_type,
                        "entries": len(ids),
                        "disabled_entries": len(record.disabled_titles),
                        "auto_context": record.auto_context,
                        "local_embedding": record.local_embedding,
                        "chunks_total": len(ids),
                        "chunks_ready": ready,
                        "chunks_failed": failed,
                        "vector_state": self._vector_state(record, len(ids), ready, failed),
                        "broken": pack_id in self._broken,
                        "installed_at": record.installed_at,
                        "updated_at": record.updated_at,
                    }
                )
            return packs

    def status(self) -> dict[str, Any]:
        embedder = self.embedder
        base: dict[str, Any] = {
            "state": self._state,
            "error_code": self._error_code,
            "embedding": {"state": self._embedding_state(), "model_id": embedder.model_id if embedder is not None else None},
            **self.availability(),
        }
        if self._state != "ready":
            return base
        packs = self.list_packs()
        kinds = {kind: [p for p in packs if p["effective_material_type"] == kind] for kind in kp.MATERIAL_TYPES}
        total = sum(p["chunks_total"] for p in packs)
        ready = sum(p["chunks_ready"] for p in packs)
        base.update(
            {
                "packs": len(packs),
                "entries": sum(p["entries"] for p in packs),
                "disabled_entries": sum(p["disabled_entries"] for p in packs),
                "knowledge_packs": len(kinds["knowledge"]),
                "corpus_packs": len(kinds["corpus"]),
                "knowledge_entries": sum(p["entries"] for p in kinds["knowledge"]),
                "corpus_entries": sum(p["entries"] for p in kinds["corpus"]),
                "chunks_total": total,
                "chunks_ready": ready,
                "chunks_failed": sum(p["chunks_failed"] for p in packs),
                "indexed_percent": round(ready * 100 / total, 1) if total else 0.0,
                "broken_packs": sorted(self._broken),
                "sources": [
                    {"pack_id": p["pack_id"], "name": p["source"]["name"], "entries": p["entries"]}
                    for p in sorted(packs, key=lambda p: -p["entries"])[:STATUS_SOURCES]
                ],
            }
        )
        return base

    def diagnostics(self) -> dict[str, Any]:
        """The last lookups and vector batches: metadata only, never a query or a text."""
        return {"queries": list(self._queries), "index_batches": list(self._batches)}
