"""The import jobs of the public knowledge packs, and the background vectors.

An import is a durable job: the normalized pack is staged and the job recorded in
``jobs.json`` before the answer. One worker thread runs the jobs in order: it indexes the
staged pack under its version key (lookups keep answering from the installed version),
then commits under the lock (pack file, registry, swap of the versions) and drops the
stage. Between jobs and while idle it embeds the entries that have no vector yet, one
small batch at a time. A job that was queued or building when the process ended is queued
again at the next start when its staged pack is still there (:meth:`KnowledgeJobs.recover`),
and failed with ``interrupted`` otherwise.
"""

from __future__ import annotations

import collections
import logging
import queue
import threading
import time
import uuid
from typing import Any

import msgspec

from nekomem.domain import knowledge_pack as kp
from nekomem.runtime.knowledge_state import KnowledgeState, pack_of_key, version_key
from nekomem.stores.knowledge import Job, PackRecord

log = logging.getLogger("nekomem.knowledge")

# The reference's service limits (knowledge/service.py), part of the protocol.
MAX_PENDING_IMPORTS = 3
MAX_TRACKED_JOBS = 50
MAX_PACKS = 200
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


def job_json(job: Job) -> dict[str, Any]:
    """A job as the reference answers it (+ ``entries_indexed``, the progress)."""
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


class _Cancelled(Exception):
    pass


class KnowledgeJobs:
    """The jobs, their queue and the worker thread (see the module docstring)."""

    def __init__(self, st: KnowledgeState) -> None:
        self.st = st
        self._jobs: collections.OrderedDict[str, Job] = collections.OrderedDict()
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._worker: threading.Thread | None = None

    def start(self) -> None:
        self._worker = threading.Thread(target=self._work, name="knowledge-worker", daemon=True)
        self._worker.start()

    def stop(self) -> None:
        self._queue.put(None)
        if self._worker is not None:
            self._worker.join(5)

    def recover(self) -> int:
        """Load ``jobs.json`` at start (the caller holds the lock); returns how many jobs
        were queued again. Raises KnowledgeFileError or OSError."""
        jobs = self.st.files.load_jobs()[-MAX_TRACKED_JOBS:]
        return self._recover_jobs(jobs)

    def unfinished(self) -> set[str]:
        return {job.job_id for job in self._jobs.values() if job.state in ACTIVE}

    def cancel_pack(self, pack_id: str) -> None:
        """A pack was removed: its queued imports are cancelled, a building one told to
        stop (the caller holds the lock)."""
        for job in self._jobs.values():
            if job.pack_id == pack_id and job.state in ACTIVE:
                job.cancel_requested = True
                if job.state == "queued":
                    self._finish(job, "cancelled")
                    self.st.files.drop_staged(job.job_id)
        self._save_jobs()

    def import_pack(self, raw: bytes) -> dict[str, Any]:
        """Validate and stage a pack, record its job and queue it. A refused pack answers
        ``{"ok": False, "reason"}``; an unchanged one ``{"unchanged": True, "state": "active"}``."""
        self.st.require_ready()
        try:
            pack = kp.decode_pack(raw)
        except kp.PackError as exc:
            return {"ok": False, "reason": exc.reason}
        canonical = kp.canonical_bytes(pack)
        if len(canonical) > kp.MAX_PACK_BYTES:
            return {"ok": False, "reason": "pack_too_large"}
        sha = kp.sha256_hex(canonical)
        with self.st.lock:
            existing = self.st.registry.packs.get(pack.pack_id)
            if existing is not None and existing.pack_sha256 == sha and pack.pack_id not in self.st.broken:
                return {"ok": True, "pack_id": pack.pack_id, "unchanged": True, "state": "active"}
            pending = [job for job in self._jobs.values() if job.state in ACTIVE]
            if any(job.pack_id == pack.pack_id for job in pending):
                return {"ok": False, "reason": "job_in_progress"}
            if len(pending) >= MAX_PENDING_IMPORTS:
                return {"ok": False, "reason": "knowledge_busy"}
            others = [r for r in self.st.registry.packs.values() if r.pack_id != pack.pack_id]
            if len(others) + 1 > MAX_PACKS:
                return {"ok": False, "reason": "capacity_packs"}
            if sum(r.entries for r in others) + len(pack.entries) > kp.MAX_TOTAL_ENTRIES:
                return {"ok": False, "reason": "capacity_entries"}
            now = self.st.now()
            job = Job(
                job_id=uuid.uuid4().hex,
                pack_id=pack.pack_id,
                state="queued",
                created_at=now,
                updated_at=now,
                entries_total=len(pack.entries),
                chunks_total=len(pack.entries),
            )
            self.st.files.stage(job.job_id, canonical)
            self._remember(job)
            self._save_jobs()
        self._queue.put(job.job_id)
        return {"ok": True, **job_json(job)}

    def _remember(self, job: Job) -> None:
        self._jobs[job.job_id] = job
        while len(self._jobs) > MAX_TRACKED_JOBS:
            oldest = next((jid for jid, j in self._jobs.items() if j.state in TERMINAL), None)
            if oldest is None:
                break
            del self._jobs[oldest]

    def _save_jobs(self) -> None:
        self.st.files.save_jobs(list(self._jobs.values()))

    def list_jobs(self) -> list[dict[str, Any]]:
        with self.st.lock:
            return [job_json(job) for job in reversed(self._jobs.values())]

    def job(self, job_id: str) -> dict[str, Any] | None:
        with self.st.lock:
            job = self._jobs.get(job_id)
            return None if job is None else job_json(job)

    def cancel_job(self, job_id: str) -> bool:
        """Ask a queued or building job to stop; False when it is unknown or finished."""
        with self.st.lock:
            job = self._jobs.get(job_id)
            if job is None or job.state not in ACTIVE:
                return False
            job.cancel_requested = True
            if job.state == "queued":
                self._finish(job, "cancelled")
                self.st.files.drop_staged(job_id)
            self._save_jobs()
            return True

    def discard_job(self, job_id: str) -> bool:
        """Forget a finished job; False when it is unknown or still running."""
        with self.st.lock:
            job = self._jobs.get(job_id)
            if job is None or job.state not in TERMINAL:
                return False
            del self._jobs[job_id]
            self._save_jobs()
            return True

    def _finish(self, job: Job, state: str, reason: str = "") -> None:
        job.state, job.reason, job.updated_at = state, reason, self.st.now()

    def _work(self) -> None:
        vectors_left = False
        while not self.st.stopping.is_set():
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
        with self.st.lock:
            job = self._jobs.get(job_id)
            if job is None or job.state != "queued":
                self.st.files.drop_staged(job_id)
                return
            job.state, job.updated_at = "building", self.st.now()
            self._save_jobs()
        key = ""
        try:
            raw = self.st.files.read_staged(job_id)
            if raw is None:
                raise kp.PackError("staged_pack_missing")
            pack = kp.decode_pack(raw)
            sha = kp.sha256_hex(raw)
            key = version_key(pack.pack_id, sha)
            self._build(job, pack, key)
            self._commit(job, pack, raw, sha, key)
        except _Cancelled:
            self._discard_build(key)
            with self.st.lock:
                self._finish(job, "cancelled")
        except kp.PackError as exc:
            self._discard_build(key)
            with self.st.lock:
                self._finish(job, "failed", exc.reason)
        except Exception as exc:
            log.warning("a knowledge import failed: %s", type(exc).__name__, exc_info=True)
            self._discard_build(key)
            with self.st.lock:
                self._finish(job, "failed", type(exc).__name__)
        finally:
            with self.st.lock:
                self.st.files.drop_staged(job_id)
                self._save_jobs()

    def _check(self, job: Job) -> None:
        if job.cancel_requested or self.st.stopping.is_set():
            raise _Cancelled

    def _build(self, job: Job, pack: kp.Pack, key: str) -> None:
        """Index the entries under the version key (not served until the commit). Vectors
        come afterwards, in the background: an import never waits for the model."""
        saved = time.monotonic()
        for start in range(0, len(pack.entries), BUILD_BATCH):
            self._check(job)
            with self.st.lock:
                for entry in pack.entries[start : start + BUILD_BATCH]:
                    self.st.index.add(key, entry)
                job.entries_indexed = min(start + BUILD_BATCH, len(pack.entries))
                job.updated_at = self.st.now()
                if time.monotonic() - saved >= PROGRESS_SAVE_SECONDS:
                    self._save_jobs()
                    saved = time.monotonic()

    def _commit(self, job: Job, pack: kp.Pack, raw: bytes, sha: str, key: str) -> None:
        with self.st.lock:
            self._check(job)
            previous = self.st.registry.packs.get(pack.pack_id)
            now = self.st.now()
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
            self.st.files.write_pack(record, raw)
            registry = msgspec.structs.replace(self.st.registry, packs={**self.st.registry.packs, pack.pack_id: record})
            try:
                self.st.files.save_registry(registry)
            except BaseException:
                if previous is None or previous.file_name != record.file_name:
                    self.st.files.delete_pack(record)
                raise
            self.st.registry = registry
            self.st.broken.discard(pack.pack_id)
            if previous is not None:
                old = version_key(previous.pack_id, previous.pack_sha256)
                if old != key:
                    self.st.index.remove_pack(old)
                if previous.file_name != record.file_name:
                    self.st.files.delete_pack(previous)
            self._finish(job, "active")
            log.info("knowledge pack imported: %d entries", record.entries)

    def _discard_build(self, key: str) -> None:
        if not key:
            return
        with self.st.lock:
            pack_id = pack_of_key(key)
            current = self.st.current(pack_id)
            if current != key:
                self.st.index.remove_pack(key)

    def _embed_missing(self) -> bool:
        """Embed one batch of entries of vector-enabled packs that have no vector yet;
        returns whether there was one (more may be left)."""
        if self.st.embedder is None or self.st.embedder.state != "ready" or self.st.state != "ready":
            return False
        with self.st.lock:
            todo: list[str] = []
            for pack_id, record in self.st.registry.packs.items():
                key = self.st.current(pack_id)
                if key is None or not record.local_embedding or not self.st.registry.enabled:
                    continue
                todo += [d for d in self.st.index.ids_of(key) if not self.st.index.has_vector(d) and d not in self.st.vector_failed]
                if len(todo) >= EMBED_BATCH:
                    break
            todo = todo[:EMBED_BATCH]
            texts = [self.st.index.entries[d].search_text() for d in todo]
        if not todo:
            return False
        started = time.monotonic()
        vectors = self.st.embed(texts)
        with self.st.lock:
            for i, doc_id in enumerate(todo):
                if vectors is None:
                    self.st.vector_failed.add(doc_id)
                elif doc_id in self.st.index.entries:
                    self.st.index.set_vector(doc_id, vectors[i], self.st.legs())
        self.st.batches.appendleft(
            {
                "timestamp": self.st.now(),
                "selected": len(todo),
                "stored": 0 if vectors is None else len(todo),
                "failed": len(todo) if vectors is None else 0,
                "elapsed_ms": int((time.monotonic() - started) * 1000),
            }
        )
        return True

    def _recover_jobs(self, jobs: list[Job]) -> int:
        resumed = 0
        for job in jobs:
            if job.state in ACTIVE:
                if job.cancel_requested:
                    job.state, job.reason = "cancelled", ""
                elif self.st.files.read_staged(job.job_id) is not None:
                    job.state, job.entries_indexed, job.reason = "queued", 0, ""
                    self._queue.put(job.job_id)
                    resumed += 1
                else:
                    job.state, job.reason = "failed", "interrupted"
                job.updated_at = self.st.now()
            self._jobs[job.job_id] = job
        self.st.files.save_jobs(list(self._jobs.values()))
        return resumed
