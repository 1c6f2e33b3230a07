"""The public knowledge packs of one process (the reference's ``knowledge/service.py``
behaviour, over nekomem's stores and recall pieces).

One :class:`KnowledgeService` per process, held by the :class:`~nekomem.runtime.runtime.Runtime`
as ``knowledge``, beside the characters, never inside one. It composes the shared
:class:`~nekomem.runtime.knowledge_state.KnowledgeState` (files, index, registry, lock,
embedder), the import jobs (:mod:`nekomem.runtime.knowledge_jobs`) and the lookups
(:mod:`nekomem.runtime.knowledge_lookup`), and owns the lifecycle and the management
calls (switch, per-pack policies, disabled entries, removal, listings, status).

``start`` loads the packs on a thread of its own: the index is rebuilt from the pack files
that the registry names and whose digest still matches (others are ``broken``: not
served); the service answers ``starting`` until then. Every method is blocking and
thread-safe (one lock); the HTTP layer calls them off the event loop.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import msgspec

from nekomem.config.recall import RecallSettings
from nekomem.domain import knowledge_pack as kp
from nekomem.recall.knowledge_index import SEP, entry_id
from nekomem.runtime.knowledge_jobs import KnowledgeJobs
from nekomem.runtime.knowledge_lookup import KnowledgeLookup
from nekomem.runtime.knowledge_state import Embedder, KnowledgeState, KnowledgeUnavailable, pack_of_key, version_key
from nekomem.stores.knowledge import KnowledgeFileError, KnowledgeFiles, PackRecord
from nekomem.stores.knowledge_backup import KnowledgeCopy, read_copy

log = logging.getLogger("nekomem.knowledge")

STATUS_SOURCES = 12  # the largest packs named in /status (an overview, not a pack list)

__all__ = ["KnowledgeService", "KnowledgeUnavailable"]


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
        self.st = KnowledgeState(files, now, recall, embedder)
        self.jobs = KnowledgeJobs(self.st)
        self.lookup = KnowledgeLookup(self.st)
        # The parts' calls, as the routes use them.
        self.availability = self.st.availability
        self.import_pack = self.jobs.import_pack
        self.list_jobs = self.jobs.list_jobs
        self.cancel_job = self.jobs.cancel_job
        self.discard_job = self.jobs.discard_job
        self.query = self.lookup.query
        self.diagnostics = self.lookup.diagnostics

    # -- lifecycle -----------------------------------------------------------------

    def start(self) -> None:
        """Load the packs and start the worker, on a thread of its own; never raises."""
        threading.Thread(target=self._open, name="knowledge-start", daemon=True).start()

    def stop(self) -> None:
        self.st.stopping.set()
        self.jobs.stop()
        self.lookup.stop()

    def wait_ready(self, timeout: float) -> bool:
        """Wait until the packs are loaded (or failed to); returns whether the service is ready."""
        deadline = time.monotonic() + timeout
        while self.st.state == "starting" and time.monotonic() < deadline:
            time.sleep(0.02)
        return self.st.state == "ready"

    def _open(self) -> None:
        st = self.st
        try:
            with st.lock:
                registry = st.files.load_registry()
                for record in registry.packs.values():
                    self._load_pack(record)
                st.registry = registry
                resumed = self.jobs.recover()
                st.files.clean_leftovers({r.file_name for r in registry.packs.values()}, self.jobs.unfinished())
                st.state = "ready"
        except (KnowledgeFileError, OSError) as exc:
            st.state, st.error_code = "unavailable", "registry_invalid" if isinstance(exc, KnowledgeFileError) else type(exc).__name__
            log.warning("public knowledge unavailable: %s", st.error_code)
            return
        log.info("public knowledge ready: %d packs, %d entries, %d jobs resumed", len(registry.packs), len(st.index), resumed)
        self.jobs.start()

    def _load_pack(self, record: PackRecord) -> None:
        try:
            raw = self.st.files.read_pack(record)
            if kp.sha256_hex(raw) != record.pack_sha256:
                raise kp.PackError("pack_file_mismatch")
            pack = kp.decode_pack(raw)
        except (OSError, kp.PackError) as exc:
            log.warning("a knowledge pack cannot be loaded: %s", getattr(exc, "reason", type(exc).__name__))
            self.st.broken.add(record.pack_id)
            return
        key = version_key(record.pack_id, record.pack_sha256)
        for entry in pack.entries:
            self.st.index.add(key, entry)

    def backup_copy(self) -> tuple[KnowledgeCopy, list[str]]:
        """The registry and the pack files it names, read under the lock (so no import,
        removal or policy change lands between the two), and the ids of packs left out
        as broken; the source of ``nekomem backup`` with a server running. Raises
        KnowledgeFileError, OSError."""
        with self.st.lock:
            return read_copy(self.st.files)

    # -- management ----------------------------------------------------------------

    def _update(self, pack_id: str, **changes: Any) -> PackRecord:
        with self.st.lock:
            self.st.require_ready()
            record = msgspec.structs.replace(self.st.record(pack_id), updated_at=self.st.now(), **changes)
            self.st.publish(msgspec.structs.replace(self.st.registry, packs={**self.st.registry.packs, pack_id: record}))
            return record

    def set_enabled(self, enabled: bool) -> dict[str, Any]:
        with self.st.lock:
            self.st.require_ready()
            self.st.publish(msgspec.structs.replace(self.st.registry, enabled=enabled))
        return {"enabled": enabled}

    def set_auto_context(self, pack_id: str, enabled: bool) -> dict[str, Any]:
        record = self._update(pack_id, auto_context=enabled)
        return {"pack_id": pack_id, "auto_context": record.auto_context}

    def set_local_embedding(self, pack_id: str, enabled: bool) -> dict[str, Any]:
        """Turn a pack's local vectors on (computed in the background, failures retried)
        or off (its vectors are dropped: the pack is keyword-only)."""
        record = self._update(pack_id, local_embedding=enabled)
        with self.st.lock:
            key = self.st.current(pack_id)
            if key is not None:
                if enabled:
                    self.st.vector_failed -= set(self.st.index.ids_of(key))
                else:
                    self.st.index.drop_vectors(key)
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
        with self.st.lock:
            self.st.require_ready()
            record = self.st.record(pack_id)
            key = kp.title_key(title)
            current = self.st.current(pack_id)
            if current is None or entry_id(current, key) not in self.st.index.entries:
                raise KnowledgeUnavailable("not_found")
            titles = set(record.disabled_titles)
            if disabled:
                titles.add(key)
            else:
                titles.discard(key)
            updated = msgspec.structs.replace(record, disabled_titles=sorted(titles), updated_at=self.st.now())
            self.st.publish(msgspec.structs.replace(self.st.registry, packs={**self.st.registry.packs, pack_id: updated}))
        return {"pack_id": pack_id, "disabled": disabled, "disabled_entries": len(titles)}

    def remove_pack(self, pack_id: str) -> dict[str, Any]:
        """Uninstall a pack: registry first, then its file and index entries; its queued
        imports are cancelled and a building one is told to stop."""
        with self.st.lock:
            self.st.require_ready()
            record = self.st.record(pack_id)
            packs = dict(self.st.registry.packs)
            del packs[pack_id]
            self.st.publish(msgspec.structs.replace(self.st.registry, packs=packs))
            self.st.index.remove_pack(version_key(pack_id, record.pack_sha256))
            self.st.files.delete_pack(record)
            self.st.broken.discard(pack_id)
            self.jobs.cancel_pack(pack_id)
        log.info("knowledge pack removed: %d entries", record.entries)
        return {"pack_id": pack_id, "removed_entries": record.entries}

    def _entry_json(self, doc_id: str, *, detail: bool) -> dict[str, Any]:
        entry = self.st.index.entries[doc_id]
        pack_id = pack_of_key(doc_id)
        record = self.st.registry.packs.get(pack_id)
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
        self.st.require_ready()
        if pack_id and not kp.pack_id_valid(pack_id):
            raise KnowledgeUnavailable("invalid_request")
        text = query.strip()[:200]
        with self.st.lock:
            pack_ids = [pack_id] if pack_id else sorted(self.st.registry.packs)
            keys = [k for k in (self.st.current(p) for p in pack_ids) if k is not None]
            total: int | None
            if text:
                wanted = set(keys)
                ids = self.st.index.browse(text, lambda d: d.partition(SEP)[0] in wanted, offset + limit + 1)[offset:]
                has_more = len(ids) > limit
                ids, total = ids[:limit], None
            else:
                everything = self.st.index.ordered(keys)
                total = len(everything)
                ids = everything[offset : offset + limit]
                has_more = offset + len(ids) < total
            items = [self._entry_json(d, detail=False) for d in ids]
        return {"total": total, "offset": offset, "limit": limit, "has_more": has_more, "items": items}

    def get_entry(self, pack_id: str, title: str) -> dict[str, Any]:
        self.st.require_ready()
        if not kp.pack_id_valid(pack_id):
            raise KnowledgeUnavailable("invalid_request")
        with self.st.lock:
            key = self.st.current(pack_id)
            doc_id = entry_id(key, kp.title_key(title)) if key else ""
            if doc_id not in self.st.index.entries:
                raise KnowledgeUnavailable("not_found")
            return {"entry": self._entry_json(doc_id, detail=True)}

    def _vector_state(self, record: PackRecord, total: int, ready: int, failed: int) -> str:
        if total <= 0:
            return "none"
        if not record.local_embedding:
            return "off"
        if ready >= total:
            return "complete"
        if not self.st.registry.enabled:
            return "paused"
        if self.st.embedding_state() != "ready":
            return "waiting"
        return "partial" if ready + failed >= total else "building"

    def list_packs(self) -> list[dict[str, Any]]:
        self.st.require_ready()
        with self.st.lock:
            packs: list[dict[str, Any]] = []
            for pack_id, record in sorted(self.st.registry.packs.items()):
                key = self.st.current(pack_id)
                ids = self.st.index.ids_of(key) if key else []
                ready = sum(1 for d in ids if self.st.index.has_vector(d))
                failed = sum(1 for d in ids if d in self.st.vector_failed)
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
                        "broken": pack_id in self.st.broken,
                        "installed_at": record.installed_at,
                        "updated_at": record.updated_at,
                    }
                )
            return packs

    def status(self) -> dict[str, Any]:
        embedder = self.st.embedder
        base: dict[str, Any] = {
            "state": self.st.state,
            "error_code": self.st.error_code,
            "embedding": {"state": self.st.embedding_state(), "model_id": embedder.model_id if embedder is not None else None},
            **self.st.availability(),
        }
        if self.st.state != "ready":
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
                "broken_packs": sorted(self.st.broken),
                "sources": [
                    {"pack_id": p["pack_id"], "name": p["source"]["name"], "entries": p["entries"]}
                    for p in sorted(packs, key=lambda p: -p["entries"])[:STATUS_SOURCES]
                ],
            }
        )
        return base
