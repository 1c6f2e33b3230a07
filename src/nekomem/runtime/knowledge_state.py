"""What the parts of the public knowledge service share: the files, the index, the
registry as last published, the lock over all of them, and the embedder.

:class:`KnowledgeState` is composed into :class:`~nekomem.runtime.knowledge.KnowledgeService`
(lifecycle and management), :class:`~nekomem.runtime.knowledge_jobs.KnowledgeJobs`
(imports and background vectors) and
:class:`~nekomem.runtime.knowledge_lookup.KnowledgeLookup` (queries). The registry is
replaced whole on every change, under ``lock``, after it is on disk.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from nekomem.config.recall import RecallSettings
from nekomem.models.embeddings import VectorLeg
from nekomem.recall.knowledge_index import KnowledgeIndex
from nekomem.stores.knowledge import KnowledgeFiles, PackRecord, Registry

log = logging.getLogger("nekomem.knowledge")

DIAGNOSTICS_KEPT = 20


class Embedder(Protocol):
    """What the service needs of :class:`nekomem.models.embeddings.EmbeddingService`."""

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


def version_key(pack_id: str, sha: str) -> str:
    """The index key of one version of a pack."""
    return f"{pack_id}@{sha[:16]}"


def pack_of_key(key: str) -> str:
    return key.split("@", 1)[0]


class KnowledgeState:
    """The shared state (see the module docstring); ``state`` is starting, ready or unavailable."""

    def __init__(self, files: KnowledgeFiles, now: Callable[[], str], recall: RecallSettings | None, embedder: Embedder | None) -> None:
        self.files = files
        self.now = now
        self.embedder = embedder
        self.index = KnowledgeIndex(recall)
        self.lock = threading.RLock()
        self.registry = Registry()
        self.state = "starting"
        self.error_code = ""
        self.broken: set[str] = set()  # packs whose file is missing or altered: not served
        self.vector_failed: set[str] = set()  # entries whose embedding failed (retried when vectors are turned on again)
        self.stopping = threading.Event()
        self.batches: collections.deque[dict[str, Any]] = collections.deque(maxlen=DIAGNOSTICS_KEPT)

    def current(self, pack_id: str) -> str | None:
        """The index key of the installed version of a pack (None: not installed or broken)."""
        record = self.registry.packs.get(pack_id)
        if record is None or pack_id in self.broken:
            return None
        return version_key(pack_id, record.pack_sha256)

    def availability(self) -> dict[str, bool]:
        """``ready``, ``enabled`` and ``tool_available`` (ready, enabled, and at least one
        loaded pack with an entry that is not disabled)."""
        registry = self.registry
        ready = self.state == "ready"
        usable = any(
            record.entries > len(record.disabled_titles) and pack_id not in self.broken for pack_id, record in registry.packs.items()
        )
        return {"ready": ready, "enabled": registry.enabled, "tool_available": ready and registry.enabled and usable}

    def require_ready(self) -> None:
        """Raises KnowledgeUnavailable unless the packs are loaded."""
        if self.state != "ready":
            raise KnowledgeUnavailable("knowledge_starting" if self.state == "starting" else "knowledge_unavailable")

    def publish(self, registry: Registry) -> None:
        """Write ``registry`` and make it the current one (the caller holds ``lock``)."""
        self.files.save_registry(registry)
        self.registry = registry

    def record(self, pack_id: str) -> PackRecord:
        """The installed pack's record; raises KnowledgeUnavailable ``not_found``."""
        record = self.registry.packs.get(pack_id)
        if record is None:
            raise KnowledgeUnavailable("not_found")
        return record

    def embedding_state(self) -> str:
        if self.embedder is None:
            return "unavailable"
        return "ready" if self.embedder.state == "ready" else ("disabled" if self.embedder.state == "disabled" else "loading")

    def legs(self) -> tuple[VectorLeg, ...]:
        """The models inside the embedder's vectors (() unless it is ready)."""
        embedder = self.embedder
        return embedder.legs if embedder is not None and embedder.state == "ready" else ()

    def embed(self, texts: list[str], kind: str = "passage") -> npt.NDArray[np.float32] | None:
        """Vectors of ``texts``, or None when the embedder is not ready or fails (the
        entries stay keyword-only)."""
        embedder = self.embedder
        if embedder is None or embedder.state != "ready":
            return None
        try:
            return embedder.embed(texts, kind)
        except Exception as exc:  # noqa: BLE001 - no vector is a keyword-only entry, not an error
            log.warning("knowledge embedding failed: %s", type(exc).__name__)
            return None
